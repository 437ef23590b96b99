package e2e_test

import (
	"cmp"
	"context"
	"fmt"
	"slices"
	"sort"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/forwarder/forwarder/internal/dev/eventgen"
)

// coord is a Kafka record's place.
type coord struct {
	topic     string
	partition int32
	offset    int64
}

func (c coord) key() string {
	return c.topic + "-" + strconv.Itoa(int(c.partition)) + "-" + strconv.FormatInt(c.offset, 10)
}

// badMsg is a message that must end FAILED, never sent.
type badMsg struct {
	at coord
	// messageID is the messageId in the payload, when it has one.
	messageID string
	flaw      eventgen.Flaw
	// reason, when set, must appear in the row's last_error.
	reason string
}

// expected is what the produced messages must become: one SUCCESS row and
// one delivery per good key, one FAILED row and no delivery per bad message.
type expected struct {
	mu       sync.Mutex
	good     map[string]bool // message keys: messageId, or topic-partition-offset without one
	bad      map[coord]badMsg
	produced int
	dups     int
}

func newExpected() *expected {
	return &expected{good: map[string]bool{}, bad: map[coord]badMsg{}}
}

// add records a produced eventgen message (rec carries its partition and offset).
func (e *expected) add(m eventgen.Message, rec *kgo.Record) {
	at := coord{rec.Topic, rec.Partition, rec.Offset}
	e.mu.Lock()
	defer e.mu.Unlock()
	e.produced++
	switch {
	case m.Flaw == eventgen.FlawDuplicate:
		e.dups++
	case m.Flaw == eventgen.FlawMissingID:
		e.good[at.key()] = true
	case m.Deliverable():
		e.good[m.MessageID] = true
	default:
		e.bad[at] = badMsg{at: at, messageID: m.MessageID, flaw: m.Flaw}
	}
}

// addGood records a good message keyed by its messageId.
func (e *expected) addGood(id string) {
	e.mu.Lock()
	defer e.mu.Unlock()
	e.produced++
	e.good[id] = true
}

// addBad records a bad message.
func (e *expected) addBad(b badMsg) {
	e.mu.Lock()
	defer e.mu.Unlock()
	e.produced++
	e.bad[b.at] = b
}

func (e *expected) rows() int {
	e.mu.Lock()
	defer e.mu.Unlock()
	return len(e.good) + len(e.bad)
}

func (e *expected) goodCount() int {
	e.mu.Lock()
	defer e.mu.Unlock()
	return len(e.good)
}

// row is what the suite reads of a forward_records row.
type row struct {
	id          int64
	key         string
	status      string
	lastError   string
	at          coord
	attempts    int
	claimedBy   string
	succeededAt *time.Time
}

func (s *stack) readRows(ctx context.Context) ([]row, error) {
	rows, err := s.pool.Query(ctx, `
		SELECT id, message_key, status, coalesce(last_error, ''), kafka_topic, kafka_partition,
		       kafka_offset, attempt_count, coalesce(claimed_by, ''), succeeded_at
		FROM forward_records ORDER BY id`)
	if err != nil {
		return nil, fmt.Errorf("reading forward_records: %w", err)
	}
	return pgx.CollectRows(rows, func(r pgx.CollectableRow) (row, error) {
		var x row
		err := r.Scan(&x.id, &x.key, &x.status, &x.lastError, &x.at.topic, &x.at.partition,
			&x.at.offset, &x.attempts, &x.claimedBy, &x.succeededAt)
		return x, err
	})
}

// report is a scenario's outcome, logged by every scenario.
type report struct {
	produced, kafkaDuplicates int
	rows, good, bad           int
	delivered                 int
	// dupDeliveries counts requests the platform answered errcode "4": a
	// message sent again after it had been accepted. dupMessages counts the
	// messages that happened to.
	dupDeliveries, dupMessages int
	// unexplainedDups counts the deliveries after the first that no
	// earlier attempt of the message accounts for: a message may be sent
	// again after a lease ran out (the attempt log's LEASE_EXPIRED) or a
	// request that got no reply (an attempt logged without an HTTP status),
	// which is what the platform's duplicate errcode is for; any other
	// second delivery is a fault of the forwarder.
	unexplainedDups int
	// dupKeys are the first few messages sent again, those with unexplained
	// deliveries first, for stack.dupHistory.
	dupKeys          []string
	maxAttempts      int
	platformRequests int64
	peakInFlight     int64
}

func (r report) String() string {
	return fmt.Sprintf("produced %d (%d Kafka duplicates), rows %d (good %d, bad %d), delivered %d, "+
		"duplicate deliveries %d (of %d messages, %d unexplained), max attempt_count %d, platform requests %d, peak in flight %d",
		r.produced, r.kafkaDuplicates, r.rows, r.good, r.bad, r.delivered, r.dupDeliveries, r.dupMessages, r.unexplainedDups,
		r.maxAttempts, r.platformRequests, r.peakInFlight)
}

// verify checks the end state against the expectations: every good message
// SUCCESS and delivered, every bad one FAILED with a reason and never
// delivered, nothing else in the table or at the platform, no password in
// any row. It returns the figures.
func (s *stack) verify() report {
	s.t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	rows, err := s.readRows(ctx)
	if err != nil {
		s.t.Fatal(err)
	}
	e := s.exp
	e.mu.Lock()
	defer e.mu.Unlock()

	r := report{produced: e.produced, kafkaDuplicates: e.dups, rows: len(rows), good: len(e.good), bad: len(e.bad)}
	var problems []string
	problem := func(format string, args ...any) {
		if len(problems) < 30 {
			problems = append(problems, fmt.Sprintf(format, args...))
		} else if len(problems) == 30 {
			problems = append(problems, "...")
		}
	}

	seenGood := map[string]bool{}
	seenBad := map[coord]bool{}
	for _, x := range rows {
		r.maxAttempts = max(r.maxAttempts, x.attempts)
		b, isBad := e.bad[x.at]
		switch {
		case e.good[x.key]:
			seenGood[x.key] = true
			if x.status != "SUCCESS" {
				problem("good message %s is %s (attempts %d, last_error %q)", x.key, x.status, x.attempts, x.lastError)
			}
		case isBad:
			seenBad[x.at] = true
			if x.status != "FAILED" {
				problem("bad message at %s (%s) is %s, want FAILED", x.at.key(), b.flaw, x.status)
			}
			if x.lastError == "" {
				problem("bad message at %s (%s) is FAILED without a reason", x.at.key(), b.flaw)
			}
			if b.reason != "" && !strings.Contains(x.lastError, b.reason) {
				problem("bad message at %s (%s): last_error %q does not mention %q", x.at.key(), b.flaw, x.lastError, b.reason)
			}
		default:
			problem("unexpected row %s at %s: %s %q", x.key, x.at.key(), x.status, x.lastError)
		}
	}
	for k := range e.good {
		if !seenGood[k] {
			problem("good message %s has no row: lost", k)
		}
		d, ok := s.platform.Delivery(k)
		if !ok {
			problem("good message %s was never accepted by the platform: lost", k)
			continue
		}
		r.delivered++
		if d.Count > 1 {
			r.dupDeliveries += d.Count - 1
			r.dupMessages++
			r.dupKeys = append(r.dupKeys, k)
		}
	}
	if len(r.dupKeys) > 0 {
		unexplained, err := s.unexplainedDeliveries(ctx, r.dupKeys)
		if err != nil {
			s.t.Fatal(err)
		}
		for _, n := range unexplained {
			r.unexplainedDups += n
		}
		slices.SortFunc(r.dupKeys, func(a, b string) int {
			return cmp.Or(cmp.Compare(unexplained[b], unexplained[a]), strings.Compare(a, b))
		})
	}
	r.dupKeys = r.dupKeys[:min(len(r.dupKeys), 5)]
	for at, b := range e.bad {
		if !seenBad[at] {
			problem("bad message at %s (%s) has no row: lost", at.key(), b.flaw)
		}
		for _, id := range []string{b.messageID, at.key()} {
			if _, ok := s.platform.Delivery(id); id != "" && ok {
				problem("bad message at %s (%s) was delivered as %s", at.key(), b.flaw, id)
			}
		}
	}
	for _, d := range s.platform.Deliveries() {
		if !e.good[d.MessageID] {
			problem("the platform received %s, which is no good message", d.MessageID)
		}
	}
	st := s.platform.Stats()
	r.platformRequests, r.peakInFlight = st.Requests, st.PeakInFlight
	if (st.AuthFailures > 0 && !s.allowAuthFailures) || st.BadRequests > 0 {
		problem("the platform rejected %d requests for their credentials and %d as malformed", st.AuthFailures, st.BadRequests)
	}
	if leaks := s.passwordInRows(ctx); len(leaks) > 0 {
		problem("the platform password is stored in %s", strings.Join(leaks, ", "))
	}
	if len(problems) > 0 {
		s.dumpLogs()
		s.t.Errorf("%d problems (%s):\n  %s", len(problems), r, strings.Join(problems, "\n  "))
	}
	return r
}

// unexplainedDeliveries returns, for each of keys (messages the platform
// accepted more than once), how many of its deliveries after the first no
// logged attempt accounts for: each re-send is owed to a LEASE_EXPIRED log
// or to an attempt whose request got no reply (logged without an HTTP
// status: a timeout, a broken connection, a stop mid-request).
func (s *stack) unexplainedDeliveries(ctx context.Context, keys []string) (map[string]int, error) {
	rows, err := s.pool.Query(ctx, `
		SELECT r.message_key,
		       count(l.id) FILTER (WHERE l.result_status = 'LEASE_EXPIRED'
		                             OR (l.http_status IS NULL AND l.result_status IN ('PENDING', 'FAILED')))
		FROM forward_records r LEFT JOIN forward_retry_logs l ON l.record_id = r.id
		WHERE r.message_key = ANY ($1)
		GROUP BY r.message_key`, keys)
	if err != nil {
		return nil, fmt.Errorf("reading the attempts of messages delivered twice: %w", err)
	}
	owed := map[string]int{}
	for rows.Next() {
		var (
			key string
			n   int
		)
		if err := rows.Scan(&key, &n); err != nil {
			return nil, err
		}
		owed[key] = n
	}
	if err := rows.Err(); err != nil {
		return nil, err
	}
	out := make(map[string]int, len(keys))
	for _, k := range keys {
		d, _ := s.platform.Delivery(k)
		out[k] = max(d.Count-1-owed[k], 0)
	}
	return out, nil
}

// dupHistory tells, for the messages of r sent more than once, when the
// platform first and last accepted each and every attempt the outbox logged
// of it (which instance, what came back): a re-send after a request whose
// reply never came (a timeout) is what the platform's duplicate errcode is
// for; one after an accepted reply, or by two instances at once, is not.
func (s *stack) dupHistory(r report) string {
	if len(r.dupKeys) == 0 {
		return ""
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	var b strings.Builder
	for _, k := range r.dupKeys {
		d, _ := s.platform.Delivery(k)
		fmt.Fprintf(&b, "\n  %s: accepted %d times, first %s, last %s; attempts logged:", k, d.Count,
			d.FirstAt.Format(time.StampMilli), d.LastAt.Format(time.StampMilli))
		rows, err := s.pool.Query(ctx, `
			SELECT l.attempt_number, l.result_status, coalesce(l.http_status, 0), coalesce(l.platform_errcode, ''),
			       coalesce(l.error_message, ''), coalesce(l.duration_ms, 0), l.attempted_at, coalesce(l.attempted_by, '')
			FROM forward_retry_logs l JOIN forward_records r ON r.id = l.record_id
			WHERE r.message_key = $1 ORDER BY l.id`, k)
		if err != nil {
			fmt.Fprintf(&b, " %v", err)
			continue
		}
		for rows.Next() {
			var (
				n, code, ms              int
				result, errcode, msg, by string
				at                       time.Time
			)
			if err := rows.Scan(&n, &result, &code, &errcode, &msg, &ms, &at, &by); err != nil {
				fmt.Fprintf(&b, " %v", err)
				break
			}
			fmt.Fprintf(&b, "\n    #%d at %s by %s: %s, HTTP %d, errcode %q, %d ms, %q", n, at.Format(time.StampMilli), by, result, code, errcode, ms, msg)
		}
		rows.Close()
	}
	return b.String()
}

// passwordInRows lists the columns of the schema's tables (every text-like
// or binary column, found in the catalogue) where some row holds the
// platform password.
func (s *stack) passwordInRows(ctx context.Context) []string {
	s.t.Helper()
	return s.secretInRows(ctx, s.accessPwd)
}

// secretInRows lists the columns of the tables of the schema (the outbox
// tables, the platform state, the operator log, ...) where some row holds
// secret.
func (s *stack) secretInRows(ctx context.Context, secret string) []string {
	s.t.Helper()
	rows, err := s.pool.Query(ctx, `
		SELECT table_name, column_name, data_type FROM information_schema.columns
		WHERE table_schema = current_schema()
		  AND table_name IN (SELECT table_name FROM information_schema.tables
		                     WHERE table_schema = current_schema() AND table_type = 'BASE TABLE')
		  AND data_type IN ('text', 'character varying', 'character', 'bytea', 'json', 'jsonb', 'uuid')
		ORDER BY table_name, ordinal_position`)
	if err != nil {
		s.t.Fatalf("listing the outbox columns: %v", err)
	}
	type col struct{ table, name, typ string }
	cols, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (col, error) {
		var c col
		return c, r.Scan(&c.table, &c.name, &c.typ)
	})
	if err != nil {
		s.t.Fatalf("listing the outbox columns: %v", err)
	}
	if len(cols) < 8 {
		s.t.Fatalf("found only %d text or binary columns in the schema's tables: %v", len(cols), cols)
	}
	var leaks []string
	for _, c := range cols {
		cond := "strpos(" + pgx.Identifier{c.name}.Sanitize() + "::text, $1) > 0"
		if c.typ == "bytea" {
			// The bytes themselves, not their hex rendering.
			cond = "position(convert_to($1, 'UTF8') in " + pgx.Identifier{c.name}.Sanitize() + ") > 0"
		}
		var n int
		q := "SELECT count(*) FROM " + pgx.Identifier{c.table}.Sanitize() + " WHERE " + cond
		if err := s.pool.QueryRow(ctx, q, secret).Scan(&n); err != nil {
			s.t.Fatalf("searching %s.%s for a secret: %v", c.table, c.name, err)
		}
		if n > 0 {
			leaks = append(leaks, fmt.Sprintf("%s.%s (%d rows)", c.table, c.name, n))
		}
	}
	return leaks
}

// summary describes durations for the reports: min, median, max.
func summary(ds []time.Duration) string {
	if len(ds) == 0 {
		return "none"
	}
	sort.Slice(ds, func(i, j int) bool { return ds[i] < ds[j] })
	return fmt.Sprintf("min %s, median %s, max %s (n=%d)",
		ds[0].Round(time.Millisecond), ds[len(ds)/2].Round(time.Millisecond), ds[len(ds)-1].Round(time.Millisecond), len(ds))
}
