// Package fieldlint writes the lint rules through which `forwarder lint`
// refuses what our plugins' constructors refuse at start-up. Benthos lint
// never runs a constructor, and a lint rule can only be Bloblang (parsed
// when the spec is built, with the Bloblang plugins registered by then), so
// every rule calls one method registered here that runs a Go check.
//
// A rule sees the field's value after `${VAR:default}` interpolation and
// YAML decoding. A check passes what it cannot judge: an empty string (an
// unset variable leaves the field empty; Benthos reports the variable
// itself, and `--skip-env-var-check` says it comes at run time) and a value
// of another type (Benthos's type lint, or start-up, reports it). An int
// field left empty reads as 0 and cannot be told apart from a written 0.
// Exact is the exception: it stands in for Benthos's enum lint, which
// refuses an empty value.
package fieldlint

import (
	"cmp"
	"encoding/json"
	"fmt"
	"math"
	"slices"
	"strconv"
	"sync"
	"time"

	"github.com/redpanda-data/benthos/v4/public/bloblang"
)

// method is the Bloblang method behind every rule; the _lint suffix keeps
// it out of docs/reference (internal/docgen).
const method = "forwarder_field_lint"

var (
	mu     sync.Mutex
	checks []func(any) []string
)

func init() {
	spec := bloblang.NewPluginSpec().
		Category("Object & Array Manipulation").
		Description("Used by the lint rules of the forwarder's plugins: runs the Go check numbered `check` on the value and returns its lint messages.").
		Param(bloblang.NewInt64Param("check").Description("The check's number."))
	bloblang.MustRegisterMethodV2(method, spec, func(args *bloblang.ParsedParams) (bloblang.Method, error) {
		id, err := args.GetInt64("check")
		if err != nil {
			return nil, err
		}
		mu.Lock()
		defer mu.Unlock()
		if id < 0 || id >= int64(len(checks)) {
			return nil, fmt.Errorf("no field lint check %d", id)
		}
		check := checks[id]
		return func(v any) (any, error) {
			lints := []any{}
			for _, l := range check(v) {
				lints = append(lints, l)
			}
			return lints, nil
		}, nil
	})
}

// Rule returns a lint rule (for service.ConfigField.LintRule or
// service.ConfigSpec.LintRule) that runs check on the value linted: a
// field's value, or a component's or object's fields, defaults included.
// check returns the start-up errors the value would meet. Every call
// registers one more check for the life of the process, so a spec is built
// once (the plugins' spec functions are sync.OnceValue), not per use.
func Rule(check func(v any) []string) string {
	mu.Lock()
	defer mu.Unlock()
	checks = append(checks, check)
	return fmt.Sprintf("root = this.%s(%d)", method, len(checks)-1)
}

// Duration is the rule of a duration field called name: its value must be
// what Benthos's FieldDuration reads (time.ParseDuration) and pass check.
func Duration(name string, check func(time.Duration) error) string {
	return Rule(func(v any) []string {
		d, ok, err := ParseDuration(name, v)
		if err != nil {
			return []string{err.Error()}
		}
		return result(ok, check, d)
	})
}

// Int is the rule of an int field: its value must pass check.
func Int(check func(int) error) string {
	return Rule(func(v any) []string {
		n, ok := ToInt(v)
		return result(ok, check, n)
	})
}

// Float is the rule of a float field: its value must pass check.
func Float(check func(float64) error) string {
	return Rule(func(v any) []string {
		f, ok := ToFloat(v)
		return result(ok, check, f)
	})
}

// Bool is the rule of a bool field: its value must pass check.
func Bool(check func(bool) error) string {
	return Rule(func(v any) []string {
		b, ok := v.(bool)
		return result(ok, check, b)
	})
}

// String is the rule of a string field: a value that is not empty must
// pass check.
func String(check func(string) error) string {
	return Rule(func(v any) []string {
		s, ok := v.(string)
		return result(ok && s != "", check, s)
	})
}

// Exact is the rule of an enum field whose constructor compares the value
// as written. It replaces Benthos's own enum lint, which ignores case (it
// passes `Berth` for `berth`, which start-up refuses): a value that is not
// one of options, empty included, gets the error check returns, if any.
func Exact(options []string, check func(string) error) string {
	return Rule(func(v any) []string {
		s, ok := v.(string)
		if !ok || slices.Contains(options, s) {
			return nil
		}
		if err := check(s); err != nil {
			return []string{err.Error()}
		}
		return nil
	})
}

// Range returns a check that refuses a value outside [lo, hi] (NaN
// included) with the error format, whose one verb is the value.
func Range[T cmp.Ordered](lo, hi T, format string) func(T) error {
	return func(v T) error {
		if v >= lo && v <= hi {
			return nil
		}
		return fmt.Errorf(format, v)
	}
}

// MaxDuration is the longest time.Duration, an upper bound for Range.
const MaxDuration = time.Duration(math.MaxInt64)

// ParseDuration reads a duration value as Benthos's FieldDuration does;
// ok is false for a value that cannot be judged (see the package comment).
func ParseDuration(name string, v any) (d time.Duration, ok bool, err error) {
	s, isString := v.(string)
	if !isString || s == "" {
		return 0, false, nil
	}
	d, err = time.ParseDuration(s)
	if err != nil {
		return 0, false, fmt.Errorf("failed to parse '%s' as a duration string: %w", name, err)
	}
	return d, true, nil
}

// ToInt reads an int value as Benthos's FieldInt does.
func ToInt(v any) (int, bool) {
	switch n := v.(type) {
	case int:
		return n, true
	case int64:
		return int(n), true
	case uint64:
		return int(n), n <= math.MaxInt64
	case float64:
		return int(n), n == math.Trunc(n)
	case json.Number:
		i, err := n.Int64()
		return int(i), err == nil
	case string:
		i, err := strconv.ParseInt(n, 10, 64)
		return int(i), err == nil
	}
	return 0, false
}

// ToFloat reads a float value as Benthos's FieldFloat does.
func ToFloat(v any) (float64, bool) {
	switch n := v.(type) {
	case float64:
		return n, true
	case int:
		return float64(n), true
	case int64:
		return float64(n), true
	case uint64:
		return float64(n), true
	case json.Number:
		f, err := n.Float64()
		return f, err == nil
	case string:
		f, err := strconv.ParseFloat(n, 64)
		return f, err == nil
	}
	return 0, false
}

func result[T any](ok bool, check func(T) error, v T) []string {
	if !ok {
		return nil
	}
	if err := check(v); err != nil {
		return []string{err.Error()}
	}
	return nil
}
