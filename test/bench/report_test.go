package main

import (
	"math"
	"slices"
	"strings"
	"testing"
	"time"
)

func TestRoundOrder(t *testing.T) {
	scenarios := []string{scenarioForwarder, scenarioBatched, scenarioRiver}
	for round, want := range map[int][]string{
		1: {scenarioForwarder, scenarioBatched, scenarioRiver},
		2: {scenarioRiver, scenarioBatched, scenarioForwarder},
		3: {scenarioForwarder, scenarioBatched, scenarioRiver},
		4: {scenarioRiver, scenarioBatched, scenarioForwarder},
	} {
		if got := roundOrder(scenarios, round); !slices.Equal(got, want) {
			t.Errorf("round %d: %v, want %v", round, got, want)
		}
	}
	if scenarios[0] != scenarioForwarder {
		t.Errorf("roundOrder reversed the configuration's own list: %v", scenarios)
	}
}

// TestDefaultScenarios: a run without -scenarios measures every ratio the
// targets name (docs/benchmarks.md): the forwarder with ordering on and
// off, against the naive, hand-batched and River baselines.
func TestDefaultScenarios(t *testing.T) {
	c, err := parseBenchFlags(nil)
	if err != nil {
		t.Fatal(err)
	}
	want := []string{scenarioForwarder, scenarioUnordered, scenarioNaive, scenarioBatched, scenarioRiver}
	if !slices.Equal(c.Scenarios, want) {
		t.Errorf("default scenarios %v, want %v", c.Scenarios, want)
	}
}

// TestRoundsFlag: -rounds and -latency-rounds count from 1, and each
// repeats its own phases, so a run without them cannot ask for their rounds.
func TestRoundsFlag(t *testing.T) {
	if c, err := parseBenchFlags(nil); err != nil || c.Rounds != 1 {
		t.Fatalf("default: rounds %d, %v; want 1", c.Rounds, err)
	}
	if c, err := parseBenchFlags([]string{"-rounds", "4", "-phases", "throughput"}); err != nil || c.Rounds != 4 {
		t.Fatalf("-rounds 4: rounds %d, %v; want 4", c.Rounds, err)
	}
	if c, err := parseBenchFlags([]string{"-latency-rounds", "3", "-phases", "latency"}); err != nil || c.LatencyRounds != 3 || c.Rounds != 1 {
		t.Fatalf("-latency-rounds 3: rounds %d and %d, %v; want 1 and 3", c.Rounds, c.LatencyRounds, err)
	}
	for _, args := range [][]string{
		{"-rounds", "0"},
		{"-rounds", "-1"},
		{"-rounds", "2", "-phases", "latency"},
		{"-latency-rounds", "0"},
		{"-latency-rounds", "2", "-phases", "throughput"},
	} {
		if _, err := parseBenchFlags(args); err == nil {
			t.Errorf("%v accepted", args)
		}
	}
}

// TestThroughputRunNames: every round of a scenario has a database and a
// consumer group of its own, and the database's name ends with the
// scenario, which decides its schema (migrate).
func TestThroughputRunNames(t *testing.T) {
	runs, groups := map[string]bool{}, map[string]bool{}
	for _, s := range []string{scenarioForwarder, scenarioUnordered, scenarioNaive, scenarioBatched, scenarioRiver, scenarioPrevious} {
		for round := 1; round <= 3; round++ {
			run, group := throughputRun(s, round)
			if !strings.HasSuffix(run, "_"+s) {
				t.Errorf("round %d of %s: database %q does not end with _%s", round, s, run, s)
			}
			if runs[run] || groups[group] {
				t.Errorf("round %d of %s: database %q or group %q used twice", round, s, run, group)
			}
			runs[run], groups[group] = true, true
		}
	}
}

// TestLatencyRunNames: every round of a latency phase has a database, a
// consumer group, topics and sample files of its own, and the database's
// name ends with the scenario, which decides its schema (migrate).
func TestLatencyRunNames(t *testing.T) {
	seen := map[string]bool{}
	for _, s := range []string{scenarioForwarder, scenarioUnordered, scenarioNaive, scenarioBatched, scenarioRiver, scenarioPrevious} {
		for round := 1; round <= 3; round++ {
			run, group, name := latencyRun(s, round)
			if !strings.HasSuffix(run, "_"+s) {
				t.Errorf("round %d of %s: database %q does not end with _%s", round, s, run, s)
			}
			tp, _ := throughputRun(s, round)
			for _, n := range []string{"db " + run, "group " + group, "name " + name} {
				if seen[n] || n == "db "+tp {
					t.Errorf("round %d of %s: %s used twice", round, s, n)
				}
				seen[n] = true
			}
		}
	}
	if _, _, name := latencyRun(scenarioForwarder, 1); name != scenarioForwarder {
		t.Errorf("round 1 names its files %q, want %q as before rounds", name, scenarioForwarder)
	}
}

func TestMedian(t *testing.T) {
	for _, c := range []struct {
		xs   []float64
		want float64
	}{
		{[]float64{0.9}, 0.9},
		{[]float64{1.4, 0.8, 1.2}, 1.2},
		{[]float64{1.4, 0.6, 1.2, 0.8}, 1.0},
	} {
		if got := median(c.xs); math.Abs(got-c.want) > 1e-9 {
			t.Errorf("median(%v) = %v, want %v", c.xs, got, c.want)
		}
	}
	if got := median(nil); !math.IsNaN(got) {
		t.Errorf("median of nothing = %v, want NaN", got)
	}
}

// TestRoundsReport: with several rounds each ratio is taken within its
// round, and the summary gives the ratios round by round and their median.
func TestRoundsReport(t *testing.T) {
	cfg := benchConfig{Scenarios: []string{scenarioForwarder, scenarioUnordered, scenarioBatched}, Rounds: 2, BatchSize: 500, BatchPosts: 64}
	phase := func(s string, round int, rate float64) throughputResult {
		return throughputResult{Scenario: s, Round: round, Messages: 1000, MsgsPerSec: rate}
	}
	r := &report{cfg: cfg, throughput: []throughputResult{
		phase(scenarioForwarder, 1, 4000), phase(scenarioUnordered, 1, 5000), phase(scenarioBatched, 1, 5000),
		phase(scenarioBatched, 2, 4000), phase(scenarioUnordered, 2, 4000), phase(scenarioForwarder, 2, 4800),
	}}
	md := r.markdown()
	reportHas(t, md,
		"| | forwarder, round 1 | forwarder, ORDERING=off, round 1 | hand-batched (500, 64 POSTs), round 1 | hand-batched (500, 64 POSTs), round 2 |",
		// Within each round: 4000/5000, 5000/5000, 1, then 1, 4000/4000, 4800/4000.
		"| × hand-batched | 0.80 | 1.00 | 1.00 | 1.00 | 1.00 | 1.20 |",
		"### Over 2 rounds",
		"| forwarder | 4000, 4800 | **4400** | 0.80, 1.20 | **1.00** |",
		"| forwarder, ORDERING=off | 5000, 4000 | **4500** | 1.00, 1.00 | **1.00** |",
	)
	// Ordered over unordered: 0.80 in round 1, 1.20 in round 2.
	if got, want := orderingSummary(r), "round by round: 0.80, 1.20; median **1.00×**"; !strings.Contains(got, want) {
		t.Errorf("the ordering summary lacks %q:\n%s", want, got)
	}
}

// TestOneRoundReport: a run of one round reads as before, with no round in
// the titles and no summary.
func TestOneRoundReport(t *testing.T) {
	cfg := benchConfig{Scenarios: []string{scenarioForwarder, scenarioBatched}, Rounds: 1, BatchSize: 500, BatchPosts: 64}
	r := &report{cfg: cfg, throughput: []throughputResult{
		{Scenario: scenarioForwarder, Round: 1, Messages: 1000, MsgsPerSec: 4500},
		{Scenario: scenarioBatched, Round: 1, Messages: 1000, MsgsPerSec: 5000},
	}}
	md := r.markdown()
	reportHas(t, md, "| | forwarder | hand-batched (500, 64 POSTs) |", "| × hand-batched | 0.90 | 1.00 |")
	if strings.Contains(md, "round") {
		t.Errorf("a one-round report names rounds:\n%s", md)
	}
}

// TestLatencyRoundsReport: with several latency rounds each phase's row
// names its round, the summary gives p50, p99 and max round by round with
// their medians, and the ordering summary compares the medians.
func TestLatencyRoundsReport(t *testing.T) {
	cfg := benchConfig{Scenarios: []string{scenarioForwarder, scenarioUnordered}, Rounds: 1, LatencyRounds: 2, Rate: 2000}
	phase := func(s string, round int, p50, p99, maxMs float64) latencyResult {
		d := func(v float64) time.Duration { return time.Duration(v * float64(time.Millisecond)) }
		return latencyResult{Scenario: s, Round: round, Rate: 2000, Messages: 1000, P50: d(p50), P99: d(p99), Max: d(maxMs)}
	}
	r := &report{cfg: cfg, latency: []latencyResult{
		phase(scenarioForwarder, 1, 10, 40, 90), phase(scenarioUnordered, 1, 8, 30, 70),
		phase(scenarioUnordered, 2, 6, 20, 50), phase(scenarioForwarder, 2, 12, 60, 110),
	}}
	md := r.markdown()
	reportHas(t, md,
		"| forwarder, round 1 | 10.0 ms |",
		"| forwarder, ORDERING=off, round 2 | 6.0 ms |",
		"### Latency over 2 rounds",
		"| forwarder | 10.0 ms, 12.0 ms | 11.0 ms | 40.0 ms, 60.0 ms | **50.0 ms** | 90.0 ms, 110.0 ms | 100.0 ms |",
		"| forwarder, ORDERING=off | 8.0 ms, 6.0 ms | 7.0 ms | 30.0 ms, 20.0 ms | **25.0 ms** | 70.0 ms, 50.0 ms | 60.0 ms |",
	)
	want := "p50 11.0 ms / 7.0 ms, p99 **50.0 ms** / 25.0 ms, max 100.0 ms / 60.0 ms (ordered / unordered, medians of 2 rounds)"
	if got := orderingSummary(r); !strings.Contains(got, want) {
		t.Errorf("the ordering summary lacks %q:\n%s", want, got)
	}

	// One round reads as before: no round in the titles, no summary.
	r.cfg.LatencyRounds = 1
	r.latency = r.latency[:2]
	md = r.markdown()
	if strings.Contains(md, "round") {
		t.Errorf("a one-round report names rounds:\n%s", md)
	}
	want = "p50 10.0 ms / 8.0 ms, p99 **40.0 ms** / 30.0 ms, max 90.0 ms / 70.0 ms (ordered / unordered)."
	if got := orderingSummary(r); !strings.Contains(got, want) {
		t.Errorf("the ordering summary lacks %q:\n%s", want, got)
	}
}

// reportHas fails t for each of wants that md lacks.
func reportHas(t *testing.T, md string, wants ...string) {
	t.Helper()
	for _, want := range wants {
		if !strings.Contains(md, want) {
			t.Errorf("the report lacks %q:\n%s", want, md)
		}
	}
}
