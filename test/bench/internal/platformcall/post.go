// Package platformcall is what every baseline of the bench does the same
// way: map a Kafka message to the platform's request (mapping.go) and send
// it (Post). The hand-written baselines (test/bench) and the River baseline
// (test/bench/riverbaseline, a module of its own) share it, so that they
// build the same requests and read the replies alike.
package platformcall

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"time"

	"github.com/forwarder/forwarder/internal/outboxdb"
)

// Outcome is the result of one POST, classified as
// docs/configuration.md#platform-responses says: SUCCESS, FAILED (never
// retried) or PENDING (retried later), with what the attempt log keeps.
type Outcome struct {
	Status     outboxdb.Status
	HTTPStatus *int32
	Errcode    *string
	Err        *string
	DurationMs int32
}

// Post sends body to baseURL+path and classifies the reply.
func Post(ctx context.Context, client *http.Client, baseURL, path string, body []byte) Outcome {
	start := time.Now()
	o := Outcome{Status: outboxdb.StatusPending}
	fail := func(s string) Outcome { o.Err = &s; return o }
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, baseURL+path, bytes.NewReader(body))
	if err != nil {
		return fail(err.Error())
	}
	req.Header.Set("Content-Type", "application/json")
	resp, err := client.Do(req)
	o.DurationMs = int32(time.Since(start).Milliseconds())
	if err != nil {
		return fail(err.Error())
	}
	reply, err := io.ReadAll(io.LimitReader(resp.Body, 64<<10))
	resp.Body.Close()
	o.DurationMs = int32(time.Since(start).Milliseconds())
	st := int32(resp.StatusCode)
	o.HTTPStatus = &st
	if err != nil {
		return fail(err.Error())
	}
	var r struct {
		Result  json.Number `json:"result"`
		Errcode any         `json:"errcode"`
	}
	if resp.StatusCode/100 != 2 {
		return fail(fmt.Sprintf("HTTP %d", resp.StatusCode))
	}
	if err := json.Unmarshal(reply, &r); err != nil {
		return fail("reply is not JSON")
	}
	if r.Errcode != nil {
		code := fmt.Sprint(r.Errcode)
		o.Errcode = &code
	}
	switch {
	case o.Errcode != nil && *o.Errcode == "4", r.Result == "0":
		o.Status = outboxdb.StatusSuccess
	case o.Errcode != nil && *o.Errcode == "998":
		o.Status = outboxdb.StatusFailed
		return fail("platform errcode 998")
	default:
		return fail("platform result " + r.Result.String())
	}
	return o
}
