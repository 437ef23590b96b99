package main

import (
	"math"
	"slices"
	"strings"
	"testing"
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

// TestRoundsFlag: -rounds counts from 1 and repeats the throughput phases
// only, so a run without them cannot ask for rounds.
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

func TestRoundsFlag(t *testing.T) {
	if c, err := parseBenchFlags(nil); err != nil || c.Rounds != 1 {
		t.Fatalf("default: rounds %d, %v; want 1", c.Rounds, err)
	}
	if c, err := parseBenchFlags([]string{"-rounds", "4", "-phases", "throughput"}); err != nil || c.Rounds != 4 {
		t.Fatalf("-rounds 4: rounds %d, %v; want 4", c.Rounds, err)
	}
	for _, args := range [][]string{
		{"-rounds", "0"},
		{"-rounds", "-1"},
		{"-rounds", "2", "-phases", "latency"},
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
	for _, want := range []string{
		"| | forwarder, round 1 | forwarder, ORDERING=off, round 1 | hand-batched (500, 64 POSTs), round 1 | hand-batched (500, 64 POSTs), round 2 |",
		// Within each round: 4000/5000, 5000/5000, 1, then 1, 4000/4000, 4800/4000.
		"| × hand-batched | 0.80 | 1.00 | 1.00 | 1.00 | 1.00 | 1.20 |",
		"### Over 2 rounds",
		"| forwarder | 4000, 4800 | **4400** | 0.80, 1.20 | **1.00** |",
		"| forwarder, ORDERING=off | 5000, 4000 | **4500** | 1.00, 1.00 | **1.00** |",
	} {
		if !strings.Contains(md, want) {
			t.Errorf("the report lacks %q:\n%s", want, md)
		}
	}
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
	for _, want := range []string{"| | forwarder | hand-batched (500, 64 POSTs) |", "| × hand-batched | 0.90 | 1.00 |"} {
		if !strings.Contains(md, want) {
			t.Errorf("the report lacks %q:\n%s", want, md)
		}
	}
	if strings.Contains(md, "round") {
		t.Errorf("a one-round report names rounds:\n%s", md)
	}
}
