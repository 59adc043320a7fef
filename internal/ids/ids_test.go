package ids_test

import (
	"strings"
	"testing"

	"github.com/tally-ledger/tally/internal/ids"
)

func TestValid(t *testing.T) {
	for s, want := range map[string][2]bool{ // Valid, ValidName
		"acme": {true, true}, "a.b_c-d": {true, true}, "tenant:42": {true, false}, "...": {true, true}, ".a": {true, true},
		"": {false, false}, ".": {false, false}, "..": {false, false}, "a b": {false, false}, "é": {false, false},
		"a/b": {false, false}, strings.Repeat("a", 128): {true, true}, strings.Repeat("a", 129): {false, false},
	} {
		if got := [2]bool{ids.Valid(s), ids.ValidName(s)}; got != want {
			t.Errorf("%q: Valid, ValidName = %v, want %v", s, got, want)
		}
	}
}
