package api_test

import (
	"fmt"
	"strings"
	"testing"
	"time"
)

// The operator's sentence over REST: each customer 10 calls, the free plan
// 15 in total, never more than 22 across everyone; each refusal names the
// budget that refused.
func TestPoolsAndGlobalBudget(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	const problem = "urn:tally:problem:"
	for _, c := range []string{"a", "b", "c"} {
		if r := f.do("PUT", "/v1/customers/"+c+"/quotas/calls", adminToken, map[string]any{"limit": "10", "admission": "exact"}); r.status != 201 {
			t.Fatalf("customer rule: %d %s", r.status, r.body)
		}
	}
	r := f.do("PUT", "/v1/pools/free", adminToken, map[string]any{"members": []string{"a", "b"}})
	if r.status != 201 || fmt.Sprint(r.json(t)["members"]) != "[a b]" {
		t.Fatalf("put pool: %d %s", r.status, r.body)
	}
	if r := f.do("PUT", "/v1/pools/free/quotas/calls", adminToken, map[string]any{"limit": "15", "admission": "exact"}); r.status != 201 ||
		r.json(t)["scope"] != "pool:free" || r.json(t)["version"] != float64(1) {
		t.Fatalf("pool rule: %d %s", r.status, r.body)
	}
	if r := f.do("PUT", "/v1/global/quotas/calls", adminToken, map[string]any{"limit": "22", "admission": "exact"}); r.status != 201 || r.json(t)["scope"] != "global" {
		t.Fatalf("global rule: %d %s", r.status, r.body)
	}
	gw := f.gatewayToken("gw")
	grant := func(customer, amount string, budgets ...string) response {
		body := map[string]any{"holder": "gw", "generation": 1, "customer": customer, "meter": "calls", "amount": amount}
		if budgets != nil {
			body["budgets"] = budgets
		}
		return f.do("POST", "/v1/grants", gw, body)
	}
	if r := grant("a", "10"); r.status != 201 || fmt.Sprint(r.json(t)["budgets"]) != "[customer:a global pool:free]" {
		t.Fatalf("grant: %d %s", r.status, r.body)
	}
	refused := func(customer, amount, binding, available string) {
		t.Helper()
		p := grant(customer, amount).problem(t, 409, problem+"budget-exhausted")
		if p.Binding != binding || p.Available != available || p.RetryAfter == nil {
			t.Fatalf("refusal of %s to %s: %+v", amount, customer, p)
		}
	}
	refused("a", "1", "customer:a/calls", "0")
	refused("b", "6", "pool:free/calls", "5")
	if r := grant("b", "5"); r.status != 201 {
		t.Fatalf("grant: %d %s", r.status, r.body)
	}
	if r := grant("c", "7"); r.status != 201 || fmt.Sprint(r.json(t)["budgets"]) != "[customer:c global]" {
		t.Fatalf("grant: %d %s", r.status, r.body)
	}
	refused("c", "1", "global/calls", "0")
	p := grant("c", "1", "pool:free").problem(t, 400, problem+"invalid-request")
	if fmt.Sprint(fields(p)) != "[budgets[0]]" {
		t.Fatalf("a budget that does not apply: %+v", p)
	}

	r = f.do("GET", "/v1/pools/free", adminToken, nil)
	v := r.json(t)
	budgets, _ := v["budgets"].([]any)
	if r.status != 200 || len(budgets) != 1 || budgets[0].(map[string]any)["consumed"] != "15" ||
		budgets[0].(map[string]any)["available"] != "0" || len(v["rules"].([]any)) != 1 || len(v["history"].([]any)) != 2 {
		t.Fatalf("get pool: %d %s", r.status, r.body)
	}
	if r := f.do("GET", "/v1/pools", adminToken, nil); r.status != 200 || len(r.json(t)["items"].([]any)) != 1 {
		t.Fatalf("list pools: %d %s", r.status, r.body)
	}
	f.do("GET", "/v1/pools/nope", adminToken, nil).problem(t, 404, problem+"not-found")
	f.do("PUT", "/v1/pools/nope/quotas/calls", adminToken, map[string]any{"limit": "1"}).problem(t, 404, problem+"not-found")
	p = f.do("PUT", "/v1/pools/free", adminToken, map[string]any{"members": []string{"a", "a", "bad id"}}).problem(t, 400, problem+"invalid-request")
	if fmt.Sprint(fields(p)) != "[members[1] members[2]]" {
		t.Fatalf("invalid members: %+v", p)
	}
	p = f.do("PUT", "/v1/global/quotas/calls", adminToken, map[string]any{"limit": "-1", "mode": "loud"}).problem(t, 400, problem+"invalid-request")
	if fmt.Sprint(fields(p)) != "[limit mode]" {
		t.Fatalf("invalid rule: %+v", p)
	}
	m := f.do("GET", "/metrics", adminToken, nil)
	for _, want := range []string{`tally_admission_grants_issued_total{budgets="3"} 2`, `tally_admission_grants_issued_total{budgets="2"} 1`,
		`tally_admission_grants_refused_total{binding="customer"} 1`, `tally_admission_grants_refused_total{binding="pool"} 1`,
		`tally_admission_grants_refused_total{binding="global"} 1`} {
		if !strings.Contains(string(m.body), want) {
			t.Errorf("metrics lack %s", want)
		}
	}
	f.do("PUT", "/v1/pools/free", f.token("a"), map[string]any{"members": []string{}}).problem(t, 403, problem+"forbidden")
	f.do("PUT", "/v1/global/quotas/calls", gw, map[string]any{"limit": "1"}).problem(t, 403, problem+"forbidden")
}

// A pool's usage this period counts a member that left until it left,
// as its lagged rule does (docs/design.md §13: leaving takes nothing
// back; usage after leaving is no longer the pool's): the view counted
// only its current members, so a member leaving made the pool's usage
// drop below what its rule is enforced against.
func TestPoolUsageCountsALeftMemberUntilItLeft(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	now := f.clock()
	f.putPool("team", "acme", "beta")
	f.usage("acme", "calls", now.Add(-2*time.Hour), "10")
	f.usage("beta", "calls", now.Add(-2*time.Hour), "5")
	f.setNow(now.Add(time.Hour))
	if r := f.do("PUT", "/v1/pools/team", adminToken, map[string]any{"members": []string{"acme"}}); r.status != 200 {
		t.Fatalf("beta leaves: %d %s", r.status, r.body)
	}
	f.setNow(now.Add(3 * time.Hour))
	f.usage("beta", "calls", now.Add(2*time.Hour), "7") // after it left
	r := f.do("GET", "/v1/pools/team", adminToken, nil)
	if r.status != 200 {
		t.Fatalf("get: %d %s", r.status, r.body)
	}
	if u := fmt.Sprint(r.json(t)["usage"]); !strings.Contains(u, "used:15") {
		t.Fatalf("usage %s, want calls 15: acme's 10 and beta's 5 from before it left", u)
	}
}
