package envcheck

import (
	"errors"
	"fmt"
	"slices"
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
	if err := leaseProblem(refs, getenv); err != nil {
		res.Problems = append(res.Problems, err)
	}
	return res
}

// leaseProblem refuses a claim lease that a request could outlive:
// CLAIM_LEASE must exceed FORWARD_TIMEOUT, the values being the
// environment's or the file's defaults. The dispatcher renews the leases of
// the rows it holds, so the lease only bounds how long a crashed instance's
// rows wait; below the request timeout another instance would take them
// while their requests may still be under way.
func leaseProblem(refs Refs, getenv func(string) string) error {
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
	lease, ok1 := value("CLAIM_LEASE")
	timeout, ok2 := value("FORWARD_TIMEOUT")
	if !ok1 || !ok2 {
		return nil
	}
	l, err1 := time.ParseDuration(lease)
	t, err2 := time.ParseDuration(timeout)
	if err1 != nil || err2 != nil || l > t {
		return nil // reported as problems of their own, or fine
	}
	return fmt.Errorf("CLAIM_LEASE=%s must exceed FORWARD_TIMEOUT=%s: set CLAIM_LEASE to at least %s", lease, timeout, t+time.Second)
}
