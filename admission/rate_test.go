package admission_test

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/shopspring/decimal"

	"github.com/tally-ledger/tally/admission"
	"github.com/tally-ledger/tally/internal/pgtest"
	"github.com/tally-ledger/tally/pools"
	"github.com/tally-ledger/tally/quota"
)

// rateEnv is a Store on the real clock: rate buckets refill on Postgres's.
func rateEnv(t testing.TB) *env {
	t.Helper()
	pool := pgtest.New(t)
	s, err := admission.New(pool, admission.Config{})
	if err != nil {
		t.Fatal(err)
	}
	return &env{t: t, pool: pool, store: s}
}

// rateRule stores a rate rule version for a customer (scope "customer:<id>")
// or a pool or global scope, effective at at (zero: now).
func (e *env) rateRule(scope, meter, amount, per, burst string, maxSkew time.Duration, at time.Time) {
	e.t.Helper()
	p, err := time.ParseDuration(per)
	if err != nil {
		e.t.Fatal(err)
	}
	rate := &quota.Rate{Amount: d(amount), Per: quota.DurationText(p), Burst: d(burst)}
	ctx := context.Background()
	if c, ok := rateCustomerOf(scope); ok {
		_, err = quota.PutRuleDB(ctx, e.pool, quota.RuleInput{Customer: c, Meter: meter, Rate: rate, MaxSkew: maxSkew,
			Admission: quota.Exact, EffectiveAt: at, Actor: "test"})
	} else {
		err = pgx.BeginFunc(ctx, e.pool, func(tx pgx.Tx) error {
			_, err := quota.PutScopeRule(ctx, tx, quota.ScopeRuleInput{Scope: scope, Meter: meter, Rate: rate, MaxSkew: maxSkew,
				Admission: quota.Exact, EffectiveAt: at, Actor: "test"})
			return err
		})
	}
	if err != nil {
		e.t.Fatalf("put rate rule: %v", err)
	}
}

func rateCustomerOf(scope string) (string, bool) {
	const p = "customer:"
	if len(scope) > len(p) && scope[:len(p)] == p {
		return scope[len(p):], true
	}
	return "", false
}

func (e *env) issueRate(holder, customer, amount string) (admission.Grant, error) {
	return e.store.Issue(context.Background(), admission.IssueRequest{Holder: holder, Generation: 1, Customer: customer,
		Meter: "calls", Amount: d(amount)})
}

func exhaustedBy(t *testing.T, err error, binding string) *admission.BudgetExhaustedError {
	t.Helper()
	var ex *admission.BudgetExhaustedError
	if !errors.As(err, &ex) || ex.Binding != binding {
		t.Fatalf("got %v, want budget_exhausted by %s", err, binding)
	}
	return ex
}

// A grant takes tokens from the bucket; a release puts the unspent part
// back; a lowered burst clamps at once; a raised one hands out nothing
// new; rate grants are short and say their max_skew.
func TestRateBucket(t *testing.T) {
	e := rateEnv(t)
	ctx := context.Background()
	// 1 per hour: the refill during the test is below 0.01.
	e.rateRule("customer:acme", "calls", "1", "1h", "20", 250*time.Millisecond, time.Time{})
	g, err := e.issueRate("gw1", "acme", "20")
	if err != nil {
		t.Fatal(err)
	}
	if ttl := g.ValidUntil.Sub(g.IssuedAt); ttl != admission.DefaultRateTTL {
		t.Errorf("ttl %v, want %v", ttl, admission.DefaultRateTTL)
	}
	if skew := g.ReclaimAt.Sub(g.ValidUntil); skew != 250*time.Millisecond {
		t.Errorf("reclaim_at - valid_until = %v, want the rule's max_skew 250ms", skew)
	}
	ex := exhaustedBy(t, second(e.issueRate("gw2", "acme", "1")), "customer:acme/calls")
	if ex.RetryAfter < 50*time.Minute || ex.RetryAfter > time.Hour {
		t.Errorf("retry_after %v, want about an hour (one token at 1/h)", ex.RetryAfter)
	}
	if !g.Rate {
		t.Error("a grant on a rate budget does not say rate")
	}
	if _, err := e.store.Release(ctx, admission.Report{Grant: g.ID, Holder: "gw1", Generation: 1, Spent: d("5")}); err != nil {
		t.Fatal(err)
	}
	exhaustedBy(t, second(e.issueRate("gw2", "acme", "16")), "customer:acme/calls")
	g2, err := e.issueRate("gw2", "acme", "15")
	if err != nil {
		t.Fatalf("15 returned tokens: %v", err)
	}
	if _, err := e.store.Release(ctx, admission.Report{Grant: g2.ID, Holder: "gw2", Generation: 1, Spent: d("0")}); err != nil {
		t.Fatal(err)
	}
	// Lower the burst to 3: the bucket (15) clamps to 3 at once.
	e.rateRule("customer:acme", "calls", "1", "1h", "3", 0, time.Time{})
	exhaustedBy(t, second(e.issueRate("gw2", "acme", "4")), "customer:acme/calls")
	g3, err := e.store.Issue(ctx, admission.IssueRequest{Holder: "gw2", Generation: 1, Customer: "acme", Meter: "calls",
		Amount: d("3"), TTL: 30 * time.Second})
	if err != nil {
		t.Fatalf("3 after the clamp: %v", err)
	}
	if ttl := g3.ValidUntil.Sub(g3.IssuedAt); ttl != admission.MaxRateTTL {
		t.Errorf("ttl 30s asked on a rate budget: %v, want it shortened to %v", ttl, admission.MaxRateTTL)
	}
	if skew := g3.ReclaimAt.Sub(g3.ValidUntil); skew != admission.DefaultMaxSkew {
		t.Errorf("without a rule max_skew: reclaim margin %v, want %v", skew, admission.DefaultMaxSkew)
	}
	// Raise it to 100: a new version carries the (empty) bucket over.
	e.rateRule("customer:acme", "calls", "1", "1h", "100", 0, time.Time{})
	exhaustedBy(t, second(e.issueRate("gw3", "acme", "1")), "customer:acme/calls")
	// A release never fills above the burst in force.
	if _, err := e.store.Release(ctx, admission.Report{Grant: g3.ID, Holder: "gw2", Generation: 1, Spent: d("1")}); err != nil {
		t.Fatal(err)
	}
	if tok := e.tokens("customer:acme", "calls"); tok.LessThan(d("2")) || tok.GreaterThan(d("2.01")) {
		t.Errorf("tokens %s after returning 2, want 2 (plus a refill below 0.01)", tok)
	}
	// What the console and REST show: g2 was released, g3 too; the first
	// grant's tokens 20, 15 and 3 were taken, 15 + 15 + 2 returned less
	// the refill since each was taken (below 0.01; the clamp took 12 of
	// them away), four requests refused.
	bs, err := e.store.RateBudgets(ctx, "customer:acme")
	if err != nil || len(bs) != 1 {
		t.Fatalf("rate budgets %v: %+v", err, bs)
	}
	b := bs[0]
	if !b.Burst.Equal(d("100")) || b.Per != "1h" || !b.Taken.Equal(d("38")) || b.Returned.GreaterThan(d("32")) || b.Returned.LessThan(d("31.99")) ||
		b.Refused != 4 || !b.Live.IsZero() || !b.Stranded.IsZero() || b.Tokens.LessThan(d("2")) {
		t.Errorf("rate budget %+v", b)
	}
}

// A refusal by a rate bucket tells when the bucket holds what the request
// needs (its min_amount, when it gives one), and says held 0 even while
// another holder's grant holds tokens: a refused gateway waits for the
// refill, it does not ask again at once (docs/design.md §17).
func TestRateRefusalWaitsForWhatTheRequestNeeds(t *testing.T) {
	e := rateEnv(t)
	// 1 per hour: one token an hour, the refill during the test below 0.01.
	e.rateRule("customer:acme", "calls", "1", "1h", "20", 0, time.Time{})
	if _, err := e.issueRate("gw1", "acme", "20"); err != nil {
		t.Fatal(err)
	}
	_, err := e.store.Issue(context.Background(), admission.IssueRequest{Holder: "gw2", Generation: 1, Customer: "acme",
		Meter: "calls", Amount: d("10"), MinAmount: decimal.NewNullDecimal(d("2"))})
	ex := exhaustedBy(t, err, "customer:acme/calls")
	if ex.RetryAfter < 119*time.Minute || ex.RetryAfter > 2*time.Hour {
		t.Errorf("retry_after %v, want about two hours (min_amount 2 at 1/h, not the 10 asked)", ex.RetryAfter)
	}
	if !ex.Held.IsZero() {
		t.Errorf("held %s on a rate bucket's refusal, want 0", ex.Held)
	}
}

// A grant draws from its rate and period budgets all or nothing: a period
// budget that refuses takes nothing from the bucket, and the reverse.
func TestRateAllOrNothingWithPeriodBudgets(t *testing.T) {
	e := rateEnv(t)
	ctx := context.Background()
	e.rateRule("customer:acme", "calls", "1", "1h", "10", 0, time.Time{})
	if err := pgx.BeginFunc(ctx, e.pool, func(tx pgx.Tx) error {
		_, err := quota.PutScopeRule(ctx, tx, quota.ScopeRuleInput{Scope: quota.Global, Meter: "calls", Limit: d("4"),
			Admission: quota.Exact, Actor: "test"})
		return err
	}); err != nil {
		t.Fatal(err)
	}
	exhaustedBy(t, second(e.issueRate("gw1", "acme", "5")), "global/calls")
	if tok := e.tokens("customer:acme", "calls"); tok.LessThan(d("10")) {
		t.Fatalf("refused by global, the bucket holds %s, want 10", tok)
	}
	g, err := e.issueRate("gw1", "acme", "4")
	if err != nil {
		t.Fatal(err)
	}
	if len(g.Budgets) != 2 || g.Budgets[0] != "customer:acme" || g.Budgets[1] != "global" {
		t.Errorf("budgets %v, want [customer:acme global]", g.Budgets)
	}
	got, err := e.store.Get(ctx, g.ID)
	if err != nil || len(got.Budgets) != 2 {
		t.Fatalf("read back %v budgets %v", err, got.Budgets)
	}
	// The global budget is spent; a pool's rate bucket refuses before it.
	e.rateRule(quota.Global, "other", "1", "1h", "1", 0, time.Time{})
	_, err = e.store.Issue(ctx, admission.IssueRequest{Holder: "gw1", Generation: 1, Customer: "acme", Meter: "other", Amount: d("2")})
	exhaustedBy(t, err, "global/other")
	if tok := e.tokens("customer:acme", "calls"); tok.GreaterThan(d("6.01")) || tok.LessThan(d("6")) {
		t.Fatalf("bucket %s, want 6", tok)
	}
}

func second[T any](_ T, err error) error { return err }

// tokens is the bucket's tokens refilled to now.
func (e *env) tokens(scope, meter string) decimal.Decimal {
	e.t.Helper()
	var s string
	err := pgx.BeginFunc(context.Background(), e.pool, func(tx pgx.Tx) error {
		return tx.QueryRow(context.Background(), `SELECT admission_rate_refill($1, $2, now())::text`, scope, meter).Scan(&s)
	})
	if err != nil {
		e.t.Fatal(err)
	}
	return decimal.RequireFromString(s)
}

// Reconciliation's view: a grant reclaimed without a final report is
// stranded (never given back), releases keep the bucket balanced.
func TestRateAccounts(t *testing.T) {
	e := rateEnv(t)
	ctx := context.Background()
	e.rateRule("customer:acme", "calls", "1", "1h", "10", 100*time.Millisecond, time.Time{})
	silent, err := e.issueRate("gw1", "acme", "4")
	if err != nil {
		t.Fatal(err)
	}
	g, err := e.issueRate("gw2", "acme", "3")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := e.store.Release(ctx, admission.Report{Grant: g.ID, Holder: "gw2", Generation: 1, Spent: d("1")}); err != nil {
		t.Fatal(err)
	}
	time.Sleep(time.Until(silent.ReclaimAt) + 50*time.Millisecond)
	accts, err := admission.RateAccounts(ctx, e.pool, []string{"acme"}, []time.Time{silent.PeriodStart}, time.Now())
	if err != nil || len(accts) != 1 {
		t.Fatalf("accounts %v: %+v", err, accts)
	}
	if a := accts[0]; a.Scope != "customer:acme" || !a.Stranded.Equal(d("4")) ||
		a.Unbalanced.IsPositive() || a.Unbalanced.LessThan(d("-0.01")) {
		// A release gives back its unspent part less the refill since it
		// was taken (below 0.01 at 1/h): never more.
		t.Errorf("account %+v: want 4 stranded, balanced (less the refill at most)", a)
	}
	bs, err := e.store.RateBudgetsOf(ctx, "acme")
	if err != nil || len(bs) != 1 || !bs[0].Stranded.Equal(d("4")) || !bs[0].Live.IsZero() {
		t.Fatalf("rate budgets %v: %+v", err, bs)
	}
}

// Releases given back together (one batch, ReleaseAll) return exactly the
// sum of their unspent parts to the bucket they drew from, once; a renew in
// a batch never extends a rate grant.
func TestRateReleasesInOneBatch(t *testing.T) {
	e := rateEnv(t)
	ctx := context.Background()
	e.rateRule("customer:acme", "calls", "1", "1h", "30", 0, time.Time{})
	var gs []admission.Grant
	for range 3 {
		g, err := e.issueRate("gw1", "acme", "10")
		if err != nil {
			t.Fatal(err)
		}
		gs = append(gs, g)
	}
	exhaustedBy(t, second(e.issueRate("gw2", "acme", "1")), "customer:acme/calls")
	renewed, err := e.store.Renew(ctx, admission.Report{Grant: gs[0].ID, Holder: "gw1", Generation: 1, Spent: d("1"), TTL: 5 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	if renewed.ValidUntil.After(gs[0].ValidUntil) {
		t.Errorf("a renew extended a rate grant from %v to %v", gs[0].ValidUntil, renewed.ValidUntil)
	}
	// Unspent: 10-4 + 10-0 + 10-10 = 16.
	_, errs := e.store.ReleaseAll(ctx, []admission.Report{
		{Grant: gs[0].ID, Holder: "gw1", Generation: 1, Spent: d("4")},
		{Grant: gs[1].ID, Holder: "gw1", Generation: 1, Spent: d("0")},
		{Grant: gs[2].ID, Holder: "gw1", Generation: 1, Spent: d("10")},
	})
	for i, err := range errs {
		if err != nil {
			t.Fatalf("release %d: %v", i, err)
		}
	}
	exhaustedBy(t, second(e.issueRate("gw2", "acme", "17")), "customer:acme/calls")
	// 16 come back less the refill since each grant was taken (below 0.01).
	if _, err := e.issueRate("gw2", "acme", "15.99"); err != nil {
		t.Fatalf("16 returned tokens: %v", err)
	}
}

// Renew never extends a rate grant, so it never moves its reclaim either:
// reclaim_at stays valid_until + the rule's max_skew, not the
// deployment's (docs/design.md §17).
func TestRenewKeepsARateGrantsReclaim(t *testing.T) {
	e := rateEnv(t)
	ctx := context.Background()
	e.rateRule("customer:acme", "calls", "1", "1h", "20", 250*time.Millisecond, time.Time{})
	g, err := e.issueRate("gw1", "acme", "10")
	if err != nil {
		t.Fatal(err)
	}
	r, err := e.store.Renew(ctx, admission.Report{Grant: g.ID, Holder: "gw1", Generation: 1, Spent: d("2")})
	if err != nil {
		t.Fatal(err)
	}
	stored, err := e.store.Get(ctx, g.ID)
	if err != nil {
		t.Fatal(err)
	}
	for name, x := range map[string]admission.Grant{"answer": r, "stored": stored} {
		if !x.ValidUntil.Equal(g.ValidUntil) || !x.ReclaimAt.Equal(g.ReclaimAt) {
			t.Errorf("%s after renew: valid_until %v reclaim_at %v, want the issue's %v and %v (max_skew 250ms)",
				name, x.ValidUntil, x.ReclaimAt, g.ValidUntil, g.ReclaimAt)
		}
	}
}

// A request for more than a rate bucket's burst (its min_amount, or its
// amount without one) is refused without a retry_after: no refill makes
// the bucket hold it (it answered the time to refill what was asked, which
// never came). Within the burst, the refill time is answered as before.
func TestMoreThanTheBurstIsNeverRetried(t *testing.T) {
	e := rateEnv(t)
	e.rateRule("customer:acme", "calls", "10", "1s", "20", 0, time.Time{})
	_, err := e.issueRate("gw1", "acme", "30")
	ex := exhaustedBy(t, err, "customer:acme/calls")
	if ex.RetryAfter != 0 || !ex.Burst.Valid || !ex.Burst.Decimal.Equal(d("20")) || !strings.Contains(ex.Error(), "more than the burst 20") {
		t.Fatalf("30 on a burst of 20: retry after %v, burst %v: %v", ex.RetryAfter, ex.Burst, ex)
	}
	_, err = e.store.Issue(context.Background(), admission.IssueRequest{Holder: "gw1", Generation: 1, Customer: "acme",
		Meter: "calls", Amount: d("30"), MinAmount: decimal.NullDecimal{Decimal: d("25"), Valid: true}})
	if ex := exhaustedBy(t, err, "customer:acme/calls"); ex.RetryAfter != 0 || !ex.Burst.Valid {
		t.Fatalf("min_amount 25 on a burst of 20: %v", ex)
	}
	if _, err := e.issueRate("gw1", "acme", "15"); err != nil {
		t.Fatal(err)
	}
	_, err = e.issueRate("gw1", "acme", "10")
	if ex := exhaustedBy(t, err, "customer:acme/calls"); ex.RetryAfter <= 0 || ex.Burst.Valid {
		t.Fatalf("10 with 5 left of a burst of 20: %v (burst %v)", ex, ex.Burst)
	}
}

// TestRateBudgetsReadTheStoresClock: a rate budget lists its grants as
// live or stranded, and a customer's rate budgets include its pools', by
// the clock the Store wrote them with (a grant's reclaim_at, a member's
// joined_at), as issuing does: with the Store's clock an hour ahead of
// Postgres's, a grant past its reclaim is stranded, and a customer that
// joined a pool lists the pool's rate budget it draws from.
func TestRateBudgetsReadTheStoresClock(t *testing.T) {
	pool := pgtest.New(t)
	s, err := admission.New(pool, admission.Config{Now: func() time.Time { return time.Now().Add(time.Hour) }})
	if err != nil {
		t.Fatal(err)
	}
	e := &env{t: t, pool: pool, store: s}
	ctx := context.Background()
	e.rateRule("customer:acme", "calls", "1", "1h", "10", 100*time.Millisecond, time.Time{})
	e.rateRule("pool:team", "calls", "1", "1h", "10", 100*time.Millisecond, time.Time{})
	if _, err := e.store.PutPool(ctx, pools.PutInput{Name: "team", Members: []string{"acme"}, Actor: "test"}); err != nil {
		t.Fatal(err)
	}
	g, err := e.issueRate("gw1", "acme", "4")
	if err != nil {
		t.Fatal(err)
	}
	if got := g.Budgets; !slices.Equal(got, []string{"customer:acme", "pool:team"}) {
		t.Fatalf("the grant drew from %v, want acme's and team's rate budgets", got)
	}
	time.Sleep(time.Until(g.ReclaimAt.Add(-time.Hour)) + 50*time.Millisecond) // reclaimed by the Store's clock
	bs, err := e.store.RateBudgetsOf(ctx, "acme")
	if err != nil {
		t.Fatal(err)
	}
	var got []string
	for _, b := range bs {
		got = append(got, fmt.Sprintf("%s live %s stranded %s", b.Scope, b.Live, b.Stranded))
	}
	if want := []string{"customer:acme live 0 stranded 4", "pool:team live 0 stranded 4"}; !slices.Equal(got, want) {
		t.Fatalf("rate budgets of acme %q, want %q", got, want)
	}
}

// TestRateRuleWrittenByAClockAheadOfTheDatabases: an API host whose clock
// is ahead of Postgres's writes a new rate rule in force from its own
// instant, and its Store plans by that clock; the batch that issues under
// the buckets' locks reads the rule in force by the same clock, so the
// rule applies at once instead of every grant failing as "the budgets
// kept changing" until Postgres's clock catches up. The buckets still
// refill by Postgres's clock, the one every process shares.
func TestRateRuleWrittenByAClockAheadOfTheDatabases(t *testing.T) {
	pool := pgtest.New(t)
	ahead := func() time.Time { return time.Now().Add(time.Hour) }
	s, err := admission.New(pool, admission.Config{Now: ahead})
	if err != nil {
		t.Fatal(err)
	}
	e := &env{t: t, pool: pool, store: s}
	ctx := context.Background()
	rate := &quota.Rate{Amount: d("1"), Per: quota.DurationText(time.Hour), Burst: d("10")}
	if _, err := quota.PutRuleDBClock(ctx, pool, quota.RuleInput{Customer: "acme", Meter: "calls", Rate: rate,
		Admission: quota.Exact, Actor: "test"}, ahead); err != nil {
		t.Fatal(err)
	}
	if err := pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
		_, err := quota.PutScopeRuleClock(ctx, tx, quota.ScopeRuleInput{Scope: "global", Meter: "calls", Rate: rate,
			Admission: quota.Exact, Actor: "test"}, ahead)
		return err
	}); err != nil {
		t.Fatal(err)
	}
	g, err := e.issueRate("gw1", "acme", "4")
	if err != nil {
		t.Fatalf("a grant under the new rate rule: %v", err)
	}
	if !slices.Equal(g.Budgets, []string{"customer:acme", "global"}) || !g.Amount.Equal(d("4")) {
		t.Fatalf("grant %+v, want 4 from acme's and the global rate budgets", g)
	}
	_, err = e.issueRate("gw1", "acme", "7")
	if ex := exhaustedBy(t, err, "customer:acme/calls"); !ex.Available.Equal(d("6")) {
		t.Fatalf("7 with 6 left of the burst: %v (available %v)", err, ex.Available)
	}
	bs, err := e.store.RateBudgetsOf(ctx, "acme")
	if err != nil || len(bs) != 2 || bs[0].Burst.String() != "10" || !bs[0].Live.Equal(d("4")) {
		t.Fatalf("rate budgets of acme: %+v %v", bs, err)
	}
}
