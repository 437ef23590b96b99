// Package metricseries exports a component's metric series at 0 from the
// start, before their first event. A dashboard or an alert on
// rate(forwarder_attempts_total{outcome="no_retry"}[5m]) then has a series
// to read from the first scrape, instead of "no data" that looks like a
// broken exporter.
//
// The series are created through Benthos's own metric API, so that they
// carry the labels Benthos adds to every component metric (label, path).
// A histogram cannot be created without an observation through that API;
// this distribution's prometheus exporter takes a negative timing, which no
// measurement gives, as "create the series" and observes nothing.
package metricseries

import "github.com/redpanda-data/benthos/v4/public/service"

// Product returns every combination of the values of each label, in label
// order: Product([]string{"a", "b"}, []string{"x"}) is [a x], [b x].
func Product(values ...[]string) [][]string {
	out := [][]string{{}}
	for _, vs := range values {
		var next [][]string
		for _, prefix := range out {
			for _, v := range vs {
				next = append(next, append(append([]string{}, prefix...), v))
			}
		}
		out = next
	}
	return out
}

// Counter creates the series of c at 0; a label-less counter takes no
// series argument.
func Counter(c *service.MetricCounter, series ...[]string) {
	if len(series) == 0 {
		c.Incr(0)
	}
	for _, s := range series {
		c.Incr(0, s...)
	}
}

// Timer creates the series of t with no observation (see the package doc).
func Timer(t *service.MetricTimer, series ...[]string) {
	for _, s := range series {
		t.Timing(-1, s...)
	}
}
