package envcheck

import (
	"errors"
	"fmt"
	"math"
	"slices"
	"time"

	"github.com/forwarder/forwarder/internal/outboxdb"
)

// Mode says what the config is checked for.
type Mode int

const (
	// Lint checks the values that are set.
	Lint Mode = iota
	// Run also requires the variables the service cannot start without.
	Run
)

// Result is what Check found.
type Result struct {
	// Problems stop the command: each names its variable.
	Problems []error
}

// Err joins the problems into one error, nil when there are none.
func (r Result) Err() error {
	if len(r.Problems) == 0 {
		return nil
	}
	return errors.Join(r.Problems...)
}

// Check checks the value of every variable in refs that getenv returns
// non-empty (an empty variable takes the file's default, as Benthos does),
// and in Run mode that the required ones are set.
func Check(refs Refs, mode Mode, getenv func(string) string) Result {
	var res Result
	names := make([]string, 0, len(refs))
	for n := range refs {
		names = append(names, n)
	}
	slices.Sort(names)
	for _, n := range names {
		ref := refs[n]
		value := getenv(n)
		if value == "" {
			if mode == Run && ref.Required {
				res.Problems = append(res.Problems, fmt.Errorf("%s is not set: %s (%s)", n, ref.RequiredBy, ref.File))
			}
			continue
		}
		if err := ref.Var.Check(value); err != nil {
			res.Problems = append(res.Problems, fmt.Errorf("%w (%s)", err, ref.File))
		}
	}
	for _, cross := range []func(Refs, func(string) string) error{leaseProblem, retryProblem, retentionProblem, topicsProblem} {
		if err := cross(refs, getenv); err != nil {
			res.Problems = append(res.Problems, err)
		}
	}
	return res
}

// value is a variable's value: the environment's, else the file's default;
// ok is false when the config does not use it or both are empty.
func value(refs Refs, getenv func(string) string, name string) (v string, ok bool) {
	ref, used := refs[name]
	if !used {
		return "", false
	}
	if v := getenv(name); v != "" {
		return v, true
	}
	return ref.Default, ref.Default != ""
}

// topicsProblem refuses one Kafka topic for two purposes (the
// environment's values or the file's defaults): the outbox stores each
// input topic's messages as one API type, so with the vehicle and heartbeat
// topics alike one kind would be sent to the platform as the other (the
// YAML map of topics to types keeps the last, and no error says so); and a
// dead-letter topic that is an input topic would be consumed as new
// messages.
func topicsProblem(refs Refs, getenv func(string) string) error {
	topics := []string{"KAFKA_TOPIC_VEHICLE", "KAFKA_TOPIC_HEARTBEAT", "KAFKA_TOPIC_DEAD_LETTER"}
	for i, a := range topics {
		va, ok := value(refs, getenv, a)
		if !ok {
			continue
		}
		for _, b := range topics[i+1:] {
			if vb, ok := value(refs, getenv, b); ok && vb == va {
				why := "the outbox stores each topic's messages as one API type, so one kind would be sent as the other"
				if b == "KAFKA_TOPIC_DEAD_LETTER" {
					why = "FAILED rows published to the dead-letter topic would be consumed again as new messages"
				}
				return fmt.Errorf("%s and %s are both %q: %s; give each its own topic", a, b, va, why)
			}
		}
	}
	return nil
}

// retentionProblem refuses a retention shorter than a day unless
// OUTBOX_RETENTION_FORCE is true: a delivered row's key is what makes a
// Kafka redelivery of its message harmless, and redeliveries happen in
// ordinary operation (docs/operations.md, "Retention").
func retentionProblem(refs Refs, getenv func(string) string) error {
	retention, ok := value(refs, getenv, "OUTBOX_RETENTION")
	if !ok {
		return nil
	}
	d, err := outboxdb.ParseDuration(retention)
	if err != nil || d >= outboxdb.MinPurgeAge {
		return nil // reported as a problem of its own, or fine
	}
	if force, _ := value(refs, getenv, "OUTBOX_RETENTION_FORCE"); force == "true" {
		return nil
	}
	minimum := outboxdb.FormatDuration(outboxdb.MinPurgeAge)
	return fmt.Errorf("OUTBOX_RETENTION=%s is below the safe minimum of %s: a delivered row's key is what makes "+
		"a Kafka redelivery of its message harmless, and a message redelivered after its partition is retired is sent "+
		"to the platform again; set OUTBOX_RETENTION to %s or more, or OUTBOX_RETENTION_FORCE=true to accept it",
		retention, minimum, minimum)
}

// minLease is the shortest lease outbox_retry accepts.
const minLease = time.Second

// leaseProblem refuses a claim lease that a request could outlive:
// CLAIM_LEASE must exceed FORWARD_TIMEOUT, the values being the
// environment's or the file's defaults. The dispatcher renews the leases of
// the rows it holds, so the lease only bounds how long a crashed instance's
// rows wait; below the request timeout another instance would take them
// while their requests may still be under way. Nor may it be below a
// second, which outbox_retry refuses at start-up.
func leaseProblem(refs Refs, getenv func(string) string) error {
	lease, timeout, l, t, ok := durations(refs, getenv, "CLAIM_LEASE", "FORWARD_TIMEOUT")
	switch {
	case !ok:
		return nil
	case l <= t && t > math.MaxInt64-time.Second:
		return fmt.Errorf("CLAIM_LEASE=%s must exceed FORWARD_TIMEOUT=%s, and no duration does by a second: lower FORWARD_TIMEOUT", lease, timeout)
	case l <= t:
		return fmt.Errorf("CLAIM_LEASE=%s must exceed FORWARD_TIMEOUT=%s: set CLAIM_LEASE to at least %s", lease, timeout, max(t+time.Second, minLease))
	case l < minLease:
		return fmt.Errorf("CLAIM_LEASE=%s is below %s, the shortest lease outbox_retry takes", lease, minLease)
	}
	return nil
}

// retryProblem refuses a retry backoff whose cap is below its first delay:
// FORWARD_RETRY_MAX must not be less than FORWARD_RETRY_INITIAL (the
// environment's values or the file's defaults), as http_forwarder refuses
// at start-up.
func retryProblem(refs Refs, getenv func(string) string) error {
	maximum, initial, m, i, ok := durations(refs, getenv, "FORWARD_RETRY_MAX", "FORWARD_RETRY_INITIAL")
	if !ok || m >= i {
		return nil
	}
	return fmt.Errorf("FORWARD_RETRY_MAX=%s must not be less than FORWARD_RETRY_INITIAL=%s: set FORWARD_RETRY_MAX to at least %s, or lower FORWARD_RETRY_INITIAL",
		maximum, initial, initial)
}

// durations reads the duration variables a and b for a check between them:
// their values (the environment's, else the file's defaults) and what they
// parse to. ok is false when the config does not use both or one does not
// parse, which is reported as a problem of its own.
func durations(refs Refs, getenv func(string) string, a, b string) (va, vb string, da, db time.Duration, ok bool) {
	va, okA := value(refs, getenv, a)
	vb, okB := value(refs, getenv, b)
	if !okA || !okB {
		return va, vb, 0, 0, false
	}
	da, errA := time.ParseDuration(va)
	db, errB := time.ParseDuration(vb)
	return va, vb, da, db, errA == nil && errB == nil
}
