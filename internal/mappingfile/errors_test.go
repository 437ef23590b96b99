package mappingfile

import (
	"errors"
	"fmt"
	"strings"
	"testing"
	"unicode/utf8"
)

func TestMappingErrorReason(t *testing.T) {
	t.Parallel()

	for in, want := range map[string]string{
		"failed assignment (line 12): failed assignment (line 3): inoutType 7 is not 0 or 1":                                  "inoutType 7 is not 0 or 1",
		"failed assignment (line 23): failed to process element 1: map picture: failed assignment (line 4): picType 5 is bad": "picType 5 is bad",
		"failed assignment (line 1): if expression: match expression: x":                                                      "x",
		"failed assignment (line 2): field `this.x`: expected number value, got string (\"a\")":                               "field `this.x`: expected number value, got string (\"a\")",
		"failed assignment (line 9): failed to resolve 'pic_type' value: picType 5 is not 1-4":                                "picType 5 is not 1-4",
		"failed assignment (line 2): ": "failed assignment (line 2): ",
		"plain":                        "plain",
	} {
		if got := ErrorReason(fmt.Errorf("%s", in)); got != want {
			t.Errorf("ErrorReason(%q) = %q, want %q", in, got, want)
		}
	}
}

// A reason can be long without quoting any value (a mapping that throws
// many fields, or the text of a value it built): it is cut, at a character
// boundary, and says how much was left out.
func TestMappingErrorReasonIsCut(t *testing.T) {
	t.Parallel()

	reason := "the event is " + strings.Repeat("é", 1<<20)
	got := ErrorReason(fmt.Errorf("failed assignment (line 2): %s", reason))
	kept, cut, ok := strings.Cut(got, "... (")
	if !ok {
		t.Fatalf("reason of %d bytes not cut: %.80q", len(reason), got)
	}
	if len(kept) > maxReasonBytes || len(kept) < maxReasonBytes-utf8.UTFMax {
		t.Errorf("kept %d bytes, want %d or a few less", len(kept), maxReasonBytes)
	}
	if !strings.HasPrefix(reason, kept) || !utf8.ValidString(kept) {
		t.Errorf("kept %.80q..., want a valid prefix of the reason", kept)
	}
	if want := fmt.Sprintf("%d more bytes)", len(reason)-len(kept)); cut != want {
		t.Errorf("note %q, want %q", cut, want)
	}
	if short := "inoutType 7 is not 0 or 1"; ErrorReason(errors.New(short)) != short {
		t.Errorf("a short reason changed")
	}
}
