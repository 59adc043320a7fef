package cli

import (
	"strings"
	"testing"

	"github.com/tally-ledger/tally/internal/pgtest"
)

// A small end-to-end run of tally bench admission: every regime gets its row
// and its line against the targets, and the run fails on no invariant.
func TestBenchAdmissionSmall(t *testing.T) {
	out, err := runTally(t, "bench", "admission", "--gateways", "2", "--customers", "4", "--rate", "200",
		"--duration", "1s", "--limit", "40", "--fixed-grant", "5", "--lag-interval", "200ms",
		"--database-url", pgtest.AdminURL())
	if err != nil {
		t.Fatalf("bench: %v\n%s", err, out)
	}
	for _, want := range []string{"2 gateways × 4 customers", "| lagged decisions", "| exact, fixed grant", "| exact, sized by demand",
		"| central counter, Postgres", "central counter, Redis", "grants issued", "targets (docs/design.md §10)"} {
		if !strings.Contains(out, want) {
			t.Errorf("no %q in\n%s", want, out)
		}
	}
	if strings.Contains(out, "PROBLEM") {
		t.Errorf("an invariant failed:\n%s", out)
	}
}

// Bad flags are all reported at once, before any database is made.
func TestBenchAdmissionFlags(t *testing.T) {
	_, err := runTally(t, "bench", "admission", "--gateways", "0", "--burst", "9", "--regimes", "lagged,nosuch",
		"--api-pool-size", "0", "--rounds", "0", "--database-url", "postgres://nobody@127.0.0.1:1/none")
	if err == nil {
		t.Fatal("no error")
	}
	for _, want := range []string{"--gateways must not be 0", "burst: 9", `regimes: "nosuch"`, "--api-pool-size must not be 0",
		"--rounds must not be 0"} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("no %q in %v", want, err)
		}
	}
}

// --budgets runs the hot key: the three ways get their rows, the target
// line and the refusal by global, and no invariant fails.
func TestBenchAdmissionBudgets(t *testing.T) {
	out, err := runTally(t, "bench", "admission", "--budgets", "customer,pool,global", "--holders", "4",
		"--hot-duration", "200ms", "--database-url", pgtest.AdminURL())
	if err != nil {
		t.Fatalf("bench: %v\n%s", err, out)
	}
	for _, want := range []string{"hot key on customer,pool,global", "| exact, REST API", "| exact, admission store in process",
		"| central counter, Postgres", "≥ 2000 grants/s", "4 of 4 refused by global; budgets unchanged: met"} {
		if !strings.Contains(out, want) {
			t.Errorf("no %q in\n%s", want, out)
		}
	}
	if strings.Contains(out, "PROBLEM") {
		t.Errorf("an invariant failed:\n%s", out)
	}
	_, err = runTally(t, "bench", "admission", "--budgets", "pool,plan", "--holders", "0",
		"--database-url", "postgres://nobody@127.0.0.1:1/none")
	for _, want := range []string{`budgets: "plan"`, "--holders"} {
		if err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("no %q in %v", want, err)
		}
	}
}
