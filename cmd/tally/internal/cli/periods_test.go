package cli

import (
	"strings"
	"testing"

	"github.com/tally-ledger/tally/internal/pgtest"
)

// A period reference outside 1970-01-01..9998-12-31 is refused by name
// before anything runs, by every subcommand that takes a period.
func TestPeriodOutOfRangeRefused(t *testing.T) {
	db := pgtest.NewURL(t)
	if _, err := runTally(t, "periods", "close", "--customer", "acme", "--period", "2026-10-01",
		"--force", "--reason", "r", "--actor", "a", "--database-url", db); err == nil || !strings.Contains(err.Error(), "unknown customer") {
		t.Fatalf("close of an unknown customer: %v", err) // the command reaches the store
	}
	for _, ref := range []string{"9999-12-01", "0000-01-01"} {
		for _, args := range [][]string{
			{"periods", "close", "--customer", "acme", "--period", ref, "--force", "--reason", "r", "--actor", "a"},
			{"reconcile", "--period", ref},
			{"reconcile", "--period", ref, "--customer", "acme"},
		} {
			_, err := runTally(t, append(args, "--database-url", db)...)
			if err == nil || !strings.Contains(err.Error(), `period "`+ref+`"`) || !strings.Contains(err.Error(), "supported range") {
				t.Errorf("%v: %v", args, err)
			}
		}
	}
}
