package devstack

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/forwarder/forwarder/internal/plural"
)

// Event is something a forwarder of the stack did that the screen shows
// between the progress lines: a mapping reloaded or rejected, Kafka
// partitions assigned or revoked, what a stopping forwarder waits for.
type Event struct {
	At   time.Time
	Text string
}

// eventBuffer bounds the events waiting for the screen; past it they are
// dropped (the log file has them all).
const eventBuffer = 64

// emit queues an event for the screen without ever blocking the forwarder's
// output.
func (s *Stack) emit(text string) {
	select {
	case s.events <- Event{At: time.Now(), Text: text}:
	default:
	}
}

// Follow prints the events to w as they come, prefixed with "devstack: ",
// until the returned function is called; Run prints them itself. It is for
// the time Run does not run: while the stack stops.
func (s *Stack) Follow(w io.Writer) (stop func()) {
	done, stopped := make(chan struct{}), make(chan struct{})
	go func() {
		defer close(stopped)
		for {
			select {
			case e := <-s.events:
				fmt.Fprintf(w, "devstack: %s\n", e.Text)
			case <-done:
				return
			}
		}
	}()
	var once sync.Once
	return func() { once.Do(func() { close(done); <-stopped }) }
}

// logWatcher reads one forwarder's output (logfmt lines, as
// pipelines/forwarder.yaml logs) and turns the lines the screen shows into
// events. One per process, so that lines never interleave.
type logWatcher struct {
	s       *Stack
	partial []byte
}

func (lw *logWatcher) Write(p []byte) (int, error) {
	lw.partial = append(lw.partial, p...)
	for {
		i := bytes.IndexByte(lw.partial, '\n')
		if i < 0 {
			break
		}
		lw.s.onLogLine(parseLogfmt(string(lw.partial[:i])))
		lw.partial = lw.partial[i+1:]
	}
	// A line longer than this is not one the screen shows.
	if len(lw.partial) > 1<<20 {
		lw.partial = lw.partial[:0]
	}
	return len(p), nil
}

// onLogLine emits the event of a log line, if it is one the screen shows.
// The plugins log these with fields meant for it: mapping_reload
// (plugins/mapping), kafka_rebalance (plugins/kafka).
func (s *Stack) onLogLine(f map[string]string) {
	switch {
	case f["mapping_reload"] == "success":
		s.emit(fmt.Sprintf("mapping %s reloaded (sha256 %s)", f["mapping_file"], f["sha256"]))
	case f["mapping_reload"] == "rejected":
		s.emit(fmt.Sprintf("mapping %s rejected: %s; still serving the previous version", f["mapping_file"], f["error"]))
	case f["kafka_rebalance"] != "":
		// The group is described off the forwarder's output path.
		go s.emitRebalance(f["kafka_rebalance"], f["kafka_group"], f["kafka_partitions"])
	case strings.HasPrefix(f["msg"], "Shutting down: ") || strings.HasPrefix(f["msg"], "kafka_franz: committing the final offsets"):
		s.emit("forwarder: " + f["msg"])
	}
}

// emitRebalance says what a rebalance did to the forwarder, and why as far
// as the broker tells: the group's members once it settled, against the
// forwarders the stack started (one started by hand with the stack's
// KAFKA_GROUP takes partitions from them).
func (s *Stack) emitRebalance(what, group, parts string) {
	s.mu.Lock()
	stopping := s.stopped
	s.mu.Unlock()
	switch {
	case what == "revoked" && stopping:
		s.emit("kafka: the forwarder gave up " + parts + " (it is stopping)")
		return
	case what == "lost":
		s.emit("kafka: the forwarder lost " + parts + " (its session expired); they are read again from the last commit")
		return
	}
	text := "kafka: the forwarder now consumes " + parts
	if what == "revoked" {
		text = "kafka: the forwarder gave up " + parts
	}
	if members, err := s.groupMembers(group); err == nil {
		text += "; group " + group + " has " + members
	} else {
		text += " (the group rebalances: a member joined or left)"
	}
	s.emit(text)
}

// groupMembers describes the members of group once its rebalance is over
// (10 s at most), against the forwarders the stack runs.
func (s *Stack) groupMembers(group string) (string, error) {
	cl, err := kgo.NewClient(kgo.SeedBrokers(s.Brokers...))
	if err != nil {
		return "", err
	}
	defer cl.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	adm := kadm.NewClient(cl)
	var g kadm.DescribedGroup
	for {
		described, err := adm.DescribeGroups(ctx, group)
		if err != nil {
			return "", err
		}
		var ok bool
		if g, ok = described[group]; !ok || g.Err != nil {
			return "", fmt.Errorf("describing group %s: %v", group, g.Err)
		}
		if g.State == "Stable" {
			break
		}
		select {
		case <-ctx.Done():
			return "", ctx.Err()
		case <-time.After(200 * time.Millisecond):
		}
	}
	n := len(g.Members)
	s.mu.Lock()
	ours := 0
	for _, f := range s.forwarders {
		if !f.proc.Exited() {
			ours++
		}
	}
	s.mu.Unlock()
	text := plural.Count(n, "member", "members")
	if extra := n - ours; extra > 0 {
		text += fmt.Sprintf(", %d more than the dev stack started (a forwarder started by hand with KAFKA_GROUP=%s?)", extra, group)
	}
	return text, nil
}

// parseLogfmt reads one logfmt line (key=value pairs, values quoted with
// Go's escapes when they hold spaces) into a map; what it cannot read is
// left out.
func parseLogfmt(line string) map[string]string {
	f := map[string]string{}
	for line != "" {
		line = strings.TrimLeft(line, " ")
		eq := strings.IndexByte(line, '=')
		if eq <= 0 {
			return f
		}
		key := line[:eq]
		if strings.ContainsAny(key, " \"") {
			return f
		}
		line = line[eq+1:]
		if strings.HasPrefix(line, `"`) {
			end := 1
			for end < len(line) && line[end] != '"' {
				if line[end] == '\\' {
					end++
				}
				end++
			}
			if end >= len(line) {
				return f
			}
			v, err := strconv.Unquote(line[:end+1])
			if err != nil {
				return f
			}
			f[key] = v
			line = line[end+1:]
			continue
		}
		end := strings.IndexByte(line, ' ')
		if end < 0 {
			end = len(line)
		}
		f[key] = line[:end]
		line = line[end:]
	}
	return f
}
