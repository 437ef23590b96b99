package main

import (
	"bufio"
	"encoding/hex"
	"fmt"
	"os"

	"github.com/forwarder/forwarder/internal/testsupport/otlpreceiver"
)

// writeSpans writes every span rcv received to path, for -latency-traces:
// one line a span, its times in Unix microseconds, and the message key on
// the insert's span, so that a stall in the latency phase can be placed in
// one step (kafka.consume, outbox.insert, outbox.claim, platform.request,
// outbox.record) of the messages it held.
func writeSpans(rcv *otlpreceiver.Receiver, path string) error {
	spans, _, err := rcv.Spans()
	if err != nil {
		return err
	}
	f, err := os.Create(path)
	if err != nil {
		return err
	}
	w := bufio.NewWriter(f)
	fmt.Fprintln(w, "trace\tspan\tparent\tname\tstart_unix_us\tend_unix_us\tmessage_key")
	for _, s := range spans {
		var key string
		for _, a := range s.GetAttributes() {
			if a.GetKey() == "outbox.message_key" {
				key = a.GetValue().GetStringValue()
			}
		}
		fmt.Fprintf(w, "%s\t%s\t%s\t%s\t%d\t%d\t%s\n", hex.EncodeToString(s.GetTraceId()), hex.EncodeToString(s.GetSpanId()),
			hex.EncodeToString(s.GetParentSpanId()), s.GetName(), s.GetStartTimeUnixNano()/1000, s.GetEndTimeUnixNano()/1000, key)
	}
	if err := w.Flush(); err != nil {
		f.Close()
		return err
	}
	return f.Close()
}
