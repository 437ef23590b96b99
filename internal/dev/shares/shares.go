// Package shares checks the shares the dev tools are given: the event
// generator's duplicates and malformed messages, the mock platform's faults.
package shares

import (
	"fmt"
	"strings"
)

// Share is one share, a probability, and the field that sets it.
type Share struct {
	Field string
	Value float64
	// Exclusive shares replace one another (a message is a duplicate or
	// malformed, an answer is one fault or another): together they are at
	// most one.
	Exclusive bool
}

// Validate checks shares: each from 0 to 1, and the exclusive ones adding up
// to at most every unit ("message", "answer"). Its errors call a field
// name(field), e.g. the flag that set it; nil keeps the field names.
func Validate(unit string, name func(field string) string, shares ...Share) error {
	if name == nil {
		name = func(field string) string { return field }
	}
	var (
		sum   float64
		names []string
	)
	for _, s := range shares {
		if !(s.Value >= 0 && s.Value <= 1) { // NaN too
			return fmt.Errorf("%s %v: want a share from 0 to 1", name(s.Field), s.Value)
		}
		if s.Exclusive {
			sum += s.Value
			names = append(names, name(s.Field))
		}
	}
	if sum > 1 {
		last := len(names) - 1
		return fmt.Errorf("%s and %s add up to %v, more than every %s", strings.Join(names[:last], ", "), names[last], sum, unit)
	}
	return nil
}
