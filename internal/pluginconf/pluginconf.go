// Package pluginconf reads the fields of a plugin's parsed config without an
// error check after each one: the first error is kept and the reads after it
// do nothing, as a bufio.Writer keeps its first write error. A constructor
// reads every field, checks the one error, then validates the values. It
// also holds the bounds a plugin's field and the environment variable that
// sets it share (internal/envcheck checks the variables).
package pluginconf

import "time"

// Field reads the field at path with read, a method value of the parsed
// config such as conf.FieldInt or conf.Namespace("retry").FieldDuration.
// When *err already holds an error it reads nothing; a failed read stores
// its error in *err. It returns the value read, or T's zero value.
func Field[T any](err *error, read func(path ...string) (T, error), path ...string) T {
	var v T
	if *err != nil {
		return v
	}
	v, *err = read(path...)
	return v
}

// MaxInFlight is the largest max_in_flight an output of ours accepts
// (http_forwarder's FORWARD_MAX_IN_FLIGHT, kafka_franz's): Benthos starts a
// goroutine for each message or batch that may be in flight, all at start,
// so that a limit of millions is no setting but gigabytes before the first
// message.
const MaxInFlight = 10_000

// The shortest timeout and probe interval http_forwarder accepts (its
// timeout and probe_interval, FORWARD_TIMEOUT and PLATFORM_PROBE_INTERVAL),
// and what a shorter one would do.
const (
	// MinTimeout: below it every request to a platform across a network
	// times out, and nothing is delivered.
	MinTimeout    = time.Millisecond
	MinTimeoutWhy = "too short for a request to the platform"
	// MinProbeInterval: the instances share the next probe's time in whole
	// milliseconds (outboxdb.TryProbe); below one, nothing spaces the
	// probes of an outage.
	MinProbeInterval    = time.Millisecond
	MinProbeIntervalWhy = "the instances space their probes in whole milliseconds, so every instance would probe as fast as it can"
)
