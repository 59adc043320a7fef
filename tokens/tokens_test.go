package tokens_test

import (
	"strings"
	"testing"

	"github.com/tally-ledger/tally/tokens"
)

// TestWellFormed: only Create's shape is checked against Postgres.
func TestWellFormed(t *testing.T) {
	body := strings.Repeat("aZ9-_", 8) + "abc" // 43 base64url characters
	for tok, want := range map[string]bool{
		"tly_" + body:                     true,
		"tly_" + body + "d":               false,
		"tly_" + body[:42]:                false,
		"tly_" + body[:41] + "+/":         false, // not URL-safe
		"tly_" + body[:42] + "=":          false,
		"TLY_" + body:                     false,
		"tly_" + body[:42] + "\u00e9"[:1]: false,
		"":                                false,
		"tly_":                            false,
	} {
		if got := tokens.WellFormed(tok); got != want {
			t.Errorf("WellFormed(%q) = %v, want %v", tok, got, want)
		}
	}
}
