package main

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"net/http"
	"sync"
	"sync/atomic"
	"time"

	"github.com/forwarder/forwarder/internal/dev/mockplatform"
	"github.com/forwarder/forwarder/internal/outboxdb"
)

// ceilings are what the machine can do at most, part by part, for reading
// the scenario figures against.
type ceilings struct {
	// HTTPReqPerSec: 64 concurrent HTTP/1.1 keep-alive clients POSTing
	// mapped vehicle events to the mock platform over loopback, client and
	// server in this process.
	HTTPReqPerSec float64
	// InsertRowsPerSec: outboxdb.InsertBatchCount (insert.sql, one unnest
	// statement with its NOTIFY) in batches of 500, one connection.
	InsertRowsPerSec float64
	// ClaimRecordRowsPerSec: outboxdb.ClaimDue then outboxdb.RecordResults
	// (all SUCCESS) in batches of 500, one connection: the database side of
	// dispatching, without HTTP.
	ClaimRecordRowsPerSec float64
	Rows                  int
}

func measureCeilings(ctx context.Context, env *benchEnv) (ceilings, error) {
	var c ceilings
	var err error
	if c.HTTPReqPerSec, err = httpCeiling(ctx, env, 64, 3*time.Second); err != nil {
		return c, err
	}
	c.Rows = min(env.cfg.N, 100_000)
	c.InsertRowsPerSec, c.ClaimRecordRowsPerSec, err = dbCeilings(ctx, env, c.Rows, 500)
	return c, err
}

func httpCeiling(ctx context.Context, env *benchEnv, clients int, d time.Duration) (float64, error) {
	mp, err := mockplatform.Start(mockplatform.Config{AccessName: accessName, AccessPwd: env.accessPwd})
	if err != nil {
		return 0, err
	}
	defer mp.Close()
	client := &http.Client{Timeout: 10 * time.Second, Transport: &http.Transport{MaxIdleConns: clients, MaxIdleConnsPerHost: clients}}
	defer client.CloseIdleConnections()
	tmpl := `{"access_name":"` + accessName + `","access_pwd":"` + env.accessPwd + `","message_id":"ceiling-%d","device_id":"CAM-0001",` +
		`"park_code":"P1001","berth_code":"B-012","item_id":"73421","plate_no":"粤B12345","plate_color":"1","enter_state":"1",` +
		`"event_time":"2026-05-21 10:30:00","credibility":"85","pictures":[{"pic_type":"1","pic_url":"/jieshun/2026/05/21/P1001/a.jpg"},` +
		`{"pic_type":"0","pic_url":"/jieshun/2026/05/21/P1001/b.jpg"}]}`
	var (
		seq, done atomic.Int64
		wg        sync.WaitGroup
		firstErr  atomic.Value
	)
	stop := time.Now().Add(d)
	start := time.Now()
	for range clients {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for time.Now().Before(stop) && ctx.Err() == nil {
				body := fmt.Sprintf(tmpl, seq.Add(1))
				resp, err := client.Post(mp.URL+mockplatform.PathBusiness, "application/json", bytes.NewReader([]byte(body)))
				if err != nil {
					firstErr.CompareAndSwap(nil, err)
					return
				}
				_, _ = io.Copy(io.Discard, resp.Body)
				resp.Body.Close()
				done.Add(1)
			}
		}()
	}
	wg.Wait()
	if err, _ := firstErr.Load().(error); err != nil {
		return 0, fmt.Errorf("posting to the mock platform: %w", err)
	}
	if st := mp.Stats(); st.Accepted != done.Load() {
		return 0, fmt.Errorf("mock platform accepted %d of %d requests", st.Accepted, done.Load())
	}
	return float64(done.Load()) / time.Since(start).Seconds(), nil
}

func dbCeilings(ctx context.Context, env *benchEnv, n, batch int) (insert, claim float64, err error) {
	const db = "ceilings"
	_, pool, err := env.createDB(ctx, db)
	if err != nil {
		return 0, 0, err
	}
	defer env.dropDB(context.WithoutCancel(ctx), db)
	defer pool.Close()
	src, err := env.newSource("ceil-vehicle", "ceil-heartbeat", env.cfg.Seed+7)
	if err != nil {
		return 0, 0, err
	}
	recs := make([]outboxdb.NewRecord, n)
	for i := range recs {
		m := src.Next()
		api := "VEHICLE_EVENT"
		if m.Topic == "ceil-heartbeat" {
			api = "HEARTBEAT"
		}
		recs[i] = outboxdb.NewRecord{MessageKey: m.MessageID, APIType: api, KafkaTopic: m.Topic,
			KafkaPartition: int32(i % 3), KafkaOffset: int64(i), KafkaKey: m.Key, Payload: m.Value, Status: outboxdb.StatusPending}
	}
	start := time.Now()
	for i := 0; i < n; i += batch {
		if _, err := outboxdb.InsertBatchCount(ctx, pool, recs[i:min(i+batch, n)]); err != nil {
			return 0, 0, err
		}
	}
	insert = float64(n) / time.Since(start).Seconds()

	start = time.Now()
	claimed := 0
	for claimed < n {
		res, err := outboxdb.ClaimDue(ctx, pool, outboxdb.ClaimParams{Limit: batch, Lease: time.Minute, Claimer: "ceiling", MaxAttempts: 5})
		if err != nil {
			return 0, 0, err
		}
		if len(res.Claimed) == 0 {
			return 0, 0, fmt.Errorf("claimed %d of %d rows, then nothing", claimed, n)
		}
		results := make([]outboxdb.Result, len(res.Claimed))
		for i, r := range res.Claimed {
			results[i] = outboxdb.Result{ID: r.ID, ClaimToken: r.ClaimToken, Status: outboxdb.StatusSuccess,
				Sent: true, Duration: time.Millisecond, HTTPStatus: 200}
		}
		if _, err := outboxdb.RecordResults(ctx, pool, results, outboxdb.RecordOptions{}); err != nil {
			return 0, 0, err
		}
		claimed += len(res.Claimed)
	}
	claim = float64(n) / time.Since(start).Seconds()
	return insert, claim, nil
}
