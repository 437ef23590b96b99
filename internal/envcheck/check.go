package envcheck

import (
	"errors"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"time"
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
	// Warnings are printed and let the command go on.
	Warnings []string
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
	if w := heldRowsWarning(refs, getenv); w != "" {
		res.Warnings = append(res.Warnings, w)
	}
	return res
}

// heldRowsWarning warns when the dispatcher may hold more rows than the
// output can send within their lease: OUTBOX_MAX_UNACKED above
// FORWARD_MAX_IN_FLIGHT × CLAIM_LEASE / FORWARD_TIMEOUT, the values being
// the environment's or the file's defaults.
func heldRowsWarning(refs Refs, getenv func(string) string) string {
	value := func(name string) (string, bool) {
		ref, ok := refs[name]
		if !ok {
			return "", false
		}
		if v := getenv(name); v != "" {
			return v, true
		}
		return ref.Default, ref.Default != ""
	}
	held, ok1 := value("OUTBOX_MAX_UNACKED")
	inFlight, ok2 := value("FORWARD_MAX_IN_FLIGHT")
	lease, ok3 := value("CLAIM_LEASE")
	timeout, ok4 := value("FORWARD_TIMEOUT")
	if !ok1 || !ok2 || !ok3 || !ok4 {
		return ""
	}
	h, err1 := strconv.Atoi(held)
	n, err2 := strconv.Atoi(inFlight)
	l, err3 := time.ParseDuration(lease)
	t, err4 := time.ParseDuration(timeout)
	if err1 != nil || err2 != nil || err3 != nil || err4 != nil || t <= 0 || n < 1 {
		return "" // reported as problems, or not ours to judge
	}
	limit := int64(n) * int64(l) / int64(t)
	if int64(h) <= limit {
		return ""
	}
	return strings.Join([]string{
		fmt.Sprintf("OUTBOX_MAX_UNACKED=%d is above FORWARD_MAX_IN_FLIGHT × CLAIM_LEASE / FORWARD_TIMEOUT = %d × %s / %s = %d:", h, n, l, t, limit),
		"rows held beyond that may not be sent within their lease when the platform is slow (docs/configuration.md)",
	}, " ")
}
