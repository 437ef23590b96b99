package main

import (
	"bufio"
	"context"
	"fmt"
	"os"
	"runtime/metrics"
	"strings"
	"sync"
	"time"

	"github.com/jackc/pgx/v5"
)

// activitySampler records, every 50 ms of a latency phase, what
// PostgreSQL's backends wait for (pg_stat_activity, read on one open
// connection so that sampling costs one query, not a process), the
// kernel's dirty and writeback pages, and this process's garbage
// collections: the context for the stalls seen in -latency-samples.
type activitySampler struct {
	cancel context.CancelFunc
	done   chan error
	once   sync.Once
	err    error
}

// activityQuery lists the backends doing or waiting for something, the
// sampler's own aside.
const activityQuery = `
SELECT pid, coalesce(datname, ''), backend_type, coalesce(state, ''),
       coalesce(wait_event_type, ''), coalesce(wait_event, ''),
       left(regexp_replace(coalesce(query, ''), '\s+', ' ', 'g'), 60)
FROM pg_stat_activity
WHERE pid <> pg_backend_pid()
  AND (state = 'active' OR (state IS NULL AND wait_event_type IS DISTINCT FROM 'Activity'))`

// startActivitySampler writes path: one line per busy backend and sample,
// and one "host" line per sample (nr_dirty, nr_writeback, this process's
// GC cycles so far).
func startActivitySampler(ctx context.Context, dsn, path string) (*activitySampler, error) {
	conn, err := pgx.Connect(ctx, dsn)
	if err != nil {
		return nil, err
	}
	f, err := os.Create(path)
	if err != nil {
		conn.Close(ctx)
		return nil, err
	}
	ctx, cancel := context.WithCancel(ctx)
	s := &activitySampler{cancel: cancel, done: make(chan error, 1)}
	go func() {
		defer conn.Close(context.WithoutCancel(ctx))
		w := bufio.NewWriter(f)
		fmt.Fprintln(w, "unix_ms\tpid\tdatname\tbackend_type\tstate\twait_event_type\twait_event\tquery")
		tick := time.NewTicker(50 * time.Millisecond)
		defer tick.Stop()
		var first error
		for {
			select {
			case <-ctx.Done():
				if err := w.Flush(); first == nil {
					first = err
				}
				if err := f.Close(); first == nil {
					first = err
				}
				s.done <- first
				return
			case <-tick.C:
			}
			if err := sampleActivity(ctx, conn, w); err != nil && first == nil && ctx.Err() == nil {
				first = err
			}
		}
	}()
	return s, nil
}

// sampleActivity writes one sample.
func sampleActivity(ctx context.Context, conn *pgx.Conn, w *bufio.Writer) error {
	now := time.Now().UnixMilli()
	gc := []metrics.Sample{{Name: "/gc/cycles/total:gc-cycles"}}
	metrics.Read(gc)
	dirty, writeback := vmstatPages()
	fmt.Fprintf(w, "%d\t0\t\thost\t\t\t\tdirty=%d writeback=%d gc=%d\n", now, dirty, writeback, gc[0].Value.Uint64())
	rows, err := conn.Query(ctx, activityQuery)
	if err != nil {
		return err
	}
	defer rows.Close()
	for rows.Next() {
		var pid int
		var db, typ, state, wtype, wevent, query string
		if err := rows.Scan(&pid, &db, &typ, &state, &wtype, &wevent, &query); err != nil {
			return err
		}
		fmt.Fprintf(w, "%d\t%d\t%s\t%s\t%s\t%s\t%s\t%s\n", now, pid, db, typ, state, wtype, wevent, query)
	}
	return rows.Err()
}

// stop ends the sampling and returns its first error; it may be called
// again.
func (s *activitySampler) stop() error {
	s.once.Do(func() {
		s.cancel()
		s.err = <-s.done
	})
	return s.err
}

// vmstatPages returns the kernel's dirty and under-writeback page counts.
func vmstatPages() (dirty, writeback int64) {
	b, err := os.ReadFile("/proc/vmstat")
	if err != nil {
		return -1, -1
	}
	for _, line := range strings.Split(string(b), "\n") {
		if v, ok := strings.CutPrefix(line, "nr_dirty "); ok {
			fmt.Sscan(v, &dirty)
		} else if v, ok := strings.CutPrefix(line, "nr_writeback "); ok {
			fmt.Sscan(v, &writeback)
		}
	}
	return dirty, writeback
}
