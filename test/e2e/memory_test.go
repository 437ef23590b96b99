package e2e_test

import (
	"bufio"
	"context"
	"fmt"
	"os"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/forwarder/forwarder/internal/dev/eventgen"
	"github.com/forwarder/forwarder/internal/testsupport/bigmsg"
	"github.com/forwarder/forwarder/internal/testsupport/kafkatest"
)

// memoryBound is what the forwarder's resident size must stay under with
// 16 MiB messages and the shipped defaults (docs/configuration.md,
// "Memory"): about 800 MiB measured, the budgets being bytes (64 MiB of
// Kafka read-ahead, 64 MiB of rows held by the dispatcher). Bounds by row
// counts (1024 records read ahead per partition, claims of 300 rows, 600
// held) would let the 30 messages below, 480 MiB, be held several times
// over at once: gigabytes.
const memoryBound = 1 << 30

// chartGoMemLimit is the GOMEMLIMIT the Helm chart sets by default (70 % of
// its memory, 1Gi; deploy/validate checks that they agree). The memory tests
// run with it: the collector then lets the heap grow further than with the
// binary's own 100MiB, so the peak is the one a pod of the chart reaches.
const chartGoMemLimit = "716MiB"

// TestMemoryBoundedByBytes streams 30 messages of 16 MiB through the
// forwarder while the platform hangs, so that they all reach PostgreSQL
// while the dispatcher holds what its byte budget allows and requests wait
// at the platform, then lets the platform answer until everything is
// delivered. The forwarder's peak resident size (VmHWM, the kernel's
// high-water mark) must stay under memoryBound, with the chart's GOMEMLIMIT.
func TestMemoryBoundedByBytes(t *testing.T) {
	scenario(t, alone, 60*time.Second)
	s := newStack(t, stackOptions{env: map[string]string{
		// A 16 MiB request takes a moment on a loaded machine.
		"FORWARD_TIMEOUT": "10s",
		"CLAIM_LEASE":     "30s",
		"LOG_LEVEL":       "WARN",
		"GOMEMLIMIT":      chartGoMemLimit,
	}})
	const n = 30
	s.platform.Hang()
	p := s.start("forwarder", nil)

	src := s.newSource(eventgen.SourceConfig{})
	for range n {
		m, err := bigmsg.Vehicle(src, bigmsg.Size)
		if err != nil {
			t.Fatal(err)
		}
		rec := &kgo.Record{Topic: m.Topic, Key: m.Key, Value: m.Value}
		s.produceRecords(rec)
		s.exp.add(m, rec)
	}
	s.waitUntil(fmt.Sprintf("all %d messages in PostgreSQL while the platform hangs", n), 5*time.Minute, func(ctx context.Context) (bool, string) {
		c, err := s.rowCounts(ctx)
		if err != nil {
			return false, err.Error()
		}
		return total(c) >= n, fmt.Sprintf("rows %v, platform %+v", c, s.platform.Stats())
	})
	hung := s.platform.Stats()
	atOutage, err := procStatusBytes(p.Pid(), "VmHWM")
	if err != nil {
		t.Fatal(err)
	}
	s.platform.Release()
	s.waitSettled(5 * time.Minute)
	peak, err := procStatusBytes(p.Pid(), "VmHWM")
	if err != nil {
		t.Fatal(err)
	}
	r := s.verify()
	if st := s.platform.Stats(); st.BadRequests > 0 {
		t.Errorf("the platform refused %d requests as malformed or too large", st.BadRequests)
	}
	t.Logf("%d messages of %.1f MiB (%.0f MiB in all): peak RSS %.0f MiB (%.0f MiB by the time all were in PostgreSQL, %d requests hanging at the platform); bound %.0f MiB; %s",
		n, float64(bigmsg.Size)/(1<<20), float64(n*bigmsg.Size)/(1<<20), float64(peak)/(1<<20), float64(atOutage)/(1<<20),
		hung.Hung, float64(memoryBound)/(1<<20), r)
	if peak >= memoryBound {
		t.Errorf("the forwarder's peak resident size was %.0f MiB with %d messages of 16 MiB, want under %.0f MiB: something holds messages by count, not by bytes",
			float64(peak)/(1<<20), n, float64(memoryBound)/(1<<20))
	}
}

// TestDecompressionBomb writes two record batches of about a MiB or less
// holding 1000 MiB of zeros each, compressed with zstd and with gzip as
// franz-go's producer compresses them, to two partitions, then 300 ordinary
// messages over every partition, and runs the forwarder with the shipped
// pipeline, its defaults and the chart's GOMEMLIMIT (docs/guarantees.md
// #17). The ordinary messages are all delivered, each bomb is one FAILED row under
// its fallback key with no payload and a reason naming the bound, and the
// forwarder's peak resident size stays under 1 GiB: no bomb was
// decompressed past 64 MiB, four times the 16 MiB message limit. Before the
// bound, franz-go's 1 GiB default let each bomb through whole: the
// forwarder held gigabytes, and its insert of a 1000 MiB payload timed out
// and was retried forever, so nothing behind the bombs was consumed.
func TestDecompressionBomb(t *testing.T) {
	scenario(t, alone, 8*time.Second)
	s := newStack(t, stackOptions{env: map[string]string{"LOG_LEVEL": "WARN", "GOMEMLIMIT": chartGoMemLimit}})
	const bombSize = 1000 << 20
	for partition, codec := range []kafkatest.Codec{kafkatest.Zstd, kafkatest.Gzip} {
		offset := s.kafka.ProduceBomb(t, topicVehicle, int32(partition), bombSize, codec)
		at := coord{topicVehicle, int32(partition), offset}
		s.exp.addBad(badMsg{at: at, flaw: "decompression bomb",
			reason: fmt.Sprintf("payload not stored: record batch at offset %d does not decompress within %d bytes", at.offset, 4*bigmsg.MaxSize)})
	}
	s.produce(s.newSource(eventgen.SourceConfig{}), 300)

	p := s.start("forwarder", nil)
	s.waitSettled(5 * time.Minute)
	peak, err := procStatusBytes(p.Pid(), "VmHWM")
	if err != nil {
		t.Fatal(err)
	}
	r := s.verify()
	var stored int
	if err := s.pool.QueryRow(t.Context(), `SELECT coalesce(sum(length(payload)), -1) FROM forward_records WHERE status = 'FAILED'`).Scan(&stored); err != nil {
		t.Fatal(err)
	}
	if stored != 0 {
		t.Errorf("the bombs' rows hold %d payload bytes, want none", stored)
	}
	t.Logf("two bombs of %d MiB and 300 ordinary messages: peak RSS %.0f MiB, bound %.0f MiB; %s",
		bombSize>>20, float64(peak)/(1<<20), float64(memoryBound)/(1<<20), r)
	if peak >= memoryBound {
		t.Errorf("the forwarder's peak resident size was %.0f MiB with two bombs of %d MiB, want under %.0f MiB",
			float64(peak)/(1<<20), bombSize>>20, float64(memoryBound)/(1<<20))
	}
}

// procStatusBytes reads a "Key: N kB" line of /proc/<pid>/status in bytes.
func procStatusBytes(pid int, key string) (int64, error) {
	f, err := os.Open(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		return 0, err
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		if rest, ok := strings.CutPrefix(sc.Text(), key+":"); ok {
			fields := strings.Fields(rest)
			if len(fields) == 2 && fields[1] == "kB" {
				v, err := strconv.ParseInt(fields[0], 10, 64)
				return v << 10, err
			}
		}
	}
	return 0, fmt.Errorf("/proc/%d/status has no %s line", pid, key)
}
