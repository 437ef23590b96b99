package httpforwarder

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/redpanda-data/benthos/v4/public/service"

	"github.com/forwarder/forwarder/internal/outboxdb"
	"github.com/forwarder/forwarder/internal/testsupport/pgtest"
)

// The benchmarks send the same requests to the same fast local platform
// with the same concurrency, so that their msgs/s compare:
//
//	go test -run '^$' -bench . ./plugins/httpforwarder/
//
// BenchmarkBareNetHTTP is the ceiling: a bare net/http loop that POSTs and
// reads the reply. BenchmarkHTTPForwarder is the output's whole job on the
// same requests: credentials, classification, backoff and the fenced result
// write to PostgreSQL, one statement per batch. Target: forwarder ≥ 0.7 ×
// bare. On a shared machine the two separate runs see different loads, so
// BenchmarkForwarderVsBare alternates short rounds of both and reports the
// ratio, plus the CPU each message costs (this process, which also serves
// the platform, and the PostgreSQL server).
const (
	benchInFlight  = 64
	benchBatchSize = 64
	benchWriters   = 4 // concurrent WriteBatch calls, as Benthos makes them
	benchRoundMsgs = 2048
)

const benchBody = `{"message_id":"%s","device_id":"CAM-0001","park_code":"P1001","berth_code":"B-012","item_id":"73421","plate_no":"粤B12345","plate_color":"1","enter_state":"1","event_time":"2026-05-21 10:30:00","credibility":"85","pictures":[{"pic_type":"1","pic_url":"/jieshun/2026/05/21/P1001/a.jpg"},{"pic_type":"0","pic_url":"/jieshun/2026/05/21/P1001/b.jpg"}]}`

type benchRig struct {
	ctx    context.Context
	srv    *httptest.Server
	pool   *pgxpool.Pool
	out    *httpForwarder
	client *http.Client
	body   []byte
}

func newBenchRig(b *testing.B) *benchRig {
	b.Helper()
	r := &benchRig{ctx: context.Background()}
	r.srv = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, req *http.Request) {
		_, _ = io.Copy(io.Discard, req.Body)
		w.Header().Set("Content-Type", "application/json")
		_, _ = w.Write([]byte(`{"result":0,"errcode":"0","message":"ok"}`))
	}))
	b.Cleanup(r.srv.Close)

	dsn := pgtest.NewDB(b)
	pool, err := outboxdb.Open(r.ctx, dsn, outboxdb.PoolConfig{})
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(pool.Close)
	r.pool = pool
	r.out = newTestOutput(b, baseYAML(dsn, r.srv.URL, fmt.Sprintf("max_in_flight: %d\ntimeout: 10s", benchInFlight)), nil)
	if err := r.out.Connect(r.ctx); err != nil {
		b.Fatal(err)
	}

	// The bare client gets the same pool size and protocol as the output.
	protocols := new(http.Protocols)
	protocols.SetHTTP1(true)
	tr := &http.Transport{MaxIdleConns: benchInFlight, MaxIdleConnsPerHost: benchInFlight, Protocols: protocols}
	b.Cleanup(tr.CloseIdleConnections)
	r.client = &http.Client{Transport: tr, Timeout: 10 * time.Second}
	r.body = []byte(`{"access_name":"a","access_pwd":"b",` + fmt.Sprintf(benchBody, "8f14e45f-ea0b-4b6a-9a1e-5c2d7c0e9b11")[1:])
	return r
}

// claimed inserts and claims n rows and returns them as mapped batches.
func (r *benchRig) claimed(b *testing.B, n int) []service.MessageBatch {
	b.Helper()
	if _, err := r.pool.Exec(r.ctx, insertDueSQL, outboxdb.APITypeVehicleEvent, n); err != nil {
		b.Fatal(err)
	}
	var batches []service.MessageBatch
	for done := 0; done < n; {
		rows, err := outboxdb.Claim(r.ctx, r.pool, min(benchBatchSize, n-done), time.Hour, "bench")
		if err != nil {
			b.Fatal(err)
		}
		batch := make(service.MessageBatch, len(rows))
		for i, row := range rows {
			batch[i] = message(row, fmt.Sprintf(benchBody, row.MessageKey))
		}
		batches = append(batches, batch)
		done += len(rows)
	}
	return batches
}

// forward writes the batches with benchWriters concurrent WriteBatch calls.
func (r *benchRig) forward(b *testing.B, batches []service.MessageBatch) {
	var next atomic.Int64
	var wg sync.WaitGroup
	for range benchWriters {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for {
				i := int(next.Add(1)) - 1
				if i >= len(batches) {
					return
				}
				if err := r.out.WriteBatch(r.ctx, batches[i]); err != nil {
					b.Error(err)
					return
				}
			}
		}()
	}
	wg.Wait()
}

// bare makes n requests from benchInFlight goroutines.
func (r *benchRig) bare(b *testing.B, n int) {
	var next atomic.Int64
	var wg sync.WaitGroup
	for range benchInFlight {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for next.Add(1) <= int64(n) {
				resp, err := r.client.Post(r.srv.URL+"/mch/business", "application/json", bytes.NewReader(r.body))
				if err != nil {
					b.Error(err)
					return
				}
				_, _ = io.Copy(io.Discard, resp.Body)
				_ = resp.Body.Close()
			}
		}()
	}
	wg.Wait()
}

func (r *benchRig) countSuccess(b *testing.B) int {
	var n int
	if err := r.pool.QueryRow(r.ctx, `SELECT count(*) FROM forward_records WHERE status = 'SUCCESS'`).Scan(&n); err != nil {
		b.Fatal(err)
	}
	return n
}

func BenchmarkHTTPForwarder(b *testing.B) {
	b.StopTimer() // database, output and claimed rows are made untimed
	r := newBenchRig(b)
	batches := r.claimed(b, b.N)
	b.ReportAllocs()
	b.StartTimer()
	start := time.Now()
	r.forward(b, batches)
	elapsed := time.Since(start)
	b.StopTimer()
	b.ReportMetric(float64(b.N)/elapsed.Seconds(), "msgs/s")
	if got := r.countSuccess(b); got != b.N {
		b.Fatalf("%d of %d rows SUCCESS", got, b.N)
	}
}

func BenchmarkBareNetHTTP(b *testing.B) {
	b.StopTimer()
	r := newBenchRig(b)
	b.ReportAllocs()
	b.StartTimer()
	start := time.Now()
	r.bare(b, b.N)
	elapsed := time.Since(start)
	b.StopTimer()
	b.ReportMetric(float64(b.N)/elapsed.Seconds(), "msgs/s")
}

// BenchmarkForwarderVsBare alternates rounds of benchRoundMsgs messages
// through the output and through the bare loop, so both see the same
// machine, and reports their msgs/s, the ratio, and CPU per message.
func BenchmarkForwarderVsBare(b *testing.B) {
	b.StopTimer()
	r := newBenchRig(b)
	var fwdWall, bareWall, fwdCPU, bareCPU time.Duration
	// measure runs fn and adds its wall time and CPU (this process and
	// PostgreSQL) to the totals; the readings are taken outside the window.
	measure := func(fn func(), wall, cpu *time.Duration) {
		pg := postgresCPU(b)
		pg0 := pg()
		cpu0, t0 := processCPU(), time.Now()
		fn()
		*wall += time.Since(t0)
		*cpu += processCPU() - cpu0
		*cpu += pg() - pg0
	}
	for range b.N {
		batches := r.claimed(b, benchRoundMsgs)
		measure(func() { r.forward(b, batches) }, &fwdWall, &fwdCPU)
		measure(func() { r.bare(b, benchRoundMsgs) }, &bareWall, &bareCPU)
	}
	msgs := float64(b.N * benchRoundMsgs)
	fwd, bare := msgs/fwdWall.Seconds(), msgs/bareWall.Seconds()
	b.ReportMetric(fwd, "fwd_msgs/s")
	b.ReportMetric(bare, "bare_msgs/s")
	b.ReportMetric(fwd/bare, "ratio")
	b.ReportMetric(float64(fwdCPU.Microseconds())/msgs, "fwd_cpu_µs/msg")
	b.ReportMetric(float64(bareCPU.Microseconds())/msgs, "bare_cpu_µs/msg")
	if got := r.countSuccess(b); got != b.N*benchRoundMsgs {
		b.Fatalf("%d of %d rows SUCCESS", got, b.N*benchRoundMsgs)
	}
}

// processCPU is the user+system CPU this process has used.
func processCPU() time.Duration {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		return 0
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

// postgresCPU returns a reader of the CPU used so far by the package's
// private PostgreSQL server (postmaster and its children); it reads 0 when
// the server is external or /proc is unavailable. The processes are listed
// when the reader is made, so reading costs little: make a new one when
// backends may have started.
func postgresCPU(b *testing.B) func() time.Duration {
	c := pgtest.Cluster()
	none := func() time.Duration { return 0 }
	if c == nil {
		return none
	}
	pidFile, err := os.ReadFile(filepath.Join(c.Dir(), "postmaster.pid"))
	if err != nil {
		b.Logf("postgres CPU not measured: %v", err)
		return none
	}
	postmaster := strings.SplitN(string(pidFile), "\n", 2)[0]
	var stats []string
	all, _ := filepath.Glob("/proc/[0-9]*/stat")
	for _, p := range all {
		pid := strings.TrimSuffix(strings.TrimPrefix(p, "/proc/"), "/stat")
		if f := procStat(p); pid == postmaster || (len(f) > 1 && f[1] == postmaster) {
			stats = append(stats, p)
		}
	}
	const ticksPerSecond = 100 // USER_HZ on Linux
	return func() time.Duration {
		var ticks int64
		for _, p := range stats {
			if f := procStat(p); len(f) > 12 {
				ut, _ := strconv.ParseInt(f[11], 10, 64)
				st, _ := strconv.ParseInt(f[12], 10, 64)
				ticks += ut + st
			}
		}
		return time.Duration(ticks) * time.Second / ticksPerSecond
	}
}

// procStat reads the fields of a /proc/<pid>/stat file that follow the
// command name: state, ppid, ..., utime (index 11), stime (12).
func procStat(path string) []string {
	raw, err := os.ReadFile(path)
	if err != nil {
		return nil
	}
	i := bytes.LastIndexByte(raw, ')')
	if i < 0 {
		return nil
	}
	return strings.Fields(string(raw[i+1:]))
}
