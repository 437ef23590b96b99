package main

import (
	"bufio"
	"encoding/hex"
	"fmt"
	"os"
	"time"

	tracepb "go.opentelemetry.io/proto/otlp/trace/v1"
)

// writeSpans writes spans to path, for -latency-traces: one line a span,
// its times in Unix microseconds, and the message key on the insert's span.
func writeSpans(spans []*tracepb.Span, path string) error {
	f, err := os.Create(path)
	if err != nil {
		return err
	}
	w := bufio.NewWriter(f)
	fmt.Fprintln(w, "trace\tspan\tparent\tname\tstart_unix_us\tend_unix_us\tmessage_key")
	for _, s := range spans {
		fmt.Fprintf(w, "%s\t%s\t%s\t%s\t%d\t%d\t%s\n", hex.EncodeToString(s.GetTraceId()), hex.EncodeToString(s.GetSpanId()),
			hex.EncodeToString(s.GetParentSpanId()), s.GetName(), s.GetStartTimeUnixNano()/1000, s.GetEndTimeUnixNano()/1000,
			stringAttr(s, "outbox.message_key"))
	}
	if err := w.Flush(); err != nil {
		f.Close()
		return err
	}
	return f.Close()
}

// spanSteps are the steps of a traced message, in its order, timed from its
// spans and its send time: from the producer to the batch's kafka.consume
// span (the Kafka fetch and the batching period), to the insert, the
// insert transaction, the hand-off to dispatch (the claim), the mapping and
// output up to the request, and the POST.
var spanSteps = []string{"kafka", "to insert", "insert", "to claim", "claim to request", "request"}

// logSpanSteps reports how long each step took for the traced messages of
// a latency phase, and for those of them over slow, so that a stall can be
// placed in a step (docs/benchmarks.md, "A stall slows every step at once").
func logSpanSteps(scenario string, spans []*tracepb.Span, sentAt map[string]time.Time, firstAt map[string]time.Time, slow time.Duration) {
	byTrace := map[string][]*tracepb.Span{}
	for _, s := range spans {
		t := string(s.GetTraceId())
		byTrace[t] = append(byTrace[t], s)
	}
	all := make([][]time.Duration, len(spanSteps))
	late := make([][]time.Duration, len(spanSteps))
	for _, ss := range byTrace {
		first := map[string]*tracepb.Span{}
		var key string
		for _, s := range ss {
			if f, ok := first[s.GetName()]; !ok || s.GetStartTimeUnixNano() < f.GetStartTimeUnixNano() {
				first[s.GetName()] = s
			}
			if s.GetName() == "outbox.insert" {
				key = stringAttr(s, "outbox.message_key")
			}
		}
		consume, insert, claim, req := first["kafka.consume"], first["outbox.insert"], first["outbox.claim"], first["platform.request"]
		sent, measured := sentAt[key]
		at, delivered := firstAt[key]
		if consume == nil || insert == nil || claim == nil || req == nil || !measured || !delivered {
			continue
		}
		ns := func(v uint64) time.Time { return time.Unix(0, int64(v)) }
		steps := []time.Duration{
			ns(consume.GetStartTimeUnixNano()).Sub(sent),
			ns(insert.GetStartTimeUnixNano()).Sub(ns(consume.GetStartTimeUnixNano())),
			ns(insert.GetEndTimeUnixNano()).Sub(ns(insert.GetStartTimeUnixNano())),
			ns(claim.GetStartTimeUnixNano()).Sub(ns(insert.GetEndTimeUnixNano())),
			ns(req.GetStartTimeUnixNano()).Sub(ns(claim.GetStartTimeUnixNano())),
			ns(req.GetEndTimeUnixNano()).Sub(ns(req.GetStartTimeUnixNano())),
		}
		for i, d := range steps {
			all[i] = append(all[i], d)
			if at.Sub(sent) > slow {
				late[i] = append(late[i], d)
			}
		}
	}
	if len(all[0]) == 0 {
		logf("%s: no traced message could be followed from Kafka to the platform", scenario)
		return
	}
	logf("%s: steps of %d traced messages (p50 / p99 / max), and the mean of the %d over %s against all:",
		scenario, len(all[0]), len(late[0]), slow)
	for i, name := range spanSteps {
		logf("  %-17s %7s / %7s / %7s   %7s against %7s", name, ms(quantile(all[i], 0.5)), ms(quantile(all[i], 0.99)),
			ms(quantile(all[i], 1)), ms(mean(late[i])), ms(mean(all[i])))
	}
}

func stringAttr(s *tracepb.Span, key string) string {
	for _, a := range s.GetAttributes() {
		if a.GetKey() == key {
			return a.GetValue().GetStringValue()
		}
	}
	return ""
}

func mean(ds []time.Duration) time.Duration {
	if len(ds) == 0 {
		return 0
	}
	var sum time.Duration
	for _, d := range ds {
		sum += d
	}
	return sum / time.Duration(len(ds))
}
