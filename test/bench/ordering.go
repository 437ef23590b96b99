package main

import (
	"fmt"
	"strings"
)

// Ordering on against ordering off, in one run (docs/benchmarks.md,
// "Ordering"):
//
//	go run ./test/bench -scenarios forwarder,forwarder-unordered -berths 5000
//
// runs the shipped pipeline twice on the same backlog and at the same
// steady rate, with ORDERING=berth (its default) and with ORDERING=off, on
// traffic spread over -berths berths (four per camera), and prints the
// ratio of the two.

// scenarioUnordered is the forwarder with ORDERING=off.
const scenarioUnordered = "forwarder-unordered"

func init() {
	scenarioTitles[scenarioUnordered] = "forwarder, ORDERING=off"
}

// orderingEnv is what a forwarder scenario adds to the environment.
func orderingEnv(scenario string) map[string]string {
	if scenario == scenarioUnordered {
		return map[string]string{"ORDERING": "off"}
	}
	return nil
}

// sourceDevices is the number of cameras of the bench's traffic: -berths
// (four berths per camera) when set, else 500 (2 000 berths).
func sourceDevices(berths int) int {
	if berths > 0 {
		return (berths + 3) / 4
	}
	return 500
}

// orderingSummary compares the two forwarder scenarios when both ran: the
// throughput ratio and the latencies side by side, as markdown.
func orderingSummary(r *report) string {
	ratios := r.roundRatios(scenarioForwarder, scenarioUnordered)
	onP50, onP99, onMax, lonOK := r.latencyMedians(scenarioForwarder)
	offP50, offP99, offMax, loffOK := r.latencyMedians(scenarioUnordered)
	if len(ratios) == 0 && !(lonOK && loffOK) {
		return ""
	}
	var b strings.Builder
	fmt.Fprintf(&b, "\n### Ordering: ORDERING=berth against ORDERING=off, %d berths\n\n", sourceDevices(r.cfg.Berths)*4)
	switch {
	case len(ratios) == 1:
		on, _ := r.phase(scenarioForwarder, 1)
		off, _ := r.phase(scenarioUnordered, 1)
		fmt.Fprintf(&b, "Throughput: %.0f msgs/s ordered, %.0f unordered: **%.2f×**.\n", on.MsgsPerSec, off.MsgsPerSec, ratios[0])
	case len(ratios) > 1:
		fmt.Fprintf(&b, "Throughput, ordered over unordered, round by round: %s; median **%.2f×**.\n", joinFloats(ratios, "%.2f"), median(ratios))
	}
	if lonOK && loffOK {
		over := ""
		if r.cfg.LatencyRounds > 1 {
			over = fmt.Sprintf(", medians of %d rounds", r.cfg.LatencyRounds)
		}
		fmt.Fprintf(&b, "Latency at %.0f msgs/s: p50 %s / %s, p99 **%s** / %s, max %s / %s (ordered / unordered%s).\n",
			r.cfg.Rate, ms(onP50), ms(offP50), ms(onP99), ms(offP99), ms(onMax), ms(offMax), over)
	}
	return b.String()
}
