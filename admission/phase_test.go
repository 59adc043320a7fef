package admission_test

import (
	"context"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
)

// observed is the count and sum of the histogram name whose labels
// include every one of labels in reg.
func observed(t *testing.T, reg *prometheus.Registry, name string, labels map[string]string) (uint64, time.Duration) {
	t.Helper()
	h := series(t, reg, name, labels).GetHistogram()
	return h.GetSampleCount(), time.Duration(h.GetSampleSum() * float64(time.Second))
}

// The phases say where a request waited: a grant request whose budget
// row another transaction holds spends that wait in Postgres; a second
// one for the same customer, arriving meanwhile, waits in the queue for
// the first's transaction to end (it locks the same row); a debit's plan,
// connection and transaction are observed too.
func TestPhasesSayWhereARequestWaited(t *testing.T) {
	e := newEnv(t)
	reg := e.withRegistry()
	e.rule("a", "calls", d("100"))
	if _, err := e.issue("gw", "a", d("1")); err != nil { // creates the rows
		t.Fatal(err)
	}
	phase := func(path, name string) (uint64, time.Duration) {
		return observed(t, reg, "tally_admission_phase_seconds", map[string]string{"path": path, "phase": name})
	}
	n0, pg0 := phase("grant", "postgres")
	_, q0 := phase("grant", "queue")

	const hold = 300 * time.Millisecond
	tx := e.holding(`SELECT 1 FROM admission_budgets WHERE customer = 'a' FOR UPDATE`)
	errs := make(chan error, 2)
	go func() { _, err := e.issue("gw", "a", d("1")); errs <- err }()
	for e.lockWaiters("") == 0 { // the first request's transaction waits for the row
		time.Sleep(5 * time.Millisecond)
	}
	go func() { _, err := e.issue("gw2", "a", d("1")); errs <- err }()
	time.Sleep(hold)
	if err := tx.Rollback(context.Background()); err != nil {
		t.Fatal(err)
	}
	for range 2 {
		if err := <-errs; err != nil {
			t.Fatal(err)
		}
	}
	n1, pg1 := phase("grant", "postgres")
	_, q1 := phase("grant", "queue")
	if n1-n0 != 2 {
		t.Fatalf("%d grant transactions observed, want 2", n1-n0)
	}
	if pg1-pg0 < hold {
		t.Errorf("grants spent %v in Postgres, want at least the %v the row was held", pg1-pg0, hold)
	}
	if q1-q0 < hold*2/3 {
		t.Errorf("grants queued %v, want about the %v the second waited for the first's transaction", q1-q0, hold)
	}
	if n, _ := phase("grant", "plan"); n < 3 {
		t.Errorf("%d grant plans observed, want 3", n)
	}
	if n, _ := phase("grant", "connection"); n < 3 {
		t.Errorf("%d grant connection waits observed, want 3", n)
	}

	if _, err := e.debit("gw", 1, "a", d("1")); err != nil {
		t.Fatal(err)
	}
	for _, ph := range []string{"plan", "connection", "postgres"} {
		if n, _ := phase("debit", ph); n != 1 {
			t.Errorf("debit %s observed %d times, want 1", ph, n)
		}
	}
	if n, _ := phase("debit", "queue"); n != 0 {
		t.Errorf("a one-round-trip debit queued %d times, want 0", n)
	}
}

// A request's plan, when none is cached (its customer's first request, or
// one past the plan's age), reads the rule, the calendar, the pools and
// the rate budgets that apply in one round trip on one connection: under
// load each read of its own waited for a connection in turn. The issue
// then takes one more connection for its transaction.
func TestAPlanIsOneRoundTrip(t *testing.T) {
	e := newEnv(t)
	e.rule("a", "calls", d("100"))
	before := e.pool.Stat().AcquireCount()
	if _, err := e.issue("gw", "a", d("1")); err != nil {
		t.Fatal(err)
	}
	if n := e.pool.Stat().AcquireCount() - before; n != 2 {
		t.Fatalf("a grant request with no plan cached took %d connections, want 2 (its plan, its transaction)", n)
	}
}
