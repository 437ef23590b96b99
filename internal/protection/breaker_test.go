package protection

import (
	"context"
	"errors"
	"math/rand/v2"
	"testing"
	"time"
)

// observe is observeReply for a request answered as soon as it was sent.
func (b *breaker) observe(now time.Time, id int64, fresh, unavailable bool) (t transition, counts bool) {
	return b.observeRequest(now, now, id, fresh, unavailable)
}

// observeRequest is observeReply for a request sent at sent.
func (b *breaker) observeRequest(now, sent time.Time, id int64, fresh, unavailable bool) (t transition, counts bool) {
	return b.observeReply(now, id, Reply{Sent: sent, Fresh: fresh, Unavailable: unavailable})
}

func TestBreaker(t *testing.T) {
	t.Parallel()
	t0 := time.Unix(1000, 0)
	cfg := BreakerConfig{Window: 10 * time.Second, Messages: 5, Silence: 3 * time.Second, HalfOpenMessages: 3}
	// healthyEvery reports healthy replies of fresh messages (ids from
	// 1 000 000 on) every step from from to to.
	healthyEvery := func(b *breaker, from, to time.Time, step time.Duration) {
		id := int64(1_000_000)
		for at := from; at.Before(to); at = at.Add(step) {
			id++
			b.observe(at, id, true, false)
		}
	}

	t.Run("APlatformDownFromTheStartOpensItAfterTheSilence", func(t *testing.T) {
		t.Parallel()
		b := newBreaker(cfg)
		for i := range 30 {
			at := t0.Add(time.Duration(i) * 100 * time.Millisecond)
			if tr, counts := b.observe(at, int64(i), true, true); tr != stay || counts {
				t.Fatalf("failure %d at %v, with nothing ever answered: %v, counts %v; want it closed until 3s of silence, no attempt counted", i, at.Sub(t0), tr, counts)
			}
		}
		if tr, _ := b.observe(t0.Add(3*time.Second), 30, true, true); tr != trip {
			t.Fatalf("3s of failures of distinct messages from the start: %v, want it open", tr)
		}
	})

	t.Run("FailuresOfDistinctMessagesAndSilenceOpenIt", func(t *testing.T) {
		t.Parallel()
		b := newBreaker(cfg)
		b.observe(t0, 100, true, false)
		at := t0.Add(4 * time.Second) // the platform has answered nothing for 4s
		for id := range int64(4) {
			if tr, _ := b.observe(at, id, true, true); tr != stay {
				t.Fatalf("failure of message %d (fewer than 5 distinct) moved the breaker: %v", id, tr)
			}
		}
		if tr, _ := b.observe(at, 4, true, true); tr != trip || b.state != BreakerOpen {
			t.Fatalf("5th distinct failing message after 4s of silence: %v, state %v; want it open", tr, b.state)
		}
	})

	t.Run("RepliesAboutOneMessageCountOnce", func(t *testing.T) {
		t.Parallel()
		b := newBreaker(cfg)
		// Three messages the platform cannot handle, retried for a minute,
		// and nothing else: never an outage.
		for i := range 600 {
			at := t0.Add(time.Duration(i) * 100 * time.Millisecond)
			if tr, counts := b.observe(at, int64(i%3), true, true); tr != stay || counts {
				t.Fatalf("failure %d of 3 messages: %v, counts %v; want no trip and, with nothing answered, no attempt counted", i, tr, counts)
			}
		}
	})

	t.Run("AQuietNightNeverOpensItAndSpendsTheFailingMessagesAttempts", func(t *testing.T) {
		t.Parallel()
		b := newBreaker(cfg)
		// Other messages answered 5 times a second; 3 failing messages
		// retried every 5 s, all three at the same instant.
		end := t0.Add(60 * time.Second)
		next := t0.Add(100 * time.Millisecond)
		id := int64(1000)
		for at := t0; at.Before(end); at = at.Add(200 * time.Millisecond) {
			id++
			if tr, _ := b.observe(at, id, true, false); tr != stay {
				t.Fatalf("healthy reply moved the breaker: %v", tr)
			}
			if at.Before(next) {
				continue
			}
			next = next.Add(5 * time.Second)
			for bad := range int64(3) {
				fresh := at.Equal(t0.Add(100 * time.Millisecond))
				if tr, counts := b.observe(at, bad, fresh, true); tr != stay || !counts {
					t.Fatalf("failing message %d at %v: %v, counts %v; want no trip, the attempt counted", bad, at.Sub(t0), tr, counts)
				}
			}
		}
	})

	t.Run("RetriesOfMessagesFailingOnTheirOwnNeverOpenIt", func(t *testing.T) {
		t.Parallel()
		b := newBreaker(cfg)
		// A third of 1 200 events fail their first attempt while the rest
		// are answered...
		for i := range 1200 {
			b.observe(t0.Add(time.Duration(i)*5*time.Millisecond), int64(i), true, i%3 == 0)
		}
		// ... then their retries are all that is due (ordering holds the
		// rest behind them): 400 distinct messages failing, nothing
		// answered for 30 s. They fail on their own; that is no outage.
		at := t0.Add(10 * time.Second)
		for i := range 400 {
			at = at.Add(75 * time.Millisecond)
			if tr, _ := b.observe(at, int64(3*i), false, true); tr != stay {
				t.Fatalf("retry %d of a message that failed on its own, %v after the last answer: %v", i, at.Sub(t0.Add(6*time.Second)).Round(time.Second), tr)
			}
		}
	})

	t.Run("MessagesWhoseFailuresDidNotCountNeverOpenItWhenTheyAreAllThatIsLeft", func(t *testing.T) {
		t.Parallel()
		b := newBreaker(cfg)
		// Late in a burst, nine messages fail at once among healthy
		// replies: the first four failures count, the rest come after five
		// distinct failures and do not (the platform may be going down).
		healthyEvery(b, t0, t0.Add(time.Second), 50*time.Millisecond)
		spent := map[int64]bool{}
		for id := range int64(9) {
			_, counts := b.observe(t0.Add(time.Second), id, true, true)
			if counts != (id < 4) {
				t.Fatalf("failure of message %d, the %d-th distinct since the last answer: counts %v", id, id+1, counts)
			}
			spent[id] = counts
		}
		for i, at := 0, t0.Add(time.Second+50*time.Millisecond); at.Before(t0.Add(2 * time.Second)); i, at = i+1, at.Add(50*time.Millisecond) {
			b.observe(at, int64(2_000_000+i), true, false)
		}
		// Then the burst is over and ordering holds everything else behind
		// them: their retries, every 5 s, are all that is sent. The
		// platform answered others after they failed, so they fail on
		// their own, whatever their attempts say; their attempts count
		// from their first retry.
		for round := range 12 {
			at := t0.Add(6*time.Second + time.Duration(round)*5*time.Second)
			for id := range int64(9) {
				tr, counts := b.observe(at, id, !spent[id], true)
				if tr != stay {
					t.Fatalf("retry %d of message %d at %v: %v; nine messages failing on their own are no outage", round+1, id, at.Sub(t0), tr)
				}
				if round == 0 && !counts {
					t.Fatalf("first retry of message %d, the platform having answered others since its failure: not counted", id)
				}
				spent[id] = spent[id] || counts
			}
		}
	})

	t.Run("SomeMessagesFailingUnderLoadNeverOpenIt", func(t *testing.T) {
		t.Parallel()
		b := newBreaker(cfg)
		rnd := rand.New(rand.NewPCG(1, 2))
		// 2 000 replies a second for 10 s, 90 % of them failures of
		// distinct messages: long runs of distinct failures, but the
		// platform keeps answering the rest.
		for i := range 20_000 {
			if tr, _ := b.observe(t0.Add(time.Duration(i)*500*time.Microsecond), int64(i), true, rnd.Float64() < 0.9); tr != stay {
				t.Fatalf("reply %d: %v with a platform failing 90%% of messages and answering the rest", i, tr)
			}
		}
	})

	t.Run("AnOutageUnderLoadStopsCountingAttemptsAtOnceAndOpensAfterTheSilence", func(t *testing.T) {
		t.Parallel()
		b := newBreaker(cfg)
		healthyEvery(b, t0, t0.Add(10*time.Second), 30*time.Millisecond)
		down := t0.Add(10 * time.Second)
		var opened time.Time
		for i := range 1000 { // failures of distinct messages, 100 a second
			at := down.Add(time.Duration(i) * 10 * time.Millisecond)
			tr, counts := b.observe(at, int64(i), true, true)
			if i >= 4 && counts {
				t.Fatalf("failure %d of the outage counts an attempt: 5 distinct messages have failed since the last answer", i)
			}
			if tr == trip {
				opened = at
				break
			}
		}
		if opened.IsZero() || opened.Sub(down) < 2*time.Second || opened.Sub(down) > 3*time.Second {
			t.Fatalf("opened at %v into the outage, want once the 3s silence since the last answer has passed", opened.Sub(down))
		}
	})

	t.Run("AMessageFailingAgainBeforeAnythingIsAnsweredDoesNotCount", func(t *testing.T) {
		t.Parallel()
		b := newBreaker(cfg)
		b.observe(t0, 1, true, false)
		if _, counts := b.observe(t0.Add(time.Second), 2, true, true); !counts {
			t.Fatal("a first failure with the platform answering a second ago does not count")
		}
		// Short retry delays under light load: the same message fails
		// again before any other is answered.
		if _, counts := b.observe(t0.Add(1100*time.Millisecond), 2, true, true); counts {
			t.Fatal("a message failing again before anything was answered counts: its attempts could all meet the first second of an outage")
		}
		b.observe(t0.Add(1200*time.Millisecond), 3, true, false)
		if _, counts := b.observe(t0.Add(1300*time.Millisecond), 2, true, true); !counts {
			t.Fatal("a message failing again after another was answered does not count: it is failing on its own")
		}
	})

	t.Run("RepliesToRequestsSentBeforeAFailureDoNotMakeItsRetryCount", func(t *testing.T) {
		t.Parallel()
		b := newBreaker(cfg)
		healthyEvery(b, t0, t0.Add(time.Second), 10*time.Millisecond)
		// The outage begins at 1s. Message 7 fails at 1.05s and is retried
		// every 100ms while the requests sent before 1s are still being
		// answered 200, one between each of its failures.
		down := t0.Add(time.Second)
		for i := range 3 {
			at := down.Add(50*time.Millisecond + time.Duration(i)*100*time.Millisecond)
			_, counts := b.observeRequest(at, at.Add(-10*time.Millisecond), 7, i == 0, true)
			if i > 0 && counts {
				t.Fatalf("retry %d of a message failing since the outage began counted, after replies only to requests sent before its previous failure", i)
			}
			b.observeRequest(at.Add(20*time.Millisecond), down.Add(-time.Duration(i+1)*time.Millisecond), int64(2000+i), true, false)
		}
		// A request sent after its last failure and answered healthy: the
		// platform is up for others, so its next failure counts.
		last := down.Add(250 * time.Millisecond)
		b.observeRequest(last.Add(40*time.Millisecond), last.Add(10*time.Millisecond), 3000, true, false)
		if _, counts := b.observeRequest(last.Add(100*time.Millisecond), last.Add(90*time.Millisecond), 7, false, true); !counts {
			t.Fatal("a failure after another message sent since its previous failure was answered did not count")
		}
	})

	t.Run("AFailureOnAnotherInstanceCountsAsThisOnesOwn", func(t *testing.T) {
		t.Parallel()
		// Three instances: message 7 failed first on another one, at the
		// start of an outage; its retries come here, where the requests
		// sent before the outage are still being answered 200. This
		// instance has never seen 7 fail: only its row says so.
		b := newBreaker(cfg)
		healthyEvery(b, t0, t0.Add(time.Second), 10*time.Millisecond)
		down := t0.Add(time.Second)
		elsewhere := down.Add(15 * time.Millisecond)
		for i := range 2 {
			at := down.Add(180*time.Millisecond + time.Duration(i)*200*time.Millisecond)
			b.observeRequest(at.Add(-20*time.Millisecond), down.Add(-time.Duration(i+1)*time.Millisecond), int64(2000+i), true, false)
			_, counts := b.observeReply(at, 7, Reply{Sent: at.Add(-10 * time.Millisecond), Unavailable: true, PreviousFailure: elsewhere})
			if counts {
				t.Fatalf("retry %d of a message that failed on another instance since the outage began counted, after replies only to requests sent before that failure", i+1)
			}
			elsewhere = at
		}
		// A request sent after its last failure was answered: the platform
		// is up for others, so the message fails on its own.
		later := elsewhere.Add(100 * time.Millisecond)
		b.observeRequest(later, elsewhere.Add(50*time.Millisecond), 3000, true, false)
		if _, counts := b.observeReply(later.Add(10*time.Millisecond), 7, Reply{Sent: later, Unavailable: true, PreviousFailure: elsewhere}); !counts {
			t.Fatal("a failure after a request sent since the row's previous failure was answered did not count")
		}
		// A previous failure older than the window says nothing any more.
		old := later.Add(time.Second).Add(-cfg.withDefaults().Window - time.Second)
		b.observeRequest(later.Add(time.Second), later.Add(time.Second), 3001, true, false)
		if _, counts := b.observeReply(later.Add(time.Second), 8, Reply{Sent: later.Add(time.Second), Unavailable: true, PreviousFailure: old}); !counts {
			t.Fatal("a failure whose previous one is older than the window did not count")
		}
	})

	t.Run("AnotherInstancesHealthyReplyKeepsItClosedTheLatestOneCounts", func(t *testing.T) {
		t.Parallel()
		b := newBreaker(cfg)
		b.observe(t0, 100, true, false)
		// Four messages fail here; then another instance is answered, and
		// says so 500 ms later; 4s after this instance's own last answer,
		// a fifth message fails: one distinct failure since the platform
		// last answered, whoever it answered. The attempt does not count:
		// five distinct messages failed here since this instance's own
		// last answer.
		for id := range int64(4) {
			b.observe(t0.Add(time.Second), id, true, true)
		}
		b.observePeerHealthy(t0.Add(2500*time.Millisecond), t0.Add(2*time.Second))
		if tr, counts := b.observe(t0.Add(4*time.Second), 4, true, true); tr != stay || counts {
			t.Fatalf("a 5th failing message with another instance answered 2s ago: %v, counts %v; want it closed, no attempt counted", tr, counts)
		}
		// The other instance's announcement of a reply older than its
		// last one changes nothing; four more distinct failures, and 3s
		// after the latest reply anywhere, the breaker opens.
		b.observePeerHealthy(t0.Add(4*time.Second), t0.Add(time.Second))
		for id := range int64(3) {
			b.observe(t0.Add(4500*time.Millisecond), 10+id, true, true)
		}
		if tr, _ := b.observe(t0.Add(4900*time.Millisecond), 13, true, true); tr != stay {
			t.Fatalf("5 distinct failures 2.9s after another instance's answer: %v, want it closed until 3s", tr)
		}
		if tr, _ := b.observe(t0.Add(5*time.Second), 14, true, true); tr != trip {
			t.Fatalf("failures of distinct messages 3s after the last answer anywhere: %v, want it open", tr)
		}
		// Open, it opened on evidence: a late announcement does not undo it.
		b.observePeerHealthy(t0.Add(5100*time.Millisecond), t0.Add(5050*time.Millisecond))
		if b.state != BreakerOpen {
			t.Fatalf("an announcement reopened it: %v", b.state)
		}
	})

	t.Run("AnInstanceCutOffFromThePlatformSpendsNoAttempt", func(t *testing.T) {
		t.Parallel()
		// This instance reaches the platform no more (its network, its
		// proxy): every request it sends fails, while the others announce
		// their healthy replies each second. For ten minutes, it keeps the
		// breaker closed for all, and no attempt of its rows counts: not
		// the first, nor a retry whose previous failure left the window.
		// (Its own last answer, 11s before, is out of the window.)
		b := newBreaker(cfg)
		b.observe(t0, 100, true, false)
		previous := map[int64]time.Time{}
		for i := range 6000 {
			at := t0.Add(11*time.Second + time.Duration(i)*100*time.Millisecond)
			if i%10 == 0 {
				b.observePeerHealthy(at, at.Add(-300*time.Millisecond))
			}
			id := int64(i % 50) // 50 messages, each retried every 5s
			tr, counts := b.observeReply(at, id, Reply{Sent: at, Unavailable: true, Fresh: true, PreviousFailure: previous[id], Why: "connection refused"})
			if tr != stay || counts {
				t.Fatalf("failure %d at %v, the others answered 300ms before: %v, counts %v; want it closed, no attempt counted", i, at.Sub(t0), tr, counts)
			}
			previous[id] = at
		}
	})

	t.Run("ALastAttemptCountsOnlyForAMessageSeenFailingOnItsOwn", func(t *testing.T) {
		t.Parallel()
		// The platform answers every 100ms, then goes down: the requests in
		// flight fail at once as the first failures of new messages, with
		// the last answer 50ms old. A row allowed one attempt must not end
		// FAILED on that: its first failure counts no attempt, the last or
		// not. A message that failed, then failed again after the platform
		// answered a request sent after its failure, fails on its own: its
		// last attempt counts.
		b := newBreaker(cfg)
		healthyEvery(b, t0, t0.Add(time.Second), 100*time.Millisecond)
		down := t0.Add(950 * time.Millisecond)
		if _, counts := b.observeReply(down, 1, Reply{Sent: down.Add(-time.Second), Unavailable: true, Fresh: true, Last: true}); counts {
			t.Fatal("the first failure of a message allowed one attempt counts: an outage beginning ends its row FAILED")
		}
		if _, counts := b.observeReply(down, 2, Reply{Sent: down.Add(-time.Second), Unavailable: true, Fresh: true}); !counts {
			t.Fatal("the first failure of a message with attempts left, the platform evidently up, does not count")
		}
		b = newBreaker(cfg)
		failed := t0.Add(200 * time.Millisecond)
		healthyEvery(b, t0, failed, 100*time.Millisecond)
		if _, counts := b.observeReply(failed, 3, Reply{Sent: failed, Unavailable: true, Fresh: true, Last: true}); counts {
			t.Fatal("the first failure of a message allowed one attempt counts")
		}
		healthyEvery(b, failed.Add(100*time.Millisecond), failed.Add(time.Second), 100*time.Millisecond)
		again := failed.Add(time.Second)
		if _, counts := b.observeReply(again, 3, Reply{Sent: again, Unavailable: true, Fresh: true, Last: true, PreviousFailure: failed}); !counts {
			t.Fatal("a message failing again after the platform answered others since its failure: its last attempt does not count, it never ends FAILED")
		}
	})

	t.Run("ARequeuedMessageIsNewAgain", func(t *testing.T) {
		t.Parallel()
		// Row 3, allowed one attempt, fails twice here while the platform
		// answers others: the second failure counts, and it ends FAILED.
		// An operator requeues it at once (its claims number attempts
		// from 1 again, and its row no longer carries a failure); its
		// first attempt after that fails as the platform goes down, with
		// the replies to requests sent a moment before still healthy.
		// That is a new message's first failure, which must not count,
		// although this breaker saw the message fail on its own 100ms ago.
		last := Reply{Unavailable: true, Fresh: true, Last: true, Attempt: 1}
		b := newBreaker(cfg)
		failed := t0.Add(200 * time.Millisecond)
		healthyEvery(b, t0, failed, 100*time.Millisecond)
		b.observeReply(failed, 3, withSent(last, failed))
		healthyEvery(b, failed.Add(100*time.Millisecond), failed.Add(time.Second), 100*time.Millisecond)
		again := failed.Add(time.Second)
		if _, counts := b.observeReply(again, 3, withSent(last, again)); !counts {
			t.Fatal("a message failing again after the platform answered others: its last attempt does not count")
		}
		b.observe(again.Add(50*time.Millisecond), 4000, true, false)
		requeued := again.Add(100 * time.Millisecond)
		if _, counts := b.observeReply(requeued, 3, withSent(last, requeued)); counts {
			t.Fatal("the first failure of a requeued message counts, from a failure before the requeue: a row allowed one attempt ends FAILED again as an outage begins")
		}

		// Without a requeue the breaker's memory stands when the row
		// carries no previous failure (a pipeline that drops it): row 5
		// fails, counted, on its first of two attempts; its second, on
		// its own, counts.
		b = newBreaker(cfg)
		healthyEvery(b, t0, failed, 100*time.Millisecond)
		if _, counts := b.observeReply(failed, 5, Reply{Sent: failed, Unavailable: true, Fresh: true, Attempt: 1}); !counts {
			t.Fatal("the first failure of a message with attempts left, the platform evidently up, does not count")
		}
		healthyEvery(b, failed.Add(100*time.Millisecond), failed.Add(time.Second), 100*time.Millisecond)
		if _, counts := b.observeReply(again, 5, Reply{Sent: again, Unavailable: true, Last: true, Attempt: 2}); !counts {
			t.Fatal("a retry failing on its own, seen failing here before: its last attempt does not count")
		}
		// Nor is an attempt the gate held back (a pause) taken for a
		// requeue: the next one has its number.
		b.observeReply(again, 6, Reply{Sent: again, Unavailable: true, Fresh: true, Attempt: 1})
		b.heldBack(6)
		healthyEvery(b, again.Add(100*time.Millisecond), again.Add(time.Second), 100*time.Millisecond)
		retry := again.Add(time.Second)
		if _, counts := b.observeReply(retry, 6, Reply{Sent: retry, Unavailable: true, Fresh: true, Last: true, Attempt: 1}); !counts {
			t.Fatal("a retry after an attempt held back, failing on its own: taken for a requeued message")
		}
	})

	t.Run("StaleEvidenceDoesNotCount", func(t *testing.T) {
		t.Parallel()
		b := newBreaker(cfg)
		b.observe(t0, 1, true, false)
		if _, counts := b.observe(t0.Add(11*time.Second), 2, true, true); counts {
			t.Fatal("a failure 11s after the last answer (window 10s) counts: under light load an outage could spend attempts")
		}
	})

	t.Run("OldFailuresLeaveTheWindow", func(t *testing.T) {
		t.Parallel()
		b := newBreaker(cfg)
		for id := range int64(4) {
			b.observe(t0, id, true, true)
		}
		late := t0.Add(11 * time.Second)
		if tr, _ := b.observe(late, 4, true, true); tr != stay {
			t.Fatalf("failures older than the window still count: %v", tr)
		}
		if n := b.failingSinceHealthy(); n != 1 || len(b.latest) != 1 || len(b.failures) != 1 {
			t.Fatalf("kept %d failing messages (%d counted, %d replies), want the recent one", len(b.latest), n, len(b.failures))
		}
	})

	t.Run("HalfOpenClosesOnDistinctMessagesAndOneMessageDoesNotReopenIt", func(t *testing.T) {
		t.Parallel()
		b := newBreaker(cfg)
		b.set(BreakerHalfOpen, t0)
		if _, counts := b.observe(t0, 9, true, true); counts {
			t.Fatal("a failure while half-open counts an attempt")
		}
		for range 5 { // one message's healthy replies count once
			if tr, _ := b.observe(t0, 1, true, false); tr != stay {
				t.Fatalf("the same message answered again closed it: %v", tr)
			}
		}
		for range 20 { // one message failing, again and again
			if tr, _ := b.observe(t0.Add(5*time.Second), 9, true, true); tr != stay {
				t.Fatalf("one message's failures reopened it: %v", tr)
			}
		}
		b.observe(t0, 2, true, false)
		if tr, _ := b.observe(t0, 3, true, false); tr != recover || b.state != BreakerClosed {
			t.Fatalf("3rd distinct message answered in half-open: %v %v", tr, b.state)
		}
		b.set(BreakerHalfOpen, t0)
		var tr transition
		for id := range int64(5) {
			tr, _ = b.observe(t0.Add(4*time.Second), 100+id, true, true)
		}
		if tr != trip || b.state != BreakerOpen {
			t.Fatalf("5 distinct messages failing after 4s of silence in half-open: %v %v", tr, b.state)
		}
	})
}

func TestRateLimit(t *testing.T) {
	t.Parallel()
	if NewRateLimit(0, nil).Wait(context.Background()) != nil {
		t.Fatal("no limit must never wait")
	}
	// A fake shared bucket: rate 100/s, tokens given out only as time
	// allows; the limit must take them in chunks of 10.
	var asked []int
	start := time.Now()
	var taken float64
	r := NewRateLimit(100, func(_ context.Context, n int, rate, burst float64) (bool, time.Duration, error) {
		asked = append(asked, n)
		avail := min(burst, time.Since(start).Seconds()*rate) - taken + burst
		if avail >= float64(n) {
			taken += float64(n)
			return true, 0, nil
		}
		return false, time.Duration((float64(n) - avail) / rate * float64(time.Second)), nil
	})
	for range 150 {
		if err := r.Wait(context.Background()); err != nil {
			t.Fatal(err)
		}
	}
	// 150 requests: the first 100 from the full bucket, 50 more at 100/s.
	if took := time.Since(start); took < 400*time.Millisecond {
		t.Errorf("150 requests at 100/s with a bucket of 100 took %v, want about half a second", took)
	}
	for _, n := range asked {
		if n != 10 {
			t.Fatalf("asked the database for %v tokens, want chunks of 10", asked)
		}
	}
	if len(asked) < 15 {
		t.Errorf("asked %d times for 150 tokens", len(asked))
	}
}

// TestRateLimitBounds: the smallest and largest limits the config accepts.
func TestRateLimitBounds(t *testing.T) {
	t.Parallel()
	t.Run("TheSmallestWaitsWhileTheDatabaseFails", func(t *testing.T) {
		t.Parallel()
		// One request in 30 000 years: with the database failing, the
		// limit waits a chunk's worth of time (bounded) before sending,
		// where the overflowing wait sent at once.
		r := NewRateLimit(1e-12, func(context.Context, int, float64, float64) (bool, time.Duration, error) {
			return false, 0, errors.New("database down")
		})
		ctx, cancel := context.WithTimeout(context.Background(), 100*time.Millisecond)
		defer cancel()
		if err := r.Wait(ctx); !errors.Is(err, context.DeadlineExceeded) {
			t.Fatalf("a request at 1e-12 a second went after %v with the database down", err)
		}
	})
	t.Run("TheLargestTakesBoundedChunks", func(t *testing.T) {
		t.Parallel()
		if r := NewRateLimit(1e300, nil); r.chunk != maxRateChunk || r.burst != 1e300 {
			t.Fatalf("rate 1e300: chunks of %d, bucket %v", r.chunk, r.burst)
		}
	})
}

// withSent is r sent at sent.
func withSent(r Reply, sent time.Time) Reply {
	r.Sent = sent
	return r
}
