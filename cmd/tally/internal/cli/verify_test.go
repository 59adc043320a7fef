package cli

import (
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/tally-ledger/tally/internal/pgtest"
)

// TestVerifyRefusesAnEmptyGroundTruth: a file with no run id, or with
// nothing to check, is refused naming the file (exit 2), never reported
// "clean" against any ledger.
func TestVerifyRefusesAnEmptyGroundTruth(t *testing.T) {
	url := pgtest.NewURL(t)
	dir := t.TempDir()
	for _, tc := range []struct{ name, body, says string }{
		{"empty.json", `{}`, "no run id"},
		{"null.json", `null`, "no run id"},
		{"no-records.json", `{"run": "r1", "customers": ["r1-c1"], "totals": [], "streams": []}`, "nothing to check"},
		{"no-customers.json", `{"run": "r1", "totals": [{"customer": "r1-c1", "meter": "m1", "period": "2026-12-01", "period_start": "2026-12-01T00:00:00Z", "quantity": "1"}]}`, "no customers"},
	} {
		path := filepath.Join(dir, tc.name)
		if err := os.WriteFile(path, []byte(tc.body), 0o644); err != nil {
			t.Fatal(err)
		}
		out, err := runTally(t, "verify", "--database-url", url, "--expect", path)
		var ee *ExitError
		if err == nil || !errors.As(err, &ee) || ee.Code != 2 || !strings.Contains(err.Error(), path) || !strings.Contains(err.Error(), tc.says) {
			t.Errorf("%s: got %v (stdout %q); want exit 2 naming the file and saying %q", tc.body, err, out, tc.says)
		}
		if out != "" {
			t.Errorf("%s: printed %q", tc.body, out)
		}
	}
}
