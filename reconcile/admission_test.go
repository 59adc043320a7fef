package reconcile_test

import (
	"context"
	"errors"
	"slices"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/shopspring/decimal"

	"github.com/tally-ledger/tally/admission"
	"github.com/tally-ledger/tally/pools"
	"github.com/tally-ledger/tally/quota"
	"github.com/tally-ledger/tally/reconcile"
)

// exactCalls gives acme an exact rule of 100 calls from 2026-11-01 and a
// grant store on the test's clock.
func (e *env) exactCalls(t *testing.T) *admission.Store {
	t.Helper()
	if _, err := quota.PutRuleDB(context.Background(), e.pool, quota.RuleInput{Customer: "acme", Meter: "calls",
		Limit: decimal.NewFromInt(100), Admission: quota.Exact, EffectiveAt: time.Date(2026, 11, 1, 0, 0, 0, 0, time.UTC),
		Actor: "test"}); err != nil {
		t.Fatal(err)
	}
	s, err := admission.New(e.pool, admission.Config{Now: func() time.Time { return e.now }})
	if err != nil {
		t.Fatal(err)
	}
	return s
}

func TestExactAdmissionFindings(t *testing.T) {
	e := newEnv(t)
	ctx := context.Background()
	d := decimal.RequireFromString
	s := e.exactCalls(t)
	issue := func(holder, amt string) admission.Grant {
		g, err := s.Issue(ctx, admission.IssueRequest{Holder: holder, Generation: 1, Customer: "acme", Meter: "calls", Amount: d(amt)})
		if err != nil {
			t.Fatal(err)
		}
		return g
	}
	// Reclaimed without a final report: counted fully spent (50), its
	// unreported 10 stranded.
	g1 := issue("gw1", "50")
	if _, err := s.Renew(ctx, admission.Report{Grant: g1.ID, Holder: "gw1", Generation: 1, Spent: d("40")}); err != nil {
		t.Fatal(err)
	}
	e.now = e.now.Add(time.Minute)
	issue("gw2", "30") // live: may be spent up to 30
	if err := s.RecordBypasses(ctx, admission.BypassReport{Holder: "gw2", Generation: 1, ReportID: "r1", Items: []admission.BypassItem{
		{Customer: "acme", Meter: "calls", Amount: d("5"), Admissions: 5, FirstAt: e.now, LastAt: e.now}}}); err != nil {
		t.Fatal(err)
	}
	if err := s.RecordBypasses(ctx, admission.BypassReport{Holder: "gw3", Generation: 1, ReportID: "r1", Items: []admission.BypassItem{
		{Customer: "acme", Meter: "calls", Amount: d("3"), Admissions: 1, FirstAt: e.now, LastAt: e.now}}}); err != nil {
		t.Fatal(err)
	}
	e.apply(rec("gw", 1, "acme", 1, "120", "120", time.Date(2026, 11, 10, 0, 0, 0, 0, time.UTC)))

	r := e.run(reconcile.Options{Period: "2026-11-01"})
	check := func(kind, amount, detail string) {
		t.Helper()
		fs := findings(t, r, kind)
		if len(fs) != 1 || fs[0].Amount.String() != amount || fs[0].Detail != detail {
			t.Errorf("%s: %+v", kind, fs)
		}
	}
	check(reconcile.KindUngrantedUsage, "32", "120 billed, grants allowed 80 and bypasses 8")
	check(reconcile.KindStranded, "10", "10 granted and never spent (limit 100)")
	check(reconcile.KindBypass, "8", "admitted without a grant while Tally was unreachable: gw2 5, gw3 3")
	if r.Status != reconcile.StatusClean || len(findings(t, r, reconcile.KindOverGranted)) != 0 {
		t.Fatalf("status %s: %+v", r.Status, r.Findings)
	}

	// The budget row's own copy of a limit is not the rule: reconciliation
	// reads the version in force from the rule history.
	e.exec(`UPDATE admission_budgets SET "limit" = 30`)
	r = e.run(reconcile.Options{Period: "2026-11-01"})
	if r.Status != reconcile.StatusClean || len(findings(t, r, reconcile.KindOverGranted)) != 0 {
		t.Fatalf("a budget row's limit made a finding: %s %+v", r.Status, r.Findings)
	}

	// A version of limit 30 in force from the instant the second grant was
	// issued: the first (reclaimed without a final report, so counted at its
	// whole 50) and the second took the budget to 80, 50 above it. A
	// discrepancy.
	if _, err := quota.PutRuleDB(ctx, e.pool, quota.RuleInput{Customer: "acme", Meter: "calls", Limit: d("30"),
		Admission: quota.Exact, EffectiveAt: e.now, Actor: "test"}); err != nil {
		t.Fatal(err)
	}
	r = e.run(reconcile.Options{Period: "2026-11-01"})
	over := findings(t, r, reconcile.KindOverGranted)
	if r.Status != reconcile.StatusDiscrepancies || len(over) != 1 || over[0].Amount.String() != "50" ||
		over[0].Detail != "grants took the budget 50 above the limit of the rule version in force when they were issued (limit now 30, 40 spent)" {
		t.Fatalf("over_granted: %s %+v", r.Status, over)
	}
}

// Pool and global budgets a period's grants drew from are reconciled per
// budget: stranded capacity, and over_granted when a grant took a budget
// above the limit of the version in force when it was issued.
func TestExactAdmissionFindingsPerScope(t *testing.T) {
	e := newEnv(t)
	ctx := context.Background()
	d := decimal.RequireFromString
	s, err := admission.New(e.pool, admission.Config{Now: func() time.Time { return e.now }})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := s.PutPool(ctx, pools.PutInput{Name: "team", Members: []string{"acme"}, Actor: "test"}); err != nil {
		t.Fatal(err)
	}
	for scope, limit := range map[string]string{quota.PoolScope("team"): "100", quota.Global: "1000"} {
		err := pgx.BeginFunc(ctx, e.pool, func(tx pgx.Tx) error {
			_, err := quota.PutScopeRuleAt(ctx, tx, quota.ScopeRuleInput{Scope: scope, Meter: "calls", Limit: d(limit),
				Admission: quota.Exact, Actor: "test"}, e.now)
			return err
		})
		if err != nil {
			t.Fatal(err)
		}
	}
	g, err := s.Issue(ctx, admission.IssueRequest{Holder: "gw", Generation: 1, Customer: "acme", Meter: "calls", Amount: d("50")})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := s.Renew(ctx, admission.Report{Grant: g.ID, Holder: "gw", Generation: 1, Spent: d("40")}); err != nil {
		t.Fatal(err)
	}
	e.now = e.now.Add(time.Minute) // reclaimed without a final report: 10 stranded
	e.apply(rec("gw", 1, "acme", 1, "40", "40", time.Date(2026, 11, 10, 0, 0, 0, 0, time.UTC)))

	r := e.run(reconcile.Options{Period: "2026-11-01"})
	var details []string
	for _, f := range findings(t, r, reconcile.KindStranded) {
		details = append(details, f.Detail)
	}
	slices.Sort(details)
	if want := []string{"global/calls: 10 granted and never spent (limit 1000)",
		"pool:team/calls: 10 granted and never spent (limit 100)"}; !slices.Equal(details, want) {
		t.Fatalf("stranded: %q", details)
	}
	if r.Status != reconcile.StatusClean {
		t.Fatalf("status %s: %+v", r.Status, r.Findings)
	}

	// A pool version of limit 30 in force at the grant's instant (same
	// effective time as the first, a higher version). The grant was
	// reclaimed without a final report, so it counts at its whole 50: 20
	// above.
	err = pgx.BeginFunc(ctx, e.pool, func(tx pgx.Tx) error {
		_, err := quota.PutScopeRuleAt(ctx, tx, quota.ScopeRuleInput{Scope: quota.PoolScope("team"), Meter: "calls", Limit: d("30"),
			Admission: quota.Exact, Actor: "test"}, g.IssuedAt)
		return err
	})
	if err != nil {
		t.Fatal(err)
	}
	r = e.run(reconcile.Options{Period: "2026-11-01"})
	over := findings(t, r, reconcile.KindOverGranted)
	if r.Status != reconcile.StatusDiscrepancies || len(over) != 1 || over[0].Amount.String() != "20" ||
		over[0].Detail != "pool:team/calls: grants took the budget 20 above the limit of the rule version in force when they were issued (limit now 30, 40 spent)" {
		t.Fatalf("over_granted: %s %+v", r.Status, over)
	}
}

// Debits are grants spent in full and released at once: a period whose
// usage was admitted by debits reconciles clean, with nothing stranded and
// no usage the grants did not allow.
func TestDebitsReconcileAsSpentGrants(t *testing.T) {
	e := newEnv(t)
	ctx := context.Background()
	d := decimal.RequireFromString
	s := e.exactCalls(t)
	for _, amt := range []string{"40", "35", "25"} {
		if _, err := s.Debit(ctx, admission.DebitRequest{ID: uuid.New(), Holder: "gw1", Generation: 1, Customer: "acme",
			Meter: "calls", Amount: d(amt)}); err != nil {
			t.Fatal(err)
		}
	}
	_, err := s.Debit(ctx, admission.DebitRequest{ID: uuid.New(), Holder: "gw1", Generation: 1, Customer: "acme", Meter: "calls", Amount: d("1")})
	if _, ok := errors.AsType[*admission.BudgetExhaustedError](err); !ok {
		t.Fatalf("a debit past the limit: %v", err)
	}
	e.apply(rec("gw", 1, "acme", 1, "100", "100", time.Date(2026, 11, 10, 0, 0, 0, 0, time.UTC)))
	r := e.run(reconcile.Options{Period: "2026-11-01"})
	for _, kind := range []string{reconcile.KindUngrantedUsage, reconcile.KindStranded, reconcile.KindOverGranted, reconcile.KindBypass} {
		if fs := findings(t, r, kind); len(fs) != 0 {
			t.Errorf("%s: %+v", kind, fs)
		}
	}
	if r.Status != reconcile.StatusClean {
		t.Fatalf("status %s: %+v", r.Status, r.Findings)
	}
}
