package admit_test

import (
	"context"
	"fmt"
	"math/rand/v2"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/shopspring/decimal"

	"github.com/tally-ledger/tally/admit"
)

// A gateway meets customers it never sees again. A budget no Admit has
// used for ForgetAfter is forgotten once it holds nothing: it takes no
// memory and, for a meter without a rule or with a lagged one, no more
// rechecks (one grant call per budget per RuleRecheck, for every
// customer the gateway ever saw). Its next Admit asks Tally as a first
// one does, and the client's counters do not go back.
func TestAnUnusedBudgetIsForgotten(t *testing.T) {
	ts := startTally(t)
	ts.exactRule("acme", "tokens", "1000")
	reg := prometheus.NewRegistry()
	c := newClient(t, ts, "gw1", t.TempDir(), admit.Config{Registerer: reg,
		RuleRecheck: 100 * time.Millisecond, ForgetAfter: 2 * time.Second, GrantTTL: time.Second})
	// (ForgetAfter leaves a loaded machine time for the 51 first Admits, each
	// a grant request, before the first budgets may go.)
	defer c.Close(context.Background())
	ctx := context.Background()
	metric := func(name, labels string) float64 {
		t.Helper()
		v, err := metricValue(reg, name, labels)
		if err != nil {
			t.Fatalf("%s{%s}: %v", name, labels, err)
		}
		return v
	}
	admitOne := func(customer string, how admit.How) {
		t.Helper()
		if d, err := c.Admit(ctx, customer, "tokens", 1); err != nil || !d.Admitted || d.How != how {
			t.Fatalf("admit %s: %+v %v, want admitted by %v", customer, d, err, how)
		}
	}
	for i := range 50 {
		admitOne(fmt.Sprint("seen-once-", i), admit.NoRule)
	}
	admitOne("acme", admit.FromGrant)
	if got := metric("tally_admit_budgets", ""); got != 51 {
		t.Fatalf("%v budgets after 51 customers, want 51", got)
	}
	if got := metric("tally_admit_admissions_total", `how="no-rule",outcome="admitted"`); got != 50 {
		t.Fatalf("no-rule admissions %v after 50, want 50", got)
	}

	eventually(t, "every budget forgotten", func() bool { return metric("tally_admit_budgets", "") == 0 })
	calls := metric("tally_admit_grant_calls_total", `call="issue",result="not_exact"`)
	time.Sleep(time.Second) // ten RuleRecheck periods
	if got := metric("tally_admit_grant_calls_total", `call="issue",result="not_exact"`); got != calls {
		t.Fatalf("forgotten budgets still rechecked: %v calls, then %v a second later", calls, got)
	}
	if got := metric("tally_admit_budgets_forgotten_total", ""); got != 51 {
		t.Errorf("forgotten %v, want 51", got)
	}
	// Nothing held while forgotten: the grant went back with its spent.
	if b := ts.budget("acme", "tokens"); !b.Consumed.Equal(decimal.NewFromInt(1)) || !b.Live.IsZero() {
		t.Fatalf("acme's budget while forgotten: %+v", b)
	}
	if got := metric("tally_admit_admissions_total", `how="no-rule",outcome="admitted"`); got != 50 {
		t.Errorf("no-rule admissions %v after forgetting, want 50", got)
	}
	if got := metric("tally_admit_admissions_total", `how="grant",outcome="admitted"`); got != 1 {
		t.Errorf("grant admissions %v after forgetting, want 1", got)
	}

	// Back again: asked about as the first time.
	admitOne("acme", admit.FromGrant)
	admitOne("seen-once-7", admit.NoRule)
	if got := metric("tally_admit_budgets", ""); got != 2 {
		t.Errorf("%v budgets after two customers came back, want 2", got)
	}
	if got := metric("tally_admit_admissions_total", `how="grant",outcome="admitted"`); got != 2 {
		t.Errorf("grant admissions %v, want 2", got)
	}
}

// An idle gateway gives its capacity back: a grant due for renewal whose
// budget no Admit has used for half a grant's TTL is released instead, so
// capacity is not held, and renewed every half TTL, for a customer that
// stopped sending (held, it is what other gateways are refused for).
func TestAnIdleGatewayGivesItsGrantsBack(t *testing.T) {
	ts := startTally(t)
	ts.exactRule("acme", "tokens", "1000000") // far from tight: grants sized to demand
	reg := prometheus.NewRegistry()
	c := newClient(t, ts, "gw1", t.TempDir(), admit.Config{Registerer: reg, GrantTTL: time.Second, ForgetAfter: time.Hour})
	defer c.Close(context.Background())
	if d, err := c.Admit(context.Background(), "acme", "tokens", 1); err != nil || d.How != admit.FromGrant {
		t.Fatalf("admit: %+v %v", d, err)
	}
	eventually(t, "the tick topping up the budget after its first Admit", func() bool {
		return !ts.budget("acme", "tokens").Live.IsZero()
	})
	time.Sleep(3 * time.Second) // renewed at half the TTL until given back
	if b := ts.budget("acme", "tokens"); !b.Live.IsZero() || !b.Consumed.Equal(decimal.NewFromInt(1)) {
		t.Fatalf("after 3 s without an Admit the gateway still holds grants: %+v", b)
	}
	if v, err := metricValue(reg, "tally_admit_grants_held", ""); err != nil || v != 0 {
		t.Fatalf("grants held %v (%v), want 0", v, err)
	}
	if v, err := metricValue(reg, "tally_admit_budgets", ""); err != nil || v != 1 {
		t.Fatalf("budgets %v (%v), want 1: not forgotten within ForgetAfter", v, err)
	}
}

// Forgetting races Admits: budgets forgotten after a millisecond unused,
// while workers admit with pauses long and short. Nothing is admitted
// past the limit, no grant is left behind in a forgotten budget, and once
// the gateways close Tally's consumed is exactly what they admitted.
func TestForgettingRacesAdmits(t *testing.T) {
	ts := startTally(t)
	const limit = 400
	for _, cu := range []string{"acme", "globex"} {
		ts.exactRule(cu, "tokens", fmt.Sprint(limit))
	}
	ctx := context.Background()
	regs := []*prometheus.Registry{prometheus.NewRegistry(), prometheus.NewRegistry()}
	clients := []*admit.Client{
		newClient(t, ts, "gw1", t.TempDir(), admit.Config{Registerer: regs[0], ForgetAfter: time.Millisecond, Tick: 10 * time.Millisecond, MinGrant: 3}),
		newClient(t, ts, "gw2", t.TempDir(), admit.Config{Registerer: regs[1], ForgetAfter: time.Millisecond, Tick: 10 * time.Millisecond, MinGrant: 3}),
	}
	admitted := map[string]*atomic.Int64{"acme": {}, "globex": {}}
	var wg sync.WaitGroup
	deadline := time.Now().Add(3 * time.Second)
	for _, c := range clients {
		for w := range 3 {
			wg.Go(func() {
				customer := []string{"acme", "globex"}[w%2]
				for time.Now().Before(deadline) {
					d, err := c.Admit(ctx, customer, "tokens", 1)
					if err != nil {
						t.Error(err)
						return
					}
					if d.Admitted {
						if admitted[customer].Add(1) > limit {
							t.Errorf("%s admitted past its limit", customer)
						}
					}
					if _, err := c.Admit(ctx, fmt.Sprint("norule-", rand.IntN(20)), "tokens", 1); err != nil {
						t.Error(err)
						return
					}
					// Mostly short pauses, now and then long enough to be
					// forgotten in between.
					time.Sleep(time.Duration(rand.IntN(3)) * time.Millisecond * time.Duration(1+9*rand.IntN(2)*rand.IntN(2)))
				}
			})
		}
	}
	wg.Wait()
	forgotten := closeForgotten(t, ctx, regs, clients)
	for customer, n := range admitted {
		b := ts.budget(customer, "tokens")
		if !b.Consumed.Equal(decimal.NewFromInt(n.Load())) || !b.Live.IsZero() {
			t.Errorf("%s: admitted %d, budget %+v", customer, n.Load(), b)
		}
	}
	t.Logf("forgotten %v times; admitted %d and %d", forgotten, admitted["acme"].Load(), admitted["globex"].Load())
}

// A customer or meter that is not an id (docs/design.md §2) is the
// caller's mistake, answered at once with an error naming the rule: no
// budget is kept for it and nothing is asked of Tally. Before, every such
// Admit was a grant request Tally refused with a 400: a gateway passing a
// missing header's "" through made one call per request, spending the
// gateway token's rate limit that every customer's grants share.
func TestInvalidIDsNeverReachTally(t *testing.T) {
	ts := startTally(t)
	ts.exactRule("acme", "tokens", "100")
	reg := prometheus.NewRegistry()
	c := newClient(t, ts, "gw1", t.TempDir(), admit.Config{Registerer: reg})
	defer c.Close(context.Background())
	ctx := context.Background()
	for _, tc := range []struct{ customer, meter, field string }{
		{"", "tokens", "customer"},
		{"acme corp", "tokens", "customer"},
		{strings.Repeat("a", 129), "tokens", "customer"},
		{"..", "tokens", "customer"},
		{"acme", "", "meter"},
		{"acme", "tökens", "meter"},
	} {
		for range 20 {
			d, err := c.Admit(ctx, tc.customer, tc.meter, 1)
			if err == nil || d.Admitted || !strings.Contains(err.Error(), tc.field) || !strings.Contains(err.Error(), "1-128 characters") {
				t.Fatalf("Admit(%q, %q): %+v %v, want an error on the %s naming the rule", tc.customer, tc.meter, d, err, tc.field)
			}
		}
	}
	// Nothing asked of Tally, nothing kept (read before any valid Admit:
	// its budget's loop may top up at any tick after it).
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	calls := 0.0
	for _, mf := range mfs {
		if mf.GetName() == "tally_admit_grant_calls_total" {
			for _, m := range mf.GetMetric() {
				calls += m.GetCounter().GetValue()
			}
		}
	}
	if calls != 0 {
		t.Errorf("%v calls to Tally for invalid ids, want none", calls)
	}
	if v, err := metricValue(reg, "tally_admit_budgets", ""); err != nil || v != 0 {
		t.Errorf("budgets %v (%v) for invalid ids, want 0", v, err)
	}
	if d, err := c.Admit(ctx, "acme", "tokens", 1); err != nil || d.How != admit.FromGrant {
		t.Fatalf("a valid customer after them: %+v %v", d, err)
	}
}

// A forgotten budget's rule policy is kept: the on_unreachable a grant
// brought (here deny) still answers the customer's next Admit while Tally
// is unreachable, not the gateway's own default (here allow). Forgotten
// with the budget, a customer idle for ForgetAfter was admitted through
// an outage its rule says to refuse.
func TestAForgottenBudgetKeepsItsRulesPolicy(t *testing.T) {
	ts := startTally(t)
	ts.exactRuleWith("acme", "tokens", "1000", admit.Deny)
	reg := prometheus.NewRegistry()
	c := newClient(t, ts, "gw1", t.TempDir(), admit.Config{Registerer: reg, OnUnreachable: admit.Allow,
		ForgetAfter: time.Millisecond, Tick: 10 * time.Millisecond, GrantTTL: time.Second})
	defer c.Close(context.Background())
	ctx := context.Background()
	if d, err := c.Admit(ctx, "acme", "tokens", 1); err != nil || d.How != admit.FromGrant {
		t.Fatalf("admit: %+v %v", d, err)
	}
	eventually(t, "acme's budget forgotten", func() bool {
		v, err := metricValue(reg, "tally_admit_budgets_forgotten_total", "")
		return err == nil && v == 1
	})
	ts.down.Store(true)
	d, err := c.Admit(ctx, "acme", "tokens", 1)
	if err != nil || d.Admitted || !d.Unreachable {
		t.Fatalf("admit while Tally is unreachable after acme was forgotten: %+v %v, want refused by its rule's on_unreachable deny", d, err)
	}
	// A customer never seen follows the gateway's own policy.
	if d, err := c.Admit(ctx, "globex", "tokens", 1); err != nil || !d.Admitted || d.How != admit.Bypass {
		t.Fatalf("a customer never seen while Tally is unreachable: %+v %v, want admitted by the gateway's allow", d, err)
	}
}

// closeForgotten closes the clients and returns how many budgets their
// registries say were forgotten, failing unless the race was run (at
// least 10).
func closeForgotten(t *testing.T, ctx context.Context, regs []*prometheus.Registry, clients []*admit.Client) float64 {
	t.Helper()
	forgotten := 0.0
	for _, reg := range regs {
		v, err := metricValue(reg, "tally_admit_budgets_forgotten_total", "")
		if err != nil {
			t.Fatal(err)
		}
		forgotten += v
	}
	for _, c := range clients {
		if err := c.Close(ctx); err != nil {
			t.Fatal(err)
		}
	}
	if forgotten < 10 {
		t.Fatalf("only %v budgets forgotten during the run: the race was not run", forgotten)
	}
	return forgotten
}
