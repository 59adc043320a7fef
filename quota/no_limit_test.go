package quota_test

import (
	"context"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/tally-ledger/tally/pools"
	"github.com/tally-ledger/tally/quota"
)

// rateOnly is a rate contract (docs/design.md §17): no period limit.
var rateOnly = &quota.Rate{Amount: dec("1"), Per: quota.DurationText(time.Hour), Burst: dec("30")}

// wantNoLimit checks that d tells a gateway that no period limit applies
// to its key: state no_limit, which blocks no one now nor once it is old,
// also by the rule of a reader that knows only exceeded and on_stale
// (block when exceeded, or when stale with on_stale deny).
func wantNoLimit(t *testing.T, d received, key string, version int64) {
	t.Helper()
	if d.key != key || d.State != quota.NoLimit || d.RuleVersion != version {
		t.Fatalf("%s: decision %+v, want no_limit under version %d", key, d.Decision, version)
	}
	later := time.Now().Add(24 * time.Hour)
	if d.Blocks(time.Now()) || d.Blocks(later) || d.Stale(later) {
		t.Fatalf("%s: a no_limit decision blocks or turns stale: %+v", key, d.Decision)
	}
	if d.OnStale != quota.Allow || d.AsOf == nil || !d.Used.IsZero() || !d.Limit.IsZero() {
		t.Fatalf("%s: a reader that knows only exceeded and on_stale could refuse under %+v", key, d.Decision)
	}
}

// A customer over its period limit whose rule is changed to a rate
// contract gets a decision that lifts the exceeded one at the next
// evaluation (before, the exceeded decision stayed the last of its key
// and gateways kept refusing). A new leader republishes it, so the last
// decision of the key on the topic is its own; a rule with a period limit
// again is decided again from the period's usage.
func TestRuleTurnedRateOnlyPublishesNoLimit(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	e.follow()
	e.put(quota.RuleInput{Customer: "acme", Meter: "api_calls", Limit: dec("100"), OnStale: quota.Deny})
	e.use("acme", "api_calls", 150)
	rd := e.reader()
	a := e.start(e.config("a"))
	rd.until(10*time.Second, "exceeded", func(d received) bool { return d.State == quota.Exceeded })

	e.put(quota.RuleInput{Customer: "acme", Meter: "api_calls", Admission: quota.Exact, Rate: rateOnly})
	d := rd.until(10*time.Second, "a decision of version 2", func(d received) bool { return d.RuleVersion == 2 })
	wantNoLimit(t, d, "acme/api_calls", 2)

	a.Stop(t)
	e.start(e.config("b"))
	d = rd.until(10*time.Second, "the new leader's decision", func(d received) bool { return d.LeaderEpoch == 2 })
	wantNoLimit(t, d, "acme/api_calls", 2)

	e.put(quota.RuleInput{Customer: "acme", Meter: "api_calls", Limit: dec("120")})
	d = rd.until(10*time.Second, "a decision of version 3", func(d received) bool { return d.RuleVersion == 3 })
	if d.State != quota.Exceeded || !d.Used.Equal(dec("150")) || !d.Limit.Equal(dec("120")) {
		t.Fatalf("under a period limit again: %+v", d.Decision)
	}
	st, err := quota.StatusWith(context.Background(), e.pool, "acme", quota.StatusOptions{Now: e.clock()})
	if err != nil || len(st) != 1 {
		t.Fatalf("status: %+v %v", st, err)
	}
	got, err := quota.Overages(context.Background(), e.pool, st[0].PeriodStart, "acme")
	if err != nil {
		t.Fatal(err)
	}
	for _, o := range got {
		if !o.WhileStale.IsZero() {
			t.Errorf("usage counted as admitted under a stale decision across the no_limit one: %+v", o)
		}
	}
}

// A pool's and the global rule over their lagged limits, changed to an
// exact period limit (enforced by grants, not decisions) and to a rate
// contract: both keys get a no_limit decision, not their last exceeded one.
func TestScopeRuleTurnedExactOrRateOnlyPublishesNoLimit(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	e.follow()
	ctx := context.Background()
	scopeRules := func(pool, global quota.ScopeRuleInput) {
		t.Helper()
		err := pgx.BeginFunc(ctx, e.pool, func(tx pgx.Tx) error {
			for _, in := range []quota.ScopeRuleInput{pool, global} {
				in.Meter, in.Actor = "api_calls", "test"
				if _, err := quota.PutScopeRuleAt(ctx, tx, in, e.now()); err != nil {
					return err
				}
			}
			return nil
		})
		if err != nil {
			t.Fatal(err)
		}
	}
	err := pgx.BeginFunc(ctx, e.pool, func(tx pgx.Tx) error {
		_, err := pools.PutTx(ctx, tx, pools.PutInput{Name: "team", Members: []string{"acme"}, Actor: "test"}, e.now())
		return err
	})
	if err != nil {
		t.Fatal(err)
	}
	scopeRules(quota.ScopeRuleInput{Scope: quota.PoolScope("team"), Limit: dec("10")},
		quota.ScopeRuleInput{Scope: quota.Global, Limit: dec("10")})
	e.use("acme", "api_calls", 50)
	rd := e.reader()
	e.start(e.config("a"))
	exceeded := map[string]bool{}
	rd.until(10*time.Second, "both exceeded", func(d received) bool {
		exceeded[d.key] = exceeded[d.key] || d.State == quota.Exceeded
		return exceeded["pool:team/api_calls"] && exceeded["global/api_calls"]
	})

	scopeRules(quota.ScopeRuleInput{Scope: quota.PoolScope("team"), Limit: dec("1000"), Admission: quota.Exact},
		quota.ScopeRuleInput{Scope: quota.Global, Admission: quota.Exact, Rate: rateOnly})
	seen := map[string]received{}
	rd.until(10*time.Second, "decisions of version 2", func(d received) bool {
		if d.RuleVersion == 2 {
			seen[d.key] = d
		}
		return len(seen) == 2
	})
	wantNoLimit(t, seen["pool:team/api_calls"], "pool:team/api_calls", 2)
	wantNoLimit(t, seen["global/api_calls"], "global/api_calls", 2)
}

// A period whose last decision is no_limit is not settled against that
// decision's limit of 0 when it ends: the first decision of the next
// period under a period limit again (here a new leader's, which starts
// from the stored no_limit decision) settles nothing of the old period as
// over its limit. Only the overage the old period had while it had a limit
// stays (60 used of 50: 10), not its whole usage (65) as over a limit of 0.
func TestNoLimitPeriodIsNotSettledAgainstALimitOfZero(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	rd, a, today := e.exceededToday()
	e.put(quota.RuleInput{Customer: "daily", Meter: "api_calls", Admission: quota.Exact, Rate: rateOnly})
	wantNoLimit(t, rd.until(10*time.Second, "no_limit today", func(d received) bool { return d.RuleVersion == 2 }), "daily/api_calls", 2)
	e.use("daily", "api_calls", 5) // under the rate contract: no period limit to be over
	a.Stop(t)
	// The next period begins under a period limit again, decided first by
	// a new leader whose last decision of the key is today's no_limit.
	e.put(quota.RuleInput{Customer: "daily", Meter: "api_calls", Limit: dec("50")})
	e.advance(24 * time.Hour)
	e.start(e.config("b"))
	d := rd.until(10*time.Second, "tomorrow", func(d received) bool { return d.Period != today.Period })
	if d.State != quota.OK || d.RuleVersion != 3 {
		t.Fatalf("new period: %+v", d.Decision)
	}
	start, err := time.Parse(time.DateOnly, today.Period)
	if err != nil {
		t.Fatal(err)
	}
	// The decision is stored with its settlement in one transaction: wait
	// for the store, then read the old period's overage.
	for deadline := time.Now().Add(5 * time.Second); ; time.Sleep(50 * time.Millisecond) {
		var n int
		if err := e.pool.QueryRow(context.Background(), `SELECT count(*) FROM quota_decisions WHERE customer = 'daily' AND decision->>'period' = $1`,
			d.Period).Scan(&n); err != nil {
			t.Fatal(err)
		}
		if n > 0 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("tomorrow's decision not stored after 5 s")
		}
	}
	got, err := quota.Overages(context.Background(), e.pool, start, "daily")
	if err != nil {
		t.Fatal(err)
	}
	if len(got) != 1 || !got[0].OverLimit.Equal(dec("10")) || !got[0].WhileExceeded.IsZero() || !got[0].WhileStale.IsZero() {
		t.Errorf("old period's overage %+v, want over_limit 10 only (60 of 50, before the rate contract)", got)
	}
}
