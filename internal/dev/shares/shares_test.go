package shares_test

import (
	"math"
	"strings"
	"testing"

	"github.com/forwarder/forwarder/internal/dev/shares"
)

func TestValidate(t *testing.T) {
	flag := func(field string) string { return "-" + strings.ToLower(field) }
	for _, c := range []struct {
		name   string
		shares []shares.Share
		want   string
	}{
		{"Bounds", []shares.Share{{Field: "A", Value: 0}, {Field: "B", Value: 1}}, ""},
		{"Negative", []shares.Share{{Field: "A", Value: -0.1}}, "-a -0.1: want a share from 0 to 1"},
		{"AboveOne", []shares.Share{{Field: "A", Value: 0.5}, {Field: "B", Value: 1.5}}, "-b 1.5: want a share from 0 to 1"},
		{"NaN", []shares.Share{{Field: "A", Value: math.NaN()}}, "-a NaN: want a share from 0 to 1"},
		{"ExclusiveAtOne", []shares.Share{{Field: "A", Value: 0.5, Exclusive: true}, {Field: "B", Value: 0.5, Exclusive: true}}, ""},
		{"TwoExclusiveOverOne", []shares.Share{{Field: "A", Value: 0.6, Exclusive: true}, {Field: "B", Value: 0.5, Exclusive: true}},
			"-a and -b add up to 1.1, more than every answer"},
		{"ThreeExclusiveOverOne", []shares.Share{{Field: "A", Value: 0.5, Exclusive: true}, {Field: "B", Value: 0.5, Exclusive: true}, {Field: "C", Value: 0.25, Exclusive: true}},
			"-a, -b and -c add up to 1.25, more than every answer"},
		{"OthersNotSummed", []shares.Share{{Field: "A", Value: 0.9, Exclusive: true}, {Field: "B", Value: 0.9}}, ""},
	} {
		err := shares.Validate("answer", flag, c.shares...)
		if got := errText(err); got != c.want {
			t.Errorf("%s: %q, want %q", c.name, got, c.want)
		}
	}
	if err := shares.Validate("message", nil, shares.Share{Field: "DuplicateRate", Value: 2}); errText(err) != "DuplicateRate 2: want a share from 0 to 1" {
		t.Errorf("without a name function: %v, want the field's own name", err)
	}
}

func errText(err error) string {
	if err == nil {
		return ""
	}
	return err.Error()
}
