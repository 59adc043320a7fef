package admission_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/shopspring/decimal"

	"github.com/tally-ledger/tally/admission"
	"github.com/tally-ledger/tally/internal/ledgertest"
	"github.com/tally-ledger/tally/ledger"
	"github.com/tally-ledger/tally/periods"
	"github.com/tally-ledger/tally/quota"
)

// The boundaries of exact admission (docs/design.md §12, §13): rule
// versions with future effective times, scope calendars, mode switches,
// renewals, memberships and holders that lost their state.

// putRule stores a customer rule version as given (limit, admission,
// effective time).
func (e *env) putRule(in quota.RuleInput) {
	e.t.Helper()
	in.Actor = "test"
	if _, err := quota.PutRuleDB(context.Background(), e.pool, in); err != nil {
		e.t.Fatalf("put rule: %v", err)
	}
}

// putScopeRule stores a pool or global rule version as given, written at
// the store's clock.
func (e *env) putScopeRule(in quota.ScopeRuleInput) {
	e.t.Helper()
	in.Actor = "test"
	err := pgx.BeginFunc(context.Background(), e.pool, func(tx pgx.Tx) error {
		_, err := quota.PutScopeRuleAt(context.Background(), tx, in, e.clock.Now())
		return err
	})
	if err != nil {
		e.t.Fatalf("put scope rule: %v", err)
	}
}

func (e *env) calendar(customer string, cal periods.Calendar) {
	e.t.Helper()
	if _, _, err := (periods.Store{}).SetCalendar(context.Background(), e.pool, customer, cal); err != nil {
		e.t.Fatalf("set calendar: %v", err)
	}
}

func (e *env) release(g admission.Grant, spent decimal.Decimal) {
	e.t.Helper()
	if _, err := e.store.Release(context.Background(), admission.Report{Grant: g.ID, Holder: g.Holder,
		Generation: g.Generation, Spent: spent}); err != nil {
		e.t.Fatalf("release: %v", err)
	}
}

// issueUpTo asks for amt, accepting any smaller grant of at least 1.
func (e *env) issueUpTo(holder, customer string, amt decimal.Decimal) (admission.Grant, error) {
	return e.store.Issue(context.Background(), admission.IssueRequest{Holder: holder, Generation: 1, Customer: customer,
		Meter: "calls", Amount: amt, MinAmount: decimal.NewNullDecimal(d("1"))})
}

func wantAmount(t *testing.T, g admission.Grant, err error, want string) {
	t.Helper()
	if want == "0" {
		if _, ok := errors.AsType[*admission.BudgetExhaustedError](err); !ok {
			t.Fatalf("got %v (grant of %s), want budget exhausted", err, g.Amount)
		}
		return
	}
	if err != nil {
		t.Fatalf("issue: %v, want a grant of %s", err, want)
	}
	if !g.Amount.Equal(d(want)) {
		t.Fatalf("granted %s, want %s", g.Amount, want)
	}
}

// v1 (limit 1000) in force; v2 (limit 10) effective in 2 s; v3 (limit
// 1000) written later but effective in 1 s. After 2.5 s v2 is in force:
// the latest effective time, whatever the version numbers say.
func TestIssueFollowsTheVersionInForce(t *testing.T) {
	e := newEnv(t)
	now := time.Now().UTC().Truncate(time.Millisecond)
	e.clock.t = now
	e.putRule(quota.RuleInput{Customer: "acme", Meter: "calls", Limit: d("1000"), Admission: quota.Exact, EffectiveAt: now})
	e.putRule(quota.RuleInput{Customer: "acme", Meter: "calls", Limit: d("10"), Admission: quota.Exact, EffectiveAt: now.Add(2 * time.Second)})
	e.putRule(quota.RuleInput{Customer: "acme", Meter: "calls", Limit: d("1000"), Admission: quota.Exact, EffectiveAt: now.Add(time.Second)})
	e.clock.Advance(2500 * time.Millisecond)

	r, err := quota.RuleAt(context.Background(), e.pool, "acme", "calls", e.clock.Now())
	if err != nil || r.Version != 2 {
		t.Fatalf("quota.RuleAt = v%d, %v; want v2 (latest effective time)", r.Version, err)
	}
	g, err := e.issue("gw", "acme", d("500"))
	wantAmount(t, g, err, "0")
	g, err = e.issueUpTo("gw", "acme", d("500"))
	wantAmount(t, g, err, "10")
	if g.RuleVersion != 2 {
		t.Fatalf("grant under v%d, want v2", g.RuleVersion)
	}
}

// A customer's budgets answer the limit of the rule in force, also after a
// cut that no grant followed.
func TestBudgetShowsTheLimitInForce(t *testing.T) {
	e := newEnv(t)
	e.rule("acme", "calls", d("100"))
	g, err := e.issue("gw", "acme", d("10"))
	wantAmount(t, g, err, "10")
	e.clock.Advance(time.Second)
	e.rule("acme", "calls", d("50"))
	b := e.budget("acme", "calls")
	if !b.Limit.Equal(d("50")) || !b.Available.Equal(d("40")) || b.RuleVersion != 2 {
		t.Fatalf("budget limit %s available %s v%d, want 50, 40, v2", b.Limit, b.Available, b.RuleVersion)
	}
}

// A Los Angeles customer uses 900 of a global 1000 in December (UTC). On
// 1 January 00:00:10 UTC (still 31 December in Los Angeles) January's
// global budget is untouched: a UTC customer gets its 1000.
func TestGlobalBudgetCountsInItsOwnCalendar(t *testing.T) {
	e := newEnv(t)
	e.calendar("la", periods.Calendar{Cadence: periods.Monthly, AnchorDay: 1, Zone: "America/Los_Angeles"})
	e.clock.t = time.Date(2026, 12, 31, 20, 0, 0, 0, time.UTC)
	e.scopeRule(quota.Global, "calls", d("1000"))
	g, err := e.issue("gw", "la", d("900"))
	wantAmount(t, g, err, "900")
	e.release(g, d("900"))

	e.clock.t = time.Date(2027, 1, 1, 0, 0, 10, 0, time.UTC)
	g, err = e.issueUpTo("gw", "utc", d("1000"))
	wantAmount(t, g, err, "1000")
}

// A daily-calendar customer uses 90 on 1 December. On 3 December a global
// rule of 100 turns exact: the global budget of December starts at 90.
func TestScopeTurningExactCountsTheScopePeriod(t *testing.T) {
	e := newEnv(t)
	e.calendar("daily", periods.Calendar{Cadence: periods.Daily})
	e.clock.t = time.Date(2026, 12, 1, 10, 0, 0, 0, time.UTC)
	e.rule("daily", "calls", d("1000"))
	g, err := e.issue("gw", "daily", d("90"))
	wantAmount(t, g, err, "90")
	e.release(g, d("90"))

	e.clock.t = time.Date(2026, 12, 3, 10, 0, 0, 0, time.UTC)
	e.scopeRule(quota.Global, "calls", d("100"))
	g, err = e.issueUpTo("gw", "daily", d("100"))
	wantAmount(t, g, err, "10")
}

// The same customer joins a pool of 100 on 3 December: the pool counts
// the 90 of 1 December (its own, monthly period).
func TestJoiningCountsTheScopePeriod(t *testing.T) {
	e := newEnv(t)
	e.calendar("daily", periods.Calendar{Cadence: periods.Daily})
	e.clock.t = time.Date(2026, 12, 1, 10, 0, 0, 0, time.UTC)
	e.rule("daily", "calls", d("1000"))
	e.scopeRule(quota.PoolScope("p"), "calls", d("100"))
	e.putPool("p", "other")
	g, err := e.issue("gw", "other", d("1"))
	wantAmount(t, g, err, "1")
	g, err = e.issue("gw", "daily", d("90"))
	wantAmount(t, g, err, "90")
	e.release(g, d("90"))

	e.clock.t = time.Date(2026, 12, 3, 10, 0, 0, 0, time.UTC)
	e.putPool("p", "other", "daily")
	g, err = e.issueUpTo("gw", "daily", d("100"))
	wantAmount(t, g, err, "9")
}

// Pool limit 100, exact; grant 10; the rule turns lagged; grant 80 (from
// the customer's budget only); the rule turns exact again: 10 are left.
func TestExactLaggedExactRemembersTheGrants(t *testing.T) {
	e := newEnv(t)
	pool := quota.PoolScope("p")
	e.rule("c", "calls", d("1000"))
	e.putScopeRule(quota.ScopeRuleInput{Scope: pool, Meter: "calls", Limit: d("100"), Admission: quota.Exact})
	e.putPool("p", "c")
	g, err := e.issue("gw", "c", d("10"))
	wantAmount(t, g, err, "10")
	e.clock.Advance(time.Second)
	e.putScopeRule(quota.ScopeRuleInput{Scope: pool, Meter: "calls", Limit: d("100"), Admission: quota.Lagged})
	g, err = e.issue("gw", "c", d("80"))
	wantAmount(t, g, err, "80")
	if len(g.Budgets) != 1 {
		t.Fatalf("lagged pool: grant drew from %v, want the customer's budget only", g.Budgets)
	}
	e.clock.Advance(time.Second)
	e.putScopeRule(quota.ScopeRuleInput{Scope: pool, Meter: "calls", Limit: d("100"), Admission: quota.Exact})
	g, err = e.issueUpTo("gw", "c", d("90"))
	wantAmount(t, g, err, "10")
}

// A customer rule that turns exact mid-period starts from the usage
// already metered this period; one that turns exact again remembers the
// grants issued and the usage metered while it was lagged.
func TestCustomerTurningExactStartsFromThePeriod(t *testing.T) {
	e := newEnv(t)
	l, err := ledger.New(ledger.Config{Clock: e.clock.Now})
	if err != nil {
		t.Fatal(err)
	}
	use := ledgertest.New(e.pool, l)
	e.putRule(quota.RuleInput{Customer: "c", Meter: "calls", Limit: d("100"), EffectiveAt: e.clock.Now()})
	use.Use(t, "c", "calls", e.clock.Now(), d("70"))
	e.clock.Advance(time.Second)
	e.putRule(quota.RuleInput{Customer: "c", Meter: "calls", Limit: d("100"), Admission: quota.Exact, EffectiveAt: e.clock.Now()})
	g, err := e.issueUpTo("gw", "c", d("100"))
	wantAmount(t, g, err, "30")
	e.release(g, d("0"))

	e.clock.Advance(time.Second)
	e.putRule(quota.RuleInput{Customer: "c", Meter: "calls", Limit: d("100"), EffectiveAt: e.clock.Now()})
	use.Use(t, "c", "calls", e.clock.Now(), d("20"))
	e.clock.Advance(time.Second)
	e.putRule(quota.RuleInput{Customer: "c", Meter: "calls", Limit: d("100"), Admission: quota.Exact, EffectiveAt: e.clock.Now()})
	g, err = e.issueUpTo("gw", "c", d("100"))
	wantAmount(t, g, err, "10")
}

// A grant renewed at 23:59:55 UTC on 31 December by a Los Angeles customer
// drawing from the global budget never lives into January.
func TestRenewStopsAtEveryPeriodDrawn(t *testing.T) {
	e := newEnv(t)
	e.calendar("la", periods.Calendar{Cadence: periods.Monthly, AnchorDay: 1, Zone: "America/Los_Angeles"})
	e.clock.t = time.Date(2026, 12, 31, 23, 59, 30, 0, time.UTC)
	e.rule("la", "calls", d("1000"))
	e.scopeRule(quota.Global, "calls", d("1000"))
	g, err := e.store.Issue(context.Background(), admission.IssueRequest{Holder: "gw", Generation: 1, Customer: "la",
		Meter: "calls", Amount: d("10"), TTL: 10 * time.Second})
	wantAmount(t, g, err, "10")
	e.clock.t = time.Date(2026, 12, 31, 23, 59, 35, 0, time.UTC)
	r, err := e.store.Renew(context.Background(), admission.Report{Grant: g.ID, Holder: "gw", Generation: 1,
		Spent: d("1"), TTL: 30 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	if end := time.Date(2027, 1, 1, 0, 0, 0, 0, time.UTC); r.ValidUntil.After(end) {
		t.Fatalf("renewed until %v, past the global period's end %v", r.ValidUntil, end)
	}
}

// A grant decided while the global rule was lagged, still uncommitted when
// the rule turns exact, is counted by the global budget: the next grant
// waits for it.
func TestScopeTurningExactWaitsForGrantsInFlight(t *testing.T) {
	e := newEnv(t)
	ctx := context.Background()
	e.rule("a", "calls", d("1000"))
	e.putScopeRule(quota.ScopeRuleInput{Scope: quota.Global, Meter: "calls", Limit: d("100"), Admission: quota.Lagged})
	tx, err := e.pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer tx.Rollback(ctx)
	g, err := e.store.IssueTx(ctx, tx, admission.IssueRequest{Holder: "gw", Generation: 1, Customer: "a", Meter: "calls", Amount: d("60")})
	wantAmount(t, g, err, "60")

	e.clock.Advance(time.Second)
	e.putScopeRule(quota.ScopeRuleInput{Scope: quota.Global, Meter: "calls", Limit: d("100"), Admission: quota.Exact})
	type result struct {
		g   admission.Grant
		err error
	}
	done := make(chan result, 1)
	go func() {
		g, err := e.issueUpTo("gw", "b", d("100"))
		done <- result{g, err}
	}()
	select {
	case r := <-done:
		if r.err == nil && r.g.Amount.GreaterThan(d("40")) {
			t.Fatalf("granted %s from the global budget while 60 were in flight", r.g.Amount)
		}
	case <-time.After(300 * time.Millisecond):
	}
	if err := tx.Commit(ctx); err != nil {
		t.Fatal(err)
	}
	r := <-done
	wantAmount(t, r.g, r.err, "40")
}

// A customer that leaves a pool and rejoins it in the same period is
// counted once.
func TestLeaveAndRejoinCountsOnce(t *testing.T) {
	e := newEnv(t)
	e.scopeRule(quota.PoolScope("p"), "calls", d("100"))
	e.putPool("p", "c")
	g, err := e.issue("gw", "c", d("30"))
	wantAmount(t, g, err, "30")
	e.release(g, d("30"))
	e.clock.Advance(time.Second)
	e.putPool("p")
	e.clock.Advance(time.Second)
	e.putPool("p", "c")
	if got := e.scopeConsumed(quota.PoolScope("p"), "calls"); !got.Equal(d("30")) {
		t.Fatalf("pool consumed %s after leave and rejoin, want 30", got)
	}
	g, err = e.issue("gw", "c", d("70"))
	wantAmount(t, g, err, "70")
}

// A holder that lost its state starts again at generation 1: the refusal
// names the next generation, above any stored one, and the holder
// recovers with it; its old generation is fenced from then on.
func TestHolderThatLostItsStateRecovers(t *testing.T) {
	e := newEnv(t)
	ctx := context.Background()
	e.rule("acme", "calls", d("100"))
	old, err := e.store.Issue(ctx, admission.IssueRequest{Holder: "gw", Generation: 5, Customer: "acme", Meter: "calls", Amount: d("10")})
	wantAmount(t, old, err, "10")
	_, err = e.issue("gw", "acme", d("10")) // generation 1
	se, ok := errors.AsType[*admission.StaleGenerationError](err)
	if !ok || se.Next != 6 {
		t.Fatalf("got %v, want stale generation naming next generation 6", err)
	}
	g, err := e.store.Issue(ctx, admission.IssueRequest{Holder: "gw", Generation: se.Next, Customer: "acme", Meter: "calls", Amount: d("10")})
	wantAmount(t, g, err, "10")
	if _, err := e.store.Renew(ctx, admission.Report{Grant: old.ID, Holder: "gw", Generation: 5, Spent: d("1")}); err == nil {
		t.Fatal("the old generation renewed after the holder recovered")
	}
}

// A bypass report whose id clashes with a stored report of other content
// is refused, never dropped; the same report sent again is stored once.
func TestBypassReportIsNeverDroppedSilently(t *testing.T) {
	e := newEnv(t)
	ctx := context.Background()
	e.rule("acme", "calls", d("100"))
	g, err := e.issue("gw", "acme", d("1"))
	wantAmount(t, g, err, "1")
	at := e.clock.Now()
	rep := func(amt string) admission.BypassReport {
		return admission.BypassReport{Holder: "gw", Generation: 1, ReportID: "bypass-1-0", Items: []admission.BypassItem{
			{Customer: "acme", Meter: "calls", Amount: d(amt), Admissions: 1, FirstAt: at, LastAt: at}}}
	}
	if err := e.store.RecordBypasses(ctx, rep("5")); err != nil {
		t.Fatal(err)
	}
	if err := e.store.RecordBypasses(ctx, rep("5")); err != nil {
		t.Fatalf("the same report again: %v", err)
	}
	err = e.store.RecordBypasses(ctx, rep("7"))
	if _, ok := errors.AsType[*admission.BypassConflictError](err); !ok {
		t.Fatalf("a different report under a stored id: %v, want a bypass conflict", err)
	}
	if b := e.budget("acme", "calls"); !b.Bypassed.Equal(d("5")) {
		t.Fatalf("bypassed %s, want 5", b.Bypassed)
	}
}

// Bringing a budget to a new rule version is counted, by kind.
func TestBroughtBudgetsAreCounted(t *testing.T) {
	e := newEnv(t)
	reg := prometheus.NewRegistry()
	s, err := admission.New(e.pool, admission.Config{Now: e.clock.Now, Registerer: reg})
	if err != nil {
		t.Fatal(err)
	}
	issue := func() {
		t.Helper()
		if _, err := s.Issue(context.Background(), admission.IssueRequest{Holder: "gw", Generation: 1, Customer: "acme",
			Meter: "calls", Amount: d("1")}); err != nil {
			t.Fatal(err)
		}
	}
	e.rule("acme", "calls", d("100"))
	e.scopeRule(quota.Global, "calls", d("100"))
	issue()
	issue()
	e.clock.Advance(time.Second)
	e.scopeRule(quota.Global, "calls", d("90"))
	issue()
	brought := func(kind string) float64 {
		return counted(t, reg, "tally_admission_budgets_brought_total", "kind", kind)
	}
	if c, g := brought("customer"), brought("scope"); c != 1 || g != 2 {
		t.Fatalf("brought customer %v scope %v, want 1 (its first grant) and 2 (first grant, new version)", c, g)
	}
}
