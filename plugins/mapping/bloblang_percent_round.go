package mapping

import (
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"math/big"
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
// results beyond the int64 range saturate.
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

// decimal is sign × digits × 10^exp, digits without leading zeros ("" = 0).
type decimal struct {
	neg    bool
	digits string
	exp    int64
}

// maxExp bounds exponents so that the arithmetic below cannot overflow; any
// value whose exponent reaches it is far outside the int64 range (or rounds
// to zero) whatever its digits.
const maxExp = 1 << 40

// parseDecimal accepts [+-]digits[.digits][(e|E)[+-]digits], with at least one
// digit in the mantissa, and nothing else.
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
	intPart := s[intStart:i]
	var fracPart string
	if i < len(s) && s[i] == '.' {
		i++
		fracStart := i
		for i < len(s) && isDigit(s[i]) {
			i++
		}
		fracPart = s[fracStart:i]
	}
	if intPart == "" && fracPart == "" {
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
	d.digits = strings.TrimLeft(intPart+fracPart, "0")
	d.exp = exp - int64(len(fracPart))
	return d, nil
}

func isDigit(c byte) bool { return c >= '0' && c <= '9' }

// percentRoundHalfUp returns floor(d × 100 + 1/2), saturated to int64.
func (d decimal) percentRoundHalfUp() int64 {
	if d.digits == "" {
		return 0
	}
	// d × 100 = digits × 10^e, and digits < 10^n, so |d × 100| < 10^(n+e).
	n, e := int64(len(d.digits)), d.exp+2
	switch {
	case n+e <= -1:
		// |d × 100| < 0.1: rounds to 0 from either side.
		return 0
	case n+e > 20:
		// |d × 100| >= 10^(n+e-1) >= 10^20, beyond int64.
		if d.neg {
			return math.MinInt64
		}
		return math.MaxInt64
	}
	if r, ok := d.percentRoundSmall(n, e); ok {
		return r
	}
	// Here -1-n < e <= 20-n, so 10^|e| stays as small as the input is long.
	num, _ := new(big.Int).SetString(d.digits, 10)
	if d.neg {
		num.Neg(num)
	}
	den := big.NewInt(1)
	pow := new(big.Int).Exp(big.NewInt(10), big.NewInt(absInt64(e)), nil)
	if e >= 0 {
		num.Mul(num, pow)
	} else {
		den = pow
	}
	r := new(big.Rat).SetFrac(num, den)
	r.Add(r, big.NewRat(1, 2))
	// Int.Div is Euclidean: with a positive divisor it is the floor.
	floor := new(big.Int).Div(r.Num(), r.Denom())
	switch {
	case floor.IsInt64():
		return floor.Int64()
	case floor.Sign() < 0:
		return math.MinInt64
	default:
		return math.MaxInt64
	}
}

// pow10 holds 10^0 … 10^18, the powers of ten that fit in an int64.
var pow10 = func() (p [19]int64) {
	p[0] = 1
	for i := 1; i < len(p); i++ {
		p[i] = p[i-1] * 10
	}
	return p
}()

// percentRoundSmall is percentRoundHalfUp in int64 arithmetic, for the
// usual inputs (at most 18 digits, d × 100 below 10^18); ok is false when
// the value needs big numbers. n is len(d.digits), e is d.exp+2, so
// d × 100 = ±digits × 10^e.
func (d decimal) percentRoundSmall(n, e int64) (r int64, ok bool) {
	if n > 18 || n+e > 18 || -e > 18 {
		return 0, false
	}
	var digits int64
	for i := 0; i < len(d.digits); i++ {
		digits = digits*10 + int64(d.digits[i]-'0')
	}
	if e >= 0 {
		// An integer: n+e <= 18 digits, so it fits.
		r = digits * pow10[e]
		if d.neg {
			r = -r
		}
		return r, true
	}
	// d × 100 = ±(q + rem/den) with 0 <= rem < den <= 10^18.
	den := pow10[-e]
	q, rem := digits/den, digits%den
	switch {
	case !d.neg && 2*rem >= den:
		// The fraction is at least a half: round up.
		return q + 1, true
	case !d.neg:
		return q, true
	case 2*rem > den:
		// -q - rem/den + 1/2 lies in (-q-1, -q): its floor is -q-1.
		return -q - 1, true
	default:
		// A fraction of at most a half: -q - rem/den + 1/2 >= -q.
		return -q, true
	}
}

func absInt64(v int64) int64 {
	if v < 0 {
		return -v
	}
	return v
}
