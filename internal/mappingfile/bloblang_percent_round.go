package mappingfile

import (
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"strconv"
	"strings"

	"github.com/redpanda-data/benthos/v4/public/bloblang"
)

func percentRoundSpec() *bloblang.PluginSpec {
	return bloblang.NewPluginSpec().
		Category("Number Manipulation").
		Static().
		Description(`Multiplies a decimal number by 100 and rounds the result half up (towards positive infinity on a tie) to an integer.

The arithmetic is exact and done on the decimal as written, never on a float64 product: `+"`0.575`"+` gives 58, where `+"`(0.575 * 100).round()`"+` gives 57 because 0.575 × 100 is 57.49999999999999 in binary floating point. The target may be a JSON number (Benthos decodes them as `+"`json.Number`"+`, which keeps the digits as written), a string holding a decimal number (`+"`\"0.575\"`, `\"5.75e-1\"`"+`), an integer, or a float (formatted with the fewest digits that read back to the same float first).

Only the digits up to the rounding position, and whether a non-zero digit follows them, decide the result: the method reads the text once, builds no number of its size, and its cost is linear in the text's length, so a hostile value of millions of digits (or an exponent such as `+"`1e999999999`"+`) costs milliseconds, not hours.

Anything else (booleans, null, empty strings, `+"`NaN`"+`, hex, fractions such as `+"`1/2`"+`, surrounding spaces) is an error. A result outside the signed 64-bit range saturates at its bound, so clamping it afterwards behaves as expected. No clamping is done here: the mapping decides the range.`).
		Example("Credibility as a percentage, clamped to 0–100 by the mapping.",
			`root.credibility = this.p.percent_round()`,
			[2]string{`{"p":0.575}`, `{"credibility":58}`},
			[2]string{`{"p":"0.854"}`, `{"credibility":85}`},
			[2]string{`{"p":0.995}`, `{"credibility":100}`},
			[2]string{`{"p":0.0049}`, `{"credibility":0}`},
		)
}

func init() {
	bloblang.MustRegisterMethodV2("percent_round", percentRoundSpec(),
		func(*bloblang.ParsedParams) (bloblang.Method, error) {
			return func(v any) (any, error) {
				return PercentRound(v)
			}, nil
		})
}

// PercentRound returns v × 100 rounded half up to an integer, computed exactly
// on v's decimal text. v may be a json.Number, a string, an integer or a float;
// results beyond the int64 range saturate. The cost is linear in the length of
// the text and a string or json.Number is read without allocating.
func PercentRound(v any) (int64, error) {
	text, err := decimalText(v)
	if err != nil {
		return 0, err
	}
	d, err := parseDecimal(text)
	if err != nil {
		return 0, err
	}
	return d.percentRoundHalfUp(), nil
}

// decimalText returns the decimal representation of a number as written.
func decimalText(v any) (string, error) {
	switch t := v.(type) {
	case json.Number:
		return t.String(), nil
	case string:
		return t, nil
	case []byte:
		return string(t), nil
	case int:
		return strconv.Itoa(t), nil
	case int8, int16, int32, int64:
		return fmt.Sprintf("%d", t), nil
	case uint, uint8, uint16, uint32, uint64:
		return fmt.Sprintf("%d", t), nil
	case float32:
		if math.IsNaN(float64(t)) || math.IsInf(float64(t), 0) {
			return "", fmt.Errorf("%v is not a decimal number", t)
		}
		return strconv.FormatFloat(float64(t), 'g', -1, 32), nil
	case float64:
		if math.IsNaN(t) || math.IsInf(t, 0) {
			return "", fmt.Errorf("%v is not a decimal number", t)
		}
		return strconv.FormatFloat(t, 'g', -1, 64), nil
	case nil:
		return "", errors.New("null is not a decimal number")
	}
	return "", fmt.Errorf("expected a number or a string holding a decimal number, got %T", v)
}

// decimal is sign × digits × 10^exp. The digits are the mantissa's integer
// and fraction parts as written, read as one digit string without copying
// them: a mantissa can be as long as a message.
type decimal struct {
	neg bool
	// intPart and fracPart are the mantissa's digits before and after the
	// point; lead counts the leading zeros of the two read as one string.
	intPart, fracPart string
	lead              int
	exp               int64
}

// n returns the number of digits after the leading zeros (0 for zero).
func (d decimal) n() int { return len(d.intPart) + len(d.fracPart) - d.lead }

// digit returns the i-th digit after the leading zeros, 0 <= i < d.n().
func (d decimal) digit(i int) byte {
	i += d.lead
	if i < len(d.intPart) {
		return d.intPart[i] - '0'
	}
	return d.fracPart[i-len(d.intPart)] - '0'
}

// anyNonZeroFrom reports whether a digit at index i or later is not 0.
func (d decimal) anyNonZeroFrom(i int) bool {
	i += d.lead
	if i < len(d.intPart) {
		if strings.Trim(d.intPart[i:], "0") != "" {
			return true
		}
		i = len(d.intPart)
	}
	return strings.Trim(d.fracPart[i-len(d.intPart):], "0") != ""
}

// maxExp bounds exponents so that the arithmetic below cannot overflow; any
// value whose exponent reaches it is far outside the int64 range (or rounds
// to zero) whatever its digits, as long as the mantissa is shorter than
// 2^40 digits, which a message is.
const maxExp = 1 << 40

// parseDecimal accepts [+-]digits[.digits][(e|E)[+-]digits], with at least one
// digit in the mantissa, and nothing else. It reads s once and keeps slices of
// it: the cost is linear in len(s) and nothing of that size is allocated.
func parseDecimal(s string) (decimal, error) {
	var d decimal
	bad := func() (decimal, error) {
		shown := s
		if len(shown) > 40 {
			shown = shown[:40] + "…"
		}
		return decimal{}, fmt.Errorf("%q is not a decimal number", shown)
	}
	i := 0
	if i < len(s) && (s[i] == '+' || s[i] == '-') {
		d.neg = s[i] == '-'
		i++
	}
	intStart := i
	for i < len(s) && isDigit(s[i]) {
		i++
	}
	d.intPart = s[intStart:i]
	if i < len(s) && s[i] == '.' {
		i++
		fracStart := i
		for i < len(s) && isDigit(s[i]) {
			i++
		}
		d.fracPart = s[fracStart:i]
	}
	if d.intPart == "" && d.fracPart == "" {
		return bad()
	}
	var exp int64
	if i < len(s) && (s[i] == 'e' || s[i] == 'E') {
		i++
		expNeg := false
		if i < len(s) && (s[i] == '+' || s[i] == '-') {
			expNeg = s[i] == '-'
			i++
		}
		expStart := i
		for i < len(s) && isDigit(s[i]) {
			// Saturates: past maxExp only the sign of the exponent matters.
			if exp < maxExp {
				exp = exp*10 + int64(s[i]-'0')
			}
			i++
		}
		if i == expStart {
			return bad()
		}
		exp = min(exp, maxExp)
		if expNeg {
			exp = -exp
		}
	}
	if i != len(s) {
		return bad()
	}
	d.lead = len(d.intPart) - len(strings.TrimLeft(d.intPart, "0"))
	if d.lead == len(d.intPart) {
		d.lead += len(d.fracPart) - len(strings.TrimLeft(d.fracPart, "0"))
	}
	d.exp = exp - int64(len(d.fracPart))
	return d, nil
}

func isDigit(c byte) bool { return c >= '0' && c <= '9' }

// percentRoundHalfUp returns floor(d × 100 + 1/2), saturated to int64.
//
// Only the digits up to the rounding position and whether any non-zero digit
// follows the first dropped one decide the result, so this reads at most 21
// digits and scans the rest once: linear in the input however long it is,
// with no big-number arithmetic (which made a long mantissa quadratic).
func (d decimal) percentRoundHalfUp() int64 {
	n := int64(d.n())
	if n == 0 {
		return 0
	}
	// d × 100 = ±digits × 10^e, and digits < 10^n, so the integer part
	// of |d × 100| has n+e digits: the first n+e of digits, padded with
	// zeros when e > 0.
	e := d.exp + 2
	intDigits := n + e
	switch {
	case intDigits <= -1:
		// |d × 100| < 0.1: rounds to 0 from either side.
		return 0
	case intDigits > 20:
		// |d × 100| >= 10^(n+e-1) >= 10^20, beyond int64.
		if d.neg {
			return math.MinInt64
		}
		return math.MaxInt64
	}

	// q = the integer part of |d × 100|, at most 20 digits: it can overflow
	// uint64, which saturates below.
	var q uint64
	overflow := false
	for i := int64(0); i < intDigits; i++ {
		var c uint64
		if i < n {
			c = uint64(d.digit(int(i)))
		}
		if q > (math.MaxUint64-c)/10 {
			overflow = true
			break
		}
		q = q*10 + c
	}
	// The fraction of |d × 100| starts at digit intDigits (0 <= intDigits):
	// it is at least a half when that digit is 5 or more, and more than a
	// half when it is above 5, or 5 followed by anything non-zero.
	var first byte
	if intDigits < n {
		first = d.digit(int(intDigits))
	}
	if !d.neg {
		// floor(q + f + 1/2) is q+1 when f >= 1/2 and q otherwise.
		if overflow || q >= math.MaxInt64 {
			return math.MaxInt64
		}
		if first >= 5 {
			return int64(q) + 1
		}
		return int64(q)
	}
	// floor(-q - f + 1/2) is -q-1 when f > 1/2 and -q when f <= 1/2.
	if overflow || q > math.MaxInt64 {
		return math.MinInt64
	}
	if first > 5 || (first == 5 && d.anyNonZeroFrom(int(intDigits)+1)) {
		return -int64(q) - 1
	}
	return -int64(q)
}
