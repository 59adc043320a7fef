package api_test

import (
	"fmt"
	"testing"
	"time"
)

// A warn_at given with trailing zeros ("0.8000000000", ten digits of
// which nine count) is the fraction 0.8, as every other decimal of a rule
// reads it (amount.Check: trailing zeros do not count); it was refused as
// "0.8 has more than 9 digits after the point", on a pool's, the global
// and a customer's rule alike.
func TestWarnAtWithTrailingZerosIsItsValue(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	f.putPool("free", "acme")
	for _, path := range []string{"/v1/pools/free/quotas/calls", "/v1/global/quotas/calls", "/v1/customers/acme/quotas/calls"} {
		r := f.do("PUT", path, adminToken, map[string]any{"limit": "10", "warn_at": "0.8000000000", "admission": "exact"})
		if r.status != 201 || r.json(t)["warn_at"] != "0.8" {
			t.Errorf("PUT %s with warn_at 0.8000000000: %d %s", path, r.status, r.body)
		}
		// Ten digits that count stay refused, once, on warn_at.
		f.do("PUT", path, adminToken, map[string]any{"limit": "10", "warn_at": "0.8000000001"}).fieldProblem(t, "warn_at", "digits after the point")
		// Out of (0, 1] is one error too, not also one on its digits.
		f.do("PUT", path, adminToken, map[string]any{"limit": "10", "warn_at": "1.1234567890"}).fieldProblem(t, "warn_at", "fraction")
	}
}

// A rate grant still live when its scope's rule turns into a period limit
// is counted into the new period budget (docs/design.md §12 and §13:
// turning exact never starts from zero) and is drawn from it; the grant
// lists each budget once: it listed "customer:a" (or "pool:p") twice, the
// bucket's and the period budget's, after the change.
func TestGrantDrawingABucketAndAPeriodBudgetListsItOnce(t *testing.T) {
	t.Parallel()
	for _, scope := range []string{"customer:a", "pool:p"} {
		t.Run(scope, func(t *testing.T) {
			t.Parallel()
			f := newFixture(t)
			gw := f.gatewayToken("gw")
			rules := "/v1/customers/a/quotas/calls"
			if scope == "pool:p" {
				rules = "/v1/pools/p/quotas/calls"
				f.putPool("p", "a")
			}
			if r := f.do("PUT", rules, adminToken, map[string]any{
				"rate": map[string]any{"amount": "1", "per": "1h", "burst": "10"}, "admission": "exact"}); r.status != 201 {
				t.Fatalf("rate rule: %d %s", r.status, r.body)
			}
			want := "[" + scope + "]"
			g := f.do("POST", "/v1/grants", gw, map[string]any{"holder": "gw", "generation": 1, "customer": "a", "meter": "calls", "amount": "5", "ttl": "10s"})
			if g.status != 201 || fmt.Sprint(g.json(t)["budgets"]) != want {
				t.Fatalf("rate grant: %d %s", g.status, g.body)
			}
			id := g.json(t)["id"].(string)
			f.setNow(f.clock().Add(time.Second))
			if r := f.do("PUT", rules, adminToken, map[string]any{"limit": "10", "admission": "exact"}); r.status != 200 {
				t.Fatalf("period rule: %d %s", r.status, r.body)
			}
			// The first period grant brings the budget to the live rate grant.
			if r := f.do("POST", "/v1/grants", gw, map[string]any{"holder": "gw", "generation": 1, "customer": "a", "meter": "calls", "amount": "3"}); r.status != 201 ||
				r.json(t)["available"] != "2" {
				t.Fatalf("period grant: %d %s", r.status, r.body)
			}
			r := f.do("POST", "/v1/grants/"+id+"/release", gw, map[string]any{"holder": "gw", "generation": 1, "spent": "1"})
			if r.status != 200 || fmt.Sprint(r.json(t)["budgets"]) != want {
				t.Errorf("release of the rate grant: %d %s", r.status, r.body)
			}
			items := f.do("GET", "/v1/customers/a/grants?state=ended", adminToken, nil).json(t)["items"].([]any)
			if len(items) != 1 || fmt.Sprint(items[0].(map[string]any)["budgets"]) != want {
				t.Errorf("ended grants: %v", items)
			}
		})
	}
}

// A period budget whose rule has since turned into a rate contract shows
// the limit and the version that limit belongs to (docs/gateways-exact.md:
// `limit` and `rule_version` are those of one version): it showed the
// rate version's number beside the earlier version's limit ("limit":"10",
// "rule_version":2, where version 2 has "limit":null), on a customer's
// budgets and a pool's alike.
func TestBudgetOfARuleTurnedRateShowsOneVersion(t *testing.T) {
	t.Parallel()
	for _, scope := range []string{"customer:a", "pool:p"} {
		t.Run(scope, func(t *testing.T) {
			t.Parallel()
			f := newFixture(t)
			gw := f.gatewayToken("gw")
			rules, budgets := "/v1/customers/a/quotas/calls", func() []any {
				return f.do("GET", "/v1/customers/a/budgets", adminToken, nil).json(t)["items"].([]any)
			}
			if scope == "pool:p" {
				rules = "/v1/pools/p/quotas/calls"
				f.putPool("p", "a")
				budgets = func() []any { return f.do("GET", "/v1/pools/p", adminToken, nil).json(t)["budgets"].([]any) }
			}
			if r := f.do("PUT", rules, adminToken, map[string]any{"limit": "10", "admission": "exact"}); r.status != 201 {
				t.Fatalf("period rule: %d %s", r.status, r.body)
			}
			if r := f.do("POST", "/v1/grants", gw, map[string]any{"holder": "gw", "generation": 1, "customer": "a", "meter": "calls", "amount": "3"}); r.status != 201 {
				t.Fatalf("grant: %d %s", r.status, r.body)
			}
			f.setNow(f.clock().Add(time.Second))
			if r := f.do("PUT", rules, adminToken, map[string]any{
				"rate": map[string]any{"amount": "1", "per": "1s", "burst": "10"}, "admission": "exact"}); r.status != 200 {
				t.Fatalf("rate rule: %d %s", r.status, r.body)
			}
			b := budgets()
			if len(b) != 1 {
				t.Fatalf("budgets %v, want the period budget", b)
			}
			if got := b[0].(map[string]any); got["limit"] != "10" || got["rule_version"] != float64(1) || got["consumed"] != "3" {
				t.Errorf("budget %v: want limit 10 of version 1, consumed 3", got)
			}
		})
	}
}

// A grant carries the customer's rule in force when it is issued: its
// version and its failure policy (docs/design.md §12: a plan reused from
// before a rule change is checked under the locks and made again; reuse
// never decides anything). Two cases let a reused plan decide them: a
// rule version another API process had already brought the budget to,
// and a rate contract, whose customer row no grant draws. Each answered
// the version before, with its on_unreachable "deny", while "allow" was
// in force.
func TestGrantCarriesTheRuleInForceAfterAChange(t *testing.T) {
	t.Parallel()
	rate := map[string]any{"amount": "1", "per": "1s", "burst": "10"}
	for _, c := range []struct {
		name  string
		rule  map[string]any
		peers bool
	}{
		{"period limit, another process brought the budget", map[string]any{"limit": "100"}, true},
		{"rate contract", map[string]any{"rate": rate}, false},
	} {
		t.Run(c.name, func(t *testing.T) {
			t.Parallel()
			f := newFixture(t)
			other := f
			if c.peers {
				other = f.peer(nil, nil)
			}
			gw := f.gatewayToken("gw")
			put := func(onUnreachable string) {
				t.Helper()
				body := map[string]any{"admission": "exact", "on_unreachable": onUnreachable}
				for k, v := range c.rule {
					body[k] = v
				}
				if r := f.do("PUT", "/v1/customers/a/quotas/calls", adminToken, body); r.status/100 != 2 {
					t.Fatalf("rule: %d %s", r.status, r.body)
				}
			}
			grant := func(x *fixture) map[string]any {
				t.Helper()
				r := x.do("POST", "/v1/grants", gw, map[string]any{"holder": "gw", "generation": 1, "customer": "a", "meter": "calls", "amount": "1"})
				if r.status != 201 {
					t.Fatalf("grant: %d %s", r.status, r.body)
				}
				return r.json(t)
			}
			put("deny")
			grant(f) // f plans a's grants at version 1
			if c.peers {
				grant(other)
			}
			put("allow")
			if c.peers {
				grant(other) // brings a's budget to version 2
			}
			if g := grant(f); g["rule_version"] != float64(2) || g["on_unreachable"] != "allow" {
				t.Errorf("grant after the change: rule_version %v, on_unreachable %v; want 2 and allow", g["rule_version"], g["on_unreachable"])
			}
		})
	}
}

// A debit's record carries the customer's rule version in force, also
// when the debit draws only from a pool (the customer's rule lagged): the
// one-round-trip debit checked the version only of a customer budget it
// drew from, and recorded the version its plan was made at.
func TestDebitRecordsTheCustomersRuleInForce(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	gw := f.gatewayToken("gw")
	f.putPool("p", "a")
	if r := f.do("PUT", "/v1/pools/p/quotas/calls", adminToken, map[string]any{"limit": "100", "admission": "exact"}); r.status != 201 {
		t.Fatalf("pool rule: %d %s", r.status, r.body)
	}
	for i, id := range []string{"6f1c2d3e-4b5a-4c6d-8e7f-0a1b2c3d4e5f", "7f1c2d3e-4b5a-4c6d-8e7f-0a1b2c3d4e5f", "8f1c2d3e-4b5a-4c6d-8e7f-0a1b2c3d4e5f"} {
		if i < 2 {
			// A lagged rule for a, version i+1.
			if r := f.do("PUT", "/v1/customers/a/quotas/calls", adminToken, map[string]any{"limit": fmt.Sprint(1000 + i)}); r.status/100 != 2 {
				t.Fatalf("customer rule: %d %s", r.status, r.body)
			}
		}
		r := f.do("POST", "/v1/grants/debits", gw, map[string]any{"id": id, "holder": "gw", "generation": 1, "customer": "a", "meter": "calls", "amount": "1"})
		want := float64(min(i+1, 2))
		if r.status != 201 || r.json(t)["rule_version"] != want || fmt.Sprint(r.json(t)["budgets"]) != "[pool:p]" {
			t.Errorf("debit %d: %d %s; want rule_version %v from pool:p", i, r.status, r.body, want)
		}
	}
}

// An unknown field inside a rule's rate is named as any unknown field is
// (docs/api.md: each problem is one field error): "rate.bogus", "unknown
// field". It was named "rate", as "must be an object {...}: json: unknown
// field", on the customer's, a pool's and the global rule alike.
func TestRateUnknownFieldIsNamed(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	f.putPool("p", "acme")
	for _, path := range []string{"/v1/customers/acme/quotas/calls", "/v1/pools/p/quotas/calls", "/v1/global/quotas/calls"} {
		f.do("PUT", path, adminToken, `{"rate":{"amount":"1","per":"1s","burst":"2","bogus":1},"admission":"exact"}`).
			fieldProblem(t, "rate.bogus", "unknown field")
		f.do("PUT", path, adminToken, `{"rate":{"Amount":"1","per":"1s","burst":"2"},"admission":"exact"}`).
			fieldProblem(t, "rate.Amount", "case-sensitive")
		f.do("PUT", path, adminToken, `{"rate":"100/s","admission":"exact"}`).fieldProblem(t, "rate", "must be an object")
	}
}

// An optional field of a customer's rule given as null is left out, as
// it is on a pool's and the global rule: effective_at null takes effect
// now, and a duration null is its default. effective_at null was refused
// with a message about the zero time, which nobody sent.
func TestRuleFieldsGivenNullAreLeftOut(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	for _, field := range []string{"effective_at", "stale_after", "local_every", "max_skew"} {
		body := map[string]any{"limit": "10", field: nil}
		r := f.do("PUT", "/v1/customers/acme/quotas/calls", adminToken, body)
		if r.status != 200 && r.status != 201 {
			t.Errorf("%s null: %d %s", field, r.status, r.body)
		}
	}
	// Left out, a required one is required all the same.
	f.do("PUT", "/v1/customers/acme/quotas/calls", adminToken, map[string]any{"limit": "10", "admission": "exact",
		"on_unreachable": "local", "local_amount": "5", "local_every": nil}).fieldProblem(t, "local_every", "required")
}

// A grant's or a renewal's ttl given as null is left out (the default),
// as any optional field given as null: it was refused as required.
func TestGrantTTLGivenNullIsLeftOut(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	f.do("PUT", "/v1/customers/acme/quotas/calls", adminToken, map[string]any{"limit": "100", "admission": "exact"})
	gw := f.gatewayToken("gw1")
	r := f.do("POST", "/v1/grants", gw, map[string]any{"holder": "gw1", "generation": 1, "customer": "acme", "meter": "calls",
		"amount": "1", "ttl": nil})
	if r.status != 201 {
		t.Fatalf("grant with ttl null: %d %s", r.status, r.body)
	}
	id := r.json(t)["id"].(string)
	if r := f.do("POST", "/v1/grants/"+id+"/renew", gw, map[string]any{"holder": "gw1", "generation": 1, "spent": "0", "ttl": nil}); r.status != 200 {
		t.Fatalf("renewal with ttl null: %d %s", r.status, r.body)
	}
}
