package admission_test

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/shopspring/decimal"

	"github.com/tally-ledger/tally/admission"
	"github.com/tally-ledger/tally/quota"
)

func (e *env) report(g admission.Grant, spent string, release bool) admission.Grant {
	e.t.Helper()
	r := admission.Report{Grant: g.ID, Holder: g.Holder, Generation: g.Generation, Spent: d(spent)}
	var err error
	if release {
		g, err = e.store.Release(context.Background(), r)
	} else {
		g, err = e.store.Renew(context.Background(), r)
	}
	if err != nil {
		e.t.Fatalf("report %s on %s: %v", spent, g.ID, err)
	}
	return g
}

func (e *env) wantScope(scope, want, why string) {
	e.t.Helper()
	if c := e.scopeConsumed(scope, "calls"); !c.Equal(d(want)) {
		e.t.Fatalf("%s: %s consumed %s, want %s", why, scope, c, want)
	}
}

// A member that leaves while it holds a grant drawn on the pool: its
// renewals and release afterwards still credit the budgets the grant drew
// from (the pool frees what it did not spend), what it is granted once
// out of the pool is not the pool's, and rejoining in the period counts
// its consumption once: from the period's start until now.
func TestLeavingWithALiveGrantCreditsTheBudgetsItDrew(t *testing.T) {
	e := newEnv(t)
	e.rule("a", "calls", d("100"))
	e.scopeRule(quota.PoolScope("team"), "calls", d("100"))
	e.putPool("team", "a")
	g, err := e.issue("gw", "a", d("40"))
	if err != nil {
		t.Fatal(err)
	}
	e.wantScope("pool:team", "40", "a granted 40 as a member")
	e.clock.Advance(time.Second)
	e.putPool("team")
	e.wantScope("pool:team", "40", "a left holding 40")
	e.report(g, "5", false)
	e.report(g, "10", true)
	e.wantScope("pool:team", "10", "a's grant released with 10 spent after it left")
	if c := e.budget("a", "calls").Consumed; !c.Equal(d("10")) {
		t.Fatalf("customer consumed %s, want 10", c)
	}
	out, err := e.issue("gw", "a", d("20"))
	if err != nil {
		t.Fatal(err)
	}
	if fmt.Sprint(out.Budgets) != "[customer:a]" {
		t.Fatalf("grant after leaving drew from %v", out.Budgets)
	}
	e.wantScope("pool:team", "10", "granted out of the pool")
	e.clock.Advance(time.Second)
	e.putPool("team", "a")
	e.wantScope("pool:team", "30", "a rejoined: its 10 + 20 this period, once")
	e.report(out, "20", true)
	e.wantScope("pool:team", "30", "a released its fully spent grant")
}

// Rejoining while the grant drawn on the pool before leaving is still
// live counts it once, and its release frees the pool once.
func TestRejoiningWithALiveGrantCountsItOnce(t *testing.T) {
	e := newEnv(t)
	e.rule("a", "calls", d("100"))
	e.scopeRule(quota.PoolScope("team"), "calls", d("100"))
	e.putPool("team", "a")
	g, err := e.issue("gw", "a", d("40"))
	if err != nil {
		t.Fatal(err)
	}
	e.clock.Advance(time.Second)
	e.putPool("team")
	e.clock.Advance(time.Second)
	e.putPool("team", "a")
	e.wantScope("pool:team", "40", "a rejoined holding 40")
	e.report(g, "10", true)
	e.wantScope("pool:team", "10", "released with 10 spent")
	if _, err := e.issue("gw", "a", d("90")); err != nil {
		t.Fatalf("90 of the pool's 100 are free: %v", err)
	}
	e.wantScope("pool:team", "100", "after 90 more")
}

// A customer in two pools draws from both; leaving one, its grant's
// release still frees both.
func TestTwoPoolsLeavingOneReleasesBoth(t *testing.T) {
	e := newEnv(t)
	e.rule("a", "calls", d("100"))
	for _, p := range []string{"p1", "p2"} {
		e.scopeRule(quota.PoolScope(p), "calls", d("50"))
		e.putPool(p, "a")
	}
	g, err := e.issue("gw", "a", d("30"))
	if err != nil {
		t.Fatal(err)
	}
	if fmt.Sprint(g.Budgets) != "[customer:a pool:p1 pool:p2]" {
		t.Fatalf("drew from %v", g.Budgets)
	}
	e.clock.Advance(time.Second)
	e.putPool("p1")
	e.report(g, "12", true)
	e.wantScope("pool:p1", "12", "released after leaving p1")
	e.wantScope("pool:p2", "12", "released while in p2")
	if _, err := e.issue("gw", "a", d("39")); err == nil {
		t.Fatal("p2 has 38 left, 39 was granted")
	}
	if _, err := e.issue("gw", "a", d("38")); err != nil {
		t.Fatal(err)
	}
	e.wantScope("pool:p1", "12", "p1 after a left")
}

// Members of different pools issuing concurrently against one global
// budget never take it past its limit; what was granted is what the
// budget counts, and reconciliation's account of it agrees.
func TestGlobalAcrossPoolsNeverOvershoots(t *testing.T) {
	e := newEnv(t)
	e.scopeRule(quota.Global, "calls", d("50"))
	custs := []string{"a", "b", "c", "d"}
	for _, c := range custs {
		e.rule(c, "calls", d("100"))
	}
	e.scopeRule(quota.PoolScope("p1"), "calls", d("40"))
	e.scopeRule(quota.PoolScope("p2"), "calls", d("40"))
	e.putPool("p1", "a", "b")
	e.putPool("p2", "c", "d")
	var mu sync.Mutex
	granted := map[string]decimal.Decimal{}
	var wg sync.WaitGroup
	for i, c := range custs {
		for h := 0; h < 3; h++ {
			wg.Add(1)
			go func() {
				defer wg.Done()
				holder := fmt.Sprintf("gw%d-%d", i, h)
				for {
					g, err := e.store.Issue(context.Background(), admission.IssueRequest{Holder: holder, Generation: 1,
						Customer: c, Meter: "calls", Amount: d("3"), MinAmount: decimal.NewNullDecimal(d("1"))})
					if _, ok := errors.AsType[*admission.BudgetExhaustedError](err); ok {
						return
					}
					if err != nil {
						t.Error(err)
						return
					}
					mu.Lock()
					for _, b := range g.Budgets {
						granted[b] = granted[b].Add(g.Amount)
					}
					mu.Unlock()
				}
			}()
		}
	}
	wg.Wait()
	if !granted["global"].Equal(d("50")) {
		t.Fatalf("granted %v, want exactly the global 50", granted)
	}
	for _, s := range []string{"global", "pool:p1", "pool:p2"} {
		e.wantScope(s, granted[s].String(), "after the race")
	}
	starts := make([]time.Time, len(custs))
	for i := range starts {
		starts[i] = time.Date(2026, 12, 1, 0, 0, 0, 0, time.UTC)
	}
	accts, err := admission.ScopeAccounts(context.Background(), e.pool, custs, starts, e.clock.Now())
	if err != nil {
		t.Fatal(err)
	}
	if len(accts) != 3 {
		t.Fatalf("accounts %+v, want global and both pools", accts)
	}
	for _, a := range accts {
		if !a.OverGranted.IsZero() || !a.Consumed.Equal(granted[a.Scope]) {
			t.Errorf("%s: over %s consumed %s, granted %s", a.Scope, a.OverGranted, a.Consumed, granted[a.Scope])
		}
	}
}
