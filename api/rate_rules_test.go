package api_test

import (
	"net/http"
	"strings"
	"testing"

	"github.com/tally-ledger/tally/api"
)

// Rate rules over REST (docs/design.md §17): a customer's and the global
// one, their field errors, grants that say rate, a refusal naming the
// bucket, and the rate budgets a customer draws from.
func TestRateRulesOverREST(t *testing.T) {
	f := newFixture(t)
	r := f.do("PUT", "/v1/customers/acme/quotas/calls", adminToken, map[string]any{
		"rate": map[string]any{"amount": "1", "per": "1h", "burst": "10"}, "admission": "exact", "max_skew": "250ms"})
	if r.status != http.StatusCreated {
		t.Fatalf("PUT rate rule: %d %s", r.status, r.body)
	}
	if m := r.json(t); m["limit"] != nil || m["max_skew"] != "250ms" || m["rate"].(map[string]any)["burst"] != "10" {
		t.Fatalf("rate rule answer %s", r.body)
	}
	for body, field := range map[string]string{
		`{"rate":{"amount":"1","per":"1s","burst":"2"},"limit":"5","admission":"exact"}`:      "limit",
		`{"rate":{"amount":"1","per":"1s","burst":"2"}}`:                                      "admission",
		`{"rate":{"amount":"0","per":"1s","burst":"2"},"admission":"exact"}`:                  "rate.amount",
		`{"rate":{"amount":"1","per":"1s","burst":"2"},"admission":"exact","max_skew":"1ms"}`: "max_skew",
	} {
		p := f.do("PUT", "/v1/customers/acme/quotas/calls", adminToken, body).problem(t, http.StatusBadRequest, api.TypeInvalidRequest)
		found := false
		for _, e := range p.Errors {
			found = found || e.Field == field
		}
		if !found {
			t.Errorf("%s: errors %+v, want one on %s", body, p.Errors, field)
		}
	}
	if r := f.do("PUT", "/v1/global/quotas/calls", adminToken, map[string]any{
		"rate": map[string]any{"amount": "1", "per": "1h", "burst": "100"}, "admission": "exact"}); r.status != http.StatusCreated {
		t.Fatalf("PUT global rate rule: %d %s", r.status, r.body)
	}
	gw := f.gatewayToken("gw")
	g := f.do("POST", "/v1/grants", gw, map[string]any{"holder": "gw", "generation": 1, "customer": "acme", "meter": "calls", "amount": "6"})
	if g.status != http.StatusCreated || g.json(t)["rate"] != true {
		t.Fatalf("grant: %d %s", g.status, g.body)
	}
	p := f.do("POST", "/v1/grants", gw, map[string]any{"holder": "gw", "generation": 1, "customer": "acme", "meter": "calls", "amount": "5"}).
		problem(t, http.StatusConflict, api.TypeBudgetExhausted)
	if p.Binding != "customer:acme/calls" || p.RetryAfter == nil || p.Burst != "" {
		t.Errorf("refusal binding %q, retry_after %v, burst %q: want customer:acme/calls, a retry_after, no burst", p.Binding, p.RetryAfter, p.Burst)
	}
	// More than the burst: no retry_after (nor Retry-After), the burst said.
	r = f.do("POST", "/v1/grants", gw, map[string]any{"holder": "gw", "generation": 1, "customer": "acme", "meter": "calls", "amount": "11"})
	p = r.problem(t, http.StatusConflict, api.TypeBudgetExhausted)
	if p.RetryAfter != nil || p.RetryAfterMS != nil || r.header.Get("Retry-After") != "" || p.Burst != "10" || !strings.Contains(p.Detail, "more than the burst 10") {
		t.Errorf("11 on a burst of 10: %d %s (Retry-After %q)", r.status, r.body, r.header.Get("Retry-After"))
	}
	items := f.do("GET", "/v1/customers/acme/rate-budgets", adminToken, nil).json(t)["items"].([]any)
	if len(items) != 2 || items[0].(map[string]any)["scope"] != "customer:acme" || items[1].(map[string]any)["scope"] != "global" {
		t.Errorf("rate budgets %v", items)
	}
}

// A customer's quota listing shows its rate rules beside its period
// quotas (docs/design.md §17): an operator or the customer reading
// GET /v1/customers/{c}/quotas sees every rule the customer has, the rate
// contract included, and no period usage invented for a rate rule.
func TestQuotaListingShowsRateRules(t *testing.T) {
	f := newFixture(t)
	if r := f.do("PUT", "/v1/customers/acme/quotas/tokens", adminToken, map[string]any{"limit": "1000"}); r.status != http.StatusCreated {
		t.Fatalf("PUT period rule: %d %s", r.status, r.body)
	}
	if r := f.do("PUT", "/v1/customers/acme/quotas/calls", adminToken, map[string]any{
		"rate": map[string]any{"amount": "100", "per": "1s", "burst": "200"}, "admission": "exact"}); r.status != http.StatusCreated {
		t.Fatalf("PUT rate rule: %d %s", r.status, r.body)
	}
	for _, tok := range []string{adminToken, f.token("acme")} {
		page := f.do("GET", "/v1/customers/acme/quotas", tok, nil).json(t)
		items, rates := page["items"].([]any), page["rate_rules"].([]any)
		if len(items) != 1 || items[0].(map[string]any)["meter"] != "tokens" {
			t.Fatalf("period quotas %v, want tokens alone", items)
		}
		if len(rates) != 1 {
			t.Fatalf("rate rules %v, want calls", rates)
		}
		r := rates[0].(map[string]any)
		rate, _ := r["rate"].(map[string]any)
		if r["meter"] != "calls" || rate["amount"] != "100" || rate["per"] != "1s" || rate["burst"] != "200" {
			t.Errorf("rate rule %v, want calls at 100 per 1s, bursts of 200", r)
		}
		if _, shown := r["actor"]; shown != (tok == adminToken) {
			t.Errorf("token %s…: actor shown %v", tok[:6], shown)
		}
	}
}

// Each problem of a customer's rate rule is one field error
// (docs/api.md): a rate value that does not parse, or is missing, is not
// reported again as the zero it left behind ("0 must be positive").
func TestRateRuleProblemIsOneFieldError(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	for _, c := range []struct{ body, field, about string }{
		{`{"rate":{"amount":"1e3","per":"1s","burst":"2"},"admission":"exact"}`, "rate.amount", "not a decimal number"},
		{`{"rate":{"amount":"1","per":"1s"},"admission":"exact"}`, "rate.burst", "is required"},
		{`{"rate":{"amount":"1","per":"soon","burst":"2"},"admission":"exact"}`, "rate.per", "soon"},
	} {
		f.do("PUT", "/v1/customers/acme/quotas/calls", adminToken, c.body).fieldProblem(t, c.field, c.about)
	}
}

// A customer's rate budgets are listed from the moment their rules are in
// force (docs/api.md: the rate budgets the customer draws from), each
// bucket full at its burst, as the first grant finds it: not only once a
// grant has drawn on it.
func TestRateBudgetsListedBeforeTheFirstGrant(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	if r := f.do("PUT", "/v1/customers/acme/quotas/calls", adminToken, map[string]any{
		"rate": map[string]any{"amount": "100", "per": "1s", "burst": "200"}, "admission": "exact"}); r.status != http.StatusCreated {
		t.Fatalf("PUT rate rule: %d %s", r.status, r.body)
	}
	if r := f.do("PUT", "/v1/global/quotas/calls", adminToken, map[string]any{
		"rate": map[string]any{"amount": "1", "per": "1h", "burst": "100"}, "admission": "exact"}); r.status != http.StatusCreated {
		t.Fatalf("PUT global rate rule: %d %s", r.status, r.body)
	}
	if r := f.do("PUT", "/v1/customers/acme/quotas/tokens", adminToken, map[string]any{"limit": "1000", "admission": "exact"}); r.status != http.StatusCreated {
		t.Fatalf("PUT period rule: %d %s", r.status, r.body)
	}
	items := f.do("GET", "/v1/customers/acme/rate-budgets", adminToken, nil).json(t)["items"].([]any)
	if len(items) != 2 {
		t.Fatalf("rate budgets %v, want customer:acme and global", items)
	}
	for i, want := range []map[string]any{
		{"scope": "customer:acme", "meter": "calls", "amount": "100", "per": "1s", "burst": "200", "tokens": "200", "live": "0", "taken": "0", "refused": float64(0)},
		{"scope": "global", "meter": "calls", "amount": "1", "per": "1h", "burst": "100", "tokens": "100", "live": "0", "taken": "0", "refused": float64(0)},
	} {
		got := items[i].(map[string]any)
		for k, v := range want {
			if got[k] != v {
				t.Errorf("rate budget %d: %s = %v, want %v (%v)", i, k, got[k], v, got)
			}
		}
	}
	f.usage("globex", "calls", f.clock(), "1")
	if items := f.do("GET", "/v1/customers/globex/rate-budgets", adminToken, nil).json(t)["items"].([]any); len(items) != 1 || items[0].(map[string]any)["scope"] != "global" {
		t.Errorf("globex's rate budgets %v, want global's alone", items)
	}
}
