package mappingfile

import (
	"encoding/json"
	"math"
	"math/big"
	"math/rand/v2"
	"strconv"
	"strings"
	"testing"

	"github.com/redpanda-data/benthos/v4/public/bloblang"
	"github.com/redpanda-data/benthos/v4/public/service"
)

func TestPercentRound(t *testing.T) {
	t.Parallel()

	cases := []struct {
		name string
		in   any
		want int64
	}{
		{"ContractExample", json.Number("0.854"), 85},
		{"TieRoundsUpWhereFloatWouldNot", json.Number("0.575"), 58},
		{"TieAsString", "0.575", 58},
		{"TieAsFloat64", 0.575, 58},
		{"NinetyNinePointFive", json.Number("0.995"), 100},
		{"HalfPercent", json.Number("0.005"), 1},
		{"JustBelowHalfPercent", json.Number("0.0049"), 0},
		{"JustBelowTie", json.Number("0.57499999999999999999999"), 57},
		{"One", json.Number("1"), 100},
		{"OneAsInt64", int64(1), 100},
		{"OneAsInt", 1, 100},
		{"OnePointTwo", json.Number("1.2"), 120},
		{"Zero", json.Number("0"), 0},
		{"ZeroWithExponent", json.Number("0e99999999999999999999"), 0},
		{"NegativeZero", "-0.0", 0},
		{"Negative", json.Number("-0.3"), -30},
		{"NegativeTieRoundsUp", "-0.005", 0},
		{"NegativeJustPastTie", "-0.0051", -1},
		{"Exponent", "5.75e-1", 58},
		{"UpperExponent", "575E-3", 58},
		{"PositiveExponent", "0.00575e+2", 58},
		{"LeadingDot", ".575", 58},
		{"TrailingDot", "1.", 100},
		{"PlusSign", "+0.5", 50},
		{"LeadingZeros", "000.575", 58},
		{"TinyPositive", "1e-400", 0},
		{"TinyNegative", "-1e-400", 0},
		{"HugeExponentSaturates", "1e999999999999999999", math.MaxInt64},
		{"HugeNegativeSaturates", "-1e400", math.MinInt64},
		{"JustInsideInt64", "92233720368547758.07", math.MaxInt64},
		{"JustOutsideInt64", "92233720368547758.08", math.MaxInt64},
		{"LargeInteger", json.Number("123456789012345678"), math.MaxInt64},
		{"EighteenDigitsTie", "0.999999999999999995", 100},
		{"EighteenDigitsNegativeTie", "-0.999999999999999995", -100},
		{"EighteenDigitsIntegerResult", "9999999999999999.99", 999999999999999999},
		{"NineteenDigitResultSaturates", "99999999999999999.9", math.MaxInt64},
		{"Float32", float32(0.5), 50},
		{"Uint64", uint64(2), 200},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			got, err := PercentRound(tc.in)
			if err != nil {
				t.Fatalf("PercentRound(%#v): %v", tc.in, err)
			}
			if got != tc.want {
				t.Fatalf("PercentRound(%#v) = %d, want %d", tc.in, got, tc.want)
			}
		})
	}
}

func TestPercentRoundRejects(t *testing.T) {
	t.Parallel()

	for _, in := range []any{
		"", " 0.5", "0.5 ", "abc", "0x1p-2", "1/2", "NaN", "Inf", "-Inf", "1e", "1e+", ".", "-", "+.", "1_000", "١",
		"0.5.5", "--1", nil, true, []any{}, map[string]any{}, math.NaN(), math.Inf(1),
	} {
		if got, err := PercentRound(in); err == nil {
			t.Errorf("PercentRound(%#v) = %d, want an error", in, got)
		}
	}
}

// TestPercentRoundLongInput holds inputs as long as a message: the result
// depends only on the digits up to the rounding position and on whether a
// non-zero digit follows, and reading them builds nothing of their size.
func TestPercentRoundLongInput(t *testing.T) {
	t.Parallel()

	const mib16 = 16 << 20
	many := func(digit string) string { return strings.Repeat(digit, mib16) }
	cases := []struct {
		name string
		in   string
		want int64
	}{
		{"NinesRoundToOneHundred", "0." + many("9"), 100},
		{"FoursRoundDown", "0.8" + many("4"), 84},
		{"TieFollowedByZeros", "0.005" + many("0"), 1},
		{"NegativeTieFollowedByZeros", "-0.005" + many("0"), 0},
		{"NegativeTieFollowedByZerosThenOne", "-0.005" + many("0") + "1", -1},
		{"LeadingZerosThenDigits", many("0") + "0.854" + many("3"), 85},
		{"ZerosOnly", "0." + many("0"), 0},
		{"LongIntegerSaturates", "1" + many("0"), math.MaxInt64},
		{"LongNegativeIntegerSaturates", "-" + many("7"), math.MinInt64},
		{"LongMantissaShiftedBack", many("0") + "854" + many("0") + "e-" + strconv.Itoa(mib16+3), 85},
		{"LongFractionShiftedForward", "0." + many("0") + "854e" + strconv.Itoa(mib16), 85},
		{"HugeExponent", "1e999999999", math.MaxInt64},
		{"HugeExponentDigits", "1e" + many("9"), math.MaxInt64},
		{"HugeNegativeExponentDigits", "9e-" + many("9"), 0},
		{"UpperCaseExponent", "85.4E-2", 85},
		{"LowerCaseExponent", "1e-3", 0},
		{"ExponentHalfPercent", "5e-3", 1},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			got, err := PercentRound(tc.in)
			if err != nil {
				t.Fatalf("PercentRound(%.40q…): %v", tc.in, err)
			}
			if got != tc.want {
				t.Fatalf("PercentRound(%.40q…) = %d, want %d", tc.in, got, tc.want)
			}
		})
	}

}

// TestPercentRoundAllocatesNothing shows that no number of the input's size
// is built: big-number arithmetic allocated the input's size several times
// over, and took quadratic time doing it. (Not parallel: AllocsPerRun counts
// every allocation of the process.)
func TestPercentRoundAllocatesNothing(t *testing.T) {
	for name, in := range map[string]any{
		"LongMantissa":         "0." + strings.Repeat("7", 16<<20),
		"LongJSONNumber":       json.Number("-0." + strings.Repeat("5", 16<<20)),
		"HugeExponent":         json.Number("1e999999999"),
		"HugeNegativeExponent": "85.4e-999999999",
	} {
		allocs := testing.AllocsPerRun(3, func() {
			if _, err := PercentRound(in); err != nil {
				t.Fatal(err)
			}
		})
		if allocs != 0 {
			t.Errorf("%s: PercentRound made %v allocations, want 0", name, allocs)
		}
	}
}

// TestPercentRoundMatchesReference compares the method with big.Rat on
// random decimals around the rounding position: ties, carries, long tails
// and exponents, in both signs. The fuzz test explores further; this one
// runs every time.
func TestPercentRoundMatchesReference(t *testing.T) {
	t.Parallel()

	rng := rand.New(rand.NewPCG(16, 2))
	// Few distinct digits make ties (5), carries (9) and zero tails likely.
	const alphabet = "0004599"
	digits := func(n int) string {
		b := make([]byte, n)
		for i := range b {
			b[i] = alphabet[rng.IntN(len(alphabet))]
		}
		return string(b)
	}
	length := func() int { return []int{0, 1, 2, 3, 5, 18, 19, 20, 25, 300}[rng.IntN(10)] }
	for range 20000 {
		var b strings.Builder
		b.WriteString([]string{"", "-", "+"}[rng.IntN(3)])
		b.WriteString(digits(length()))
		if rng.IntN(4) > 0 {
			b.WriteString(".")
			b.WriteString(digits(length()))
		}
		if rng.IntN(3) == 0 {
			b.WriteString([]string{"e", "E", "e-", "e+"}[rng.IntN(4)])
			b.WriteString(strconv.Itoa(rng.IntN(330)))
		}
		s := b.String()
		ref, refOK := referencePercentRound(s)
		got, err := PercentRound(s)
		switch {
		case !refOK && err == nil:
			t.Fatalf("PercentRound(%q) = %d, the reference rejects it", s, got)
		case refOK && err != nil:
			t.Fatalf("PercentRound(%q): %v, the reference gives %d", s, err, ref)
		case refOK && got != ref:
			t.Fatalf("PercentRound(%q) = %d, the reference gives %d", s, got, ref)
		}
	}
}

// The float64 product that the method avoids really is off by one for these
// inputs; if Go ever changed that the table above would prove less.
func TestFloatProductIsWrong(t *testing.T) {
	t.Parallel()

	p := 0.575 // a variable: constant arithmetic would be exact
	if got := math.Round(p * 100); got != 57 {
		t.Fatalf("math.Round(0.575*100) = %v, expected the float64 artefact 57", got)
	}
}

func TestPercentRoundInBloblang(t *testing.T) {
	t.Parallel()

	exec, err := bloblang.Parse(`root.p = this.p.percent_round()`)
	if err != nil {
		t.Fatal(err)
	}
	for in, want := range map[string]string{
		`{"p":0.575}`:   `{"p":58}`,
		`{"p":"0.854"}`: `{"p":85}`,
		`{"p":0.995}`:   `{"p":100}`,
		`{"p":-0.3}`:    `{"p":-30}`,
		// A literal is folded at parse time (the method is static).
		`{"p":1.2}`: `{"p":120}`,
	} {
		res, err := service.NewMessage([]byte(in)).BloblangQuery(exec)
		if err != nil {
			t.Fatalf("%s: %v", in, err)
		}
		got, _ := res.AsBytes()
		if string(got) != want {
			t.Errorf("%s: got %s, want %s", in, got, want)
		}
	}
	if _, err := service.NewMessage([]byte(`{"p":"abc"}`)).BloblangQuery(exec); err == nil || !strings.Contains(err.Error(), `"abc" is not a decimal number`) {
		t.Errorf("non-numeric string: got error %v", err)
	}

	lit, err := bloblang.Parse(`root = "0.575".percent_round()`)
	if err != nil {
		t.Fatal(err)
	}
	if v, err := lit.Query(nil); err != nil || v != int64(58) {
		t.Errorf("literal: got %v, %v", v, err)
	}
}

// FuzzPercentRound checks the method against big.Rat parsing the same text
// directly: floor(v*100 + 1/2), saturated to int64.
func FuzzPercentRound(f *testing.F) {
	for _, seed := range []string{
		"0.575", "0.854", "0.995", "0.005", "0.0049", "1", "1.2", "-0.3", "0", "5.75e-1", "1e-400", "1e400",
		".5", "5.", "-0.005", "92233720368547758.07", "0x10", "1/2", "NaN", "", "1e", "00.000000000000000001",
		// Around the edges of the int64 fast path: 18 and 19 digits, 10^18.
		"0.999999999999999995", "-0.999999999999999995", "9999999999999999.99", "99999999999999999.9",
		"-0.0051", "1e16", "1e17", "0.5e-16", "-5e-3", "123456789012345678e-18",
	} {
		f.Add(seed)
	}
	f.Fuzz(func(t *testing.T, s string) {
		got, err := PercentRound(s)
		ref, refOK := referencePercentRound(s)
		if err != nil {
			if refOK {
				t.Fatalf("PercentRound(%q) failed (%v), reference gives %d", s, err, ref)
			}
			return
		}
		if !refOK {
			// Our grammar is a subset of big.Rat's, apart from exponents
			// too large for it: those must have saturated or rounded to 0.
			if !strings.ContainsAny(s, "eE") {
				t.Fatalf("PercentRound(%q) = %d, reference rejects it", s, got)
			}
			if got != 0 && got != math.MaxInt64 && got != math.MinInt64 {
				t.Fatalf("PercentRound(%q) = %d for an out-of-range exponent", s, got)
			}
			return
		}
		if got != ref {
			t.Fatalf("PercentRound(%q) = %d, reference %d", s, got, ref)
		}
	})
}

// referencePercentRound parses s with big.Rat, restricted to plain decimal
// syntax (big.Rat also takes fractions, hex and underscores), and rounds.
func referencePercentRound(s string) (int64, bool) {
	if s == "" || strings.ContainsAny(s, "/xXoObBpP_ \t\n") || strings.Count(s, ".") > 1 {
		return 0, false
	}
	// big.Rat reads "0" prefixes as octal only with a '/' fraction or an
	// explicit prefix, both excluded above; "Inf"/"NaN" fail to parse.
	r, ok := new(big.Rat).SetString(s)
	if !ok {
		return 0, false
	}
	// big.Rat also accepts a bare sign before a '.', and digits only after
	// the exponent sign; mirror our grammar's requirement of a digit.
	mant := strings.TrimLeft(strings.SplitN(strings.ToLower(s), "e", 2)[0], "+-")
	if strings.Trim(mant, ".") == "" || strings.ContainsAny(mant, "+-") {
		return 0, false
	}
	r.Mul(r, big.NewRat(100, 1))
	r.Add(r, big.NewRat(1, 2))
	floor := new(big.Int).Div(r.Num(), r.Denom())
	switch {
	case floor.IsInt64():
		return floor.Int64(), true
	case floor.Sign() < 0:
		return math.MinInt64, true
	default:
		return math.MaxInt64, true
	}
}
