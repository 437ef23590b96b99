package main

import (
	"fmt"
	"math"
	"slices"
	"strings"
	"time"
)

// report collects a run's results and writes them as markdown.
type report struct {
	cfg                   benchConfig
	machine               string
	loadBefore, loadAfter float64
	ceilings              ceilings
	throughput            []throughputResult
	latency               []latencyResult
}

var scenarioTitles = map[string]string{
	scenarioForwarder: "forwarder",
	scenarioNaive:     "naive",
	scenarioBatched:   "hand-batched",
}

func (r *report) title(s string) string {
	switch s {
	case scenarioNaive:
		return fmt.Sprintf("naive (%d workers)", r.cfg.NaiveWorkers)
	case scenarioBatched:
		return fmt.Sprintf("hand-batched (%d, %d POSTs)", r.cfg.BatchSize, r.cfg.BatchPosts)
	case scenarioRiver:
		return fmt.Sprintf("River (%d workers)", r.cfg.RiverWorkers)
	}
	return scenarioTitles[s]
}

// baselines are the scenarios the others are given as multiples of.
var baselines = []string{scenarioNaive, scenarioBatched, scenarioRiver}

// phaseTitle names a throughput phase: its scenario, and its round when
// there are several.
func (r *report) phaseTitle(t throughputResult) string {
	if r.cfg.Rounds > 1 {
		return fmt.Sprintf("%s, round %d", r.title(t.Scenario), t.Round)
	}
	return r.title(t.Scenario)
}

// phase is the throughput phase of scenario in round.
func (r *report) phase(scenario string, round int) (throughputResult, bool) {
	for _, t := range r.throughput {
		if t.Scenario == scenario && t.Round == round {
			return t, true
		}
	}
	return throughputResult{}, false
}

// roundRatios is a's throughput over b's in each round both ran in.
func (r *report) roundRatios(a, b string) []float64 {
	var out []float64
	for round := 1; round <= r.cfg.Rounds; round++ {
		at, aok := r.phase(a, round)
		bt, bok := r.phase(b, round)
		if aok && bok {
			out = append(out, at.MsgsPerSec/bt.MsgsPerSec)
		}
	}
	return out
}

// latencyMedians is the median over the rounds of scenario's latency phases
// of their p50, p99 and max; ok is false when it had none.
func (r *report) latencyMedians(scenario string) (p50, p99, maxLat time.Duration, ok bool) {
	var p50s, p99s, maxs []float64
	for _, l := range r.latency {
		if l.Scenario == scenario {
			p50s, p99s, maxs = append(p50s, float64(l.P50)), append(p99s, float64(l.P99)), append(maxs, float64(l.Max))
		}
	}
	if len(p50s) == 0 {
		return 0, 0, 0, false
	}
	return time.Duration(median(p50s)), time.Duration(median(p99s)), time.Duration(median(maxs)), true
}

// latencyRoundsSummary gives each scenario's p50, p99 and max round by
// round, with their medians.
func (r *report) latencyRoundsSummary() string {
	var b strings.Builder
	fmt.Fprintf(&b, "\n### Latency over %d rounds (odd rounds in the order given, even rounds reversed)\n\n", r.cfg.LatencyRounds)
	b.WriteString("| | p50, round by round | median | p99, round by round | median | max, round by round | median |\n|---|---|---:|---|---:|---|---:|\n")
	for _, s := range r.cfg.Scenarios {
		var rounds []latencyResult
		for _, l := range r.latency {
			if l.Scenario == s {
				rounds = append(rounds, l)
			}
		}
		if len(rounds) == 0 {
			continue
		}
		slices.SortFunc(rounds, func(a, b latencyResult) int { return a.Round - b.Round })
		each := func(get func(latencyResult) time.Duration) string {
			parts := make([]string, len(rounds))
			for i, l := range rounds {
				parts[i] = ms(get(l))
			}
			return strings.Join(parts, ", ")
		}
		p50, p99, maxLat, _ := r.latencyMedians(s)
		fmt.Fprintf(&b, "| %s | %s | %s | %s | **%s** | %s | %s |\n", r.title(s),
			each(func(l latencyResult) time.Duration { return l.P50 }), ms(p50),
			each(func(l latencyResult) time.Duration { return l.P99 }), ms(p99),
			each(func(l latencyResult) time.Duration { return l.Max }), ms(maxLat))
	}
	return b.String()
}

// median of xs (the mean of the middle two for an even count); NaN for none.
func median(xs []float64) float64 {
	if len(xs) == 0 {
		return math.NaN()
	}
	s := slices.Sorted(slices.Values(xs))
	if len(s)%2 == 1 {
		return s[len(s)/2]
	}
	return (s[len(s)/2-1] + s[len(s)/2]) / 2
}

// joinFloats writes xs in format, separated by commas.
func joinFloats(xs []float64, format string) string {
	parts := make([]string, len(xs))
	for i, x := range xs {
		parts[i] = fmt.Sprintf(format, x)
	}
	return strings.Join(parts, ", ")
}

// roundsSummary gives each scenario's throughput and its ratios to the
// baselines round by round, with their medians: the figures to quote from
// a run of several rounds.
func (r *report) roundsSummary() string {
	var b strings.Builder
	fmt.Fprintf(&b, "\n### Over %d rounds (odd rounds in the order given, even rounds reversed)\n\n", r.cfg.Rounds)
	b.WriteString("| | msgs/s, round by round | median |")
	var bases []string
	for _, base := range baselines {
		if slices.Contains(r.cfg.Scenarios, base) {
			bases = append(bases, base)
			fmt.Fprintf(&b, " × %s, round by round | median |", scenarioTitles[base])
		}
	}
	b.WriteString("\n|---|---|---:|" + strings.Repeat("---|---:|", len(bases)) + "\n")
	for _, s := range r.cfg.Scenarios {
		var rates []float64
		for round := 1; round <= r.cfg.Rounds; round++ {
			if t, ok := r.phase(s, round); ok {
				rates = append(rates, t.MsgsPerSec)
			}
		}
		fmt.Fprintf(&b, "| %s | %s | **%.0f** |", r.title(s), joinFloats(rates, "%.0f"), median(rates))
		for _, base := range bases {
			if base == s {
				b.WriteString(" | |")
				continue
			}
			ratios := r.roundRatios(s, base)
			fmt.Fprintf(&b, " %s | **%.2f** |", joinFloats(ratios, "%.2f"), median(ratios))
		}
		b.WriteString("\n")
	}
	return b.String()
}

func (r *report) markdown() string {
	var b strings.Builder
	fmt.Fprintf(&b, "Machine: %s.\n", r.machine)
	fmt.Fprintf(&b, "Load average (1 min): %.2f before, %.2f after. PostgreSQL: %s. Kafka: kfake in the bench process, %d partitions per topic. Run at %s.\n",
		r.loadBefore, r.loadAfter, map[bool]string{true: "**durable**: fsync, full_page_writes and synchronous_commit on (production settings)", false: "**not durable** (-durable=false): fsync and full_page_writes off, as in the tests"}[r.cfg.Durable],
		r.cfg.Partitions, time.Now().UTC().Format("2006-01-02 15:04 UTC"))
	if len(r.cfg.PGSets) > 0 {
		fmt.Fprintf(&b, "PostgreSQL overrides: %s.\n", strings.Join(r.cfg.PGSets, ", "))
	}
	if r.cfg.Pooled {
		b.WriteString("Forwarder's database connection: **pooled mode** (-pooled: DATABASE_DIRECT_URL set, statements unnamed and planned at each execution).\n")
	}
	if len(r.cfg.Sets) > 0 || len(r.cfg.Env) > 0 {
		fmt.Fprintf(&b, "Forwarder overrides: %s.\n", strings.Join(append(append([]string{}, r.cfg.Sets...), r.cfg.Env...), ", "))
	}

	if len(r.throughput) > 0 {
		fmt.Fprintf(&b, "\n### Throughput: a Kafka backlog of %d messages until every row is SUCCESS\n\n", r.throughput[0].Messages)
		b.WriteString("| | ")
		for i, t := range r.throughput {
			if i > 0 {
				b.WriteString(" | ")
			}
			b.WriteString(r.phaseTitle(t))
		}
		b.WriteString(" |\n|---|")
		b.WriteString(strings.Repeat("---:|", len(r.throughput)))
		b.WriteString("\n")
		row := func(name string, f func(t throughputResult) string) {
			b.WriteString("| " + name + " |")
			for _, t := range r.throughput {
				b.WriteString(" " + f(t) + " |")
			}
			b.WriteString("\n")
		}
		row("**msgs/s**", func(t throughputResult) string { return fmt.Sprintf("**%.0f**", t.MsgsPerSec) })
		// A ratio is taken within a round: the machine's speed drifts.
		for _, base := range baselines {
			if slices.Contains(r.cfg.Scenarios, base) {
				row("× "+scenarioTitles[base], func(t throughputResult) string {
					bt, ok := r.phase(base, t.Round)
					if !ok {
						return "–"
					}
					return fmt.Sprintf("%.2f", t.MsgsPerSec/bt.MsgsPerSec)
				})
			}
		}
		row("first insert → last SUCCESS", func(t throughputResult) string { return fmt.Sprintf("%.1f s", t.Window.Seconds()) })
		row("consumer start → all SUCCESS seen", func(t throughputResult) string { return fmt.Sprintf("%.1f s", t.Wall.Seconds()) })
		row("consumer CPU", func(t throughputResult) string {
			return fmt.Sprintf("%.1f s (%.0f µs/msg)", t.Consumer.CPU, t.Consumer.CPU/float64(t.Messages)*1e6)
		})
		row("consumer peak RSS", func(t throughputResult) string { return mib(t.Consumer.PeakRSS) })
		row("PostgreSQL CPU", func(t throughputResult) string {
			return fmt.Sprintf("%.1f s (%.0f µs/msg)", t.PG.CPU, t.PG.CPU/float64(t.Messages)*1e6)
		})
		row("PostgreSQL peak PSS", func(t throughputResult) string { return mib(t.PG.PeakRSS) })
		row("commits / msg", func(t throughputResult) string {
			return fmt.Sprintf("%.3f", float64(t.PGWork.Commits)/float64(t.Messages))
		})
		row("WAL flushes (fsync) / msg", func(t throughputResult) string {
			return fmt.Sprintf("%.3f", float64(t.PGWork.WALSyncs)/float64(t.Messages))
		})
		row("WAL bytes / msg", func(t throughputResult) string {
			return fmt.Sprintf("%.0f", float64(t.PGWork.WALBytes)/float64(t.Messages))
		})
		row("broker + mock platform CPU", func(t throughputResult) string { return fmt.Sprintf("%.1f s", t.Self) })
		row("platform requests", func(t throughputResult) string { return fmt.Sprint(t.Requests) })
		row("other processes' CPU (disturbance)", func(t throughputResult) string {
			return fmt.Sprintf("%.1f s (%.2f cores)", t.Others, t.Others/t.Wall.Seconds())
		})
		row("load average, start → end", func(t throughputResult) string { return fmt.Sprintf("%.2f → %.2f", t.LoadStart, t.LoadEnd) })
	}

	if r.cfg.Rounds > 1 && len(r.throughput) > 0 {
		b.WriteString(r.roundsSummary())
	}

	if len(r.latency) > 0 {
		fmt.Fprintf(&b, "\n### Latency: produce → platform at a steady %.0f msgs/s (%s measured after %s of warm-up)\n\n",
			r.cfg.Rate, r.cfg.LatencyDuration, r.cfg.LatencyWarmup)
		b.WriteString("| | p50 | p90 | p99 | max | behind their berth's previous | p99 of those | p99 of the rest | consumer CPU | PostgreSQL CPU | consumer peak RSS | commits / msg | WAL flushes / msg | WAL bytes / msg | other processes | broker + mock + producer | load average |\n|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|\n")
		for _, l := range r.latency {
			per := func(v int64) float64 { return float64(v) / float64(max(l.Messages, 1)) }
			title := r.title(l.Scenario)
			if r.cfg.LatencyRounds > 1 {
				title = fmt.Sprintf("%s, round %d", title, l.Round)
			}
			fmt.Fprintf(&b, "| %s | %s | %s | %s | %s | %.2f %% | %s | %s | %.2f cores | %.2f cores | %s | %.3f | %.3f | %.0f | %.2f cores | %.2f cores | %.2f → %.2f |\n", title,
				ms(l.P50), ms(l.P90), ms(l.P99), ms(l.Max), 100*l.Behind, ms(l.P99Behind), ms(l.P99Free), l.Cores, l.PGCores, mib(l.PeakRSS),
				per(l.PGWork.Commits), per(l.PGWork.WALSyncs), per(l.PGWork.WALBytes), l.OtherCores, l.SelfCores, l.LoadStart, l.LoadEnd)
		}
	}

	if r.cfg.LatencyRounds > 1 && len(r.latency) > 0 {
		b.WriteString(r.latencyRoundsSummary())
	}

	if r.cfg.Ceilings {
		c := r.ceilings
		b.WriteString("\n### Ceilings of this machine\n\n| | |\n|---|---:|\n")
		fmt.Fprintf(&b, "| HTTP/1.1 loopback, 64 keep-alive clients → mock platform | %.0f req/s |\n", c.HTTPReqPerSec)
		fmt.Fprintf(&b, "| unnest insert (insert.sql), batches of 500, one connection | %.0f rows/s |\n", c.InsertRowsPerSec)
		fmt.Fprintf(&b, "| claim + record results (claim.sql, record.sql), batches of 500, one connection | %.0f rows/s |\n", c.ClaimRecordRowsPerSec)
	}

	stmts := func(title string, msgs int, ss []stmtStat) {
		if len(ss) == 0 {
			return
		}
		fmt.Fprintf(&b, "\n#### %s: top statements (pg_stat_statements)\n\n| calls | calls/msg | total ms | longest ms | rows | plans | planning ms | query |\n|---:|---:|---:|---:|---:|---:|---:|---|\n", title)
		for _, s := range ss {
			fmt.Fprintf(&b, "| %d | %.3f | %.0f | %.0f | %d | %d | %.0f | `%s` |\n", s.Calls, float64(s.Calls)/float64(msgs), s.TotalMs, s.MaxMs, s.Rows, s.Plans, s.PlanMs,
				strings.ReplaceAll(s.Query, "|", "\\|"))
		}
	}
	for _, t := range r.throughput {
		stmts(r.title(t.Scenario)+", throughput", t.Messages, t.Statements)
	}
	for _, l := range r.latency {
		title := fmt.Sprintf("%s at %.0f msgs/s", r.title(l.Scenario), l.Rate)
		if r.cfg.LatencyRounds > 1 {
			title = fmt.Sprintf("%s, round %d", title, l.Round)
		}
		stmts(title, l.Messages, l.Statements)
	}
	return b.String()
}
