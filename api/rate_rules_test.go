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

// Every duration of a rule or a grant that is refused says which value,
// and the range the field takes, on the field at fault; one given as zero
// where leaving it out means a default says so too. A customer's rule's
// max_skew "0s" was refused as "must be positive" (a pool's or the global
// rule's named the range), as were rate.per and stale_after "0s";
// stale_after "-1s" was "is negative", without a range; and local_every
// "0s" on a rule without on_unreachable "local" passed as if left out.
func TestDurationRefusalsNameTheFieldAndItsRange(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	f.putPool("team", "acme")
	const (
		skewRange = "whole milliseconds from 100ms to 10m"
		perRange  = "whole milliseconds from 1ms to 24h"
		secsRange = `whole seconds, 1s or more, such as "1m"`
		ttlRange  = "whole microseconds from 1ms to 1h"
	)
	want := func(value, rng, field string, hasDefault bool) string {
		d := value + " must be " + rng
		if hasDefault {
			d += "; leave " + field + " out (or null) for the default"
		}
		return d
	}
	rate := func(per any) map[string]any { return map[string]any{"amount": "1", "per": per, "burst": "2"} }
	type check struct {
		method, path string
		body         map[string]any
		field, want  string
	}
	var checks []check
	for _, path := range []string{"/v1/customers/acme/quotas/calls", "/v1/pools/team/quotas/calls", "/v1/global/quotas/calls"} {
		for _, c := range []struct {
			v    any
			show string
		}{{"0s", "0s"}, {0, "0s"}, {"-1s", "-1s"}, {"50ms", "50ms"}, {"11m", "11m"}, {"100500us", "100.5ms"}} {
			checks = append(checks, check{"PUT", path, map[string]any{"rate": rate("1s"), "admission": "exact", "max_skew": c.v},
				"max_skew", want(c.show, skewRange, "max_skew", c.show == "0s")})
		}
		for _, c := range []struct {
			v    any
			show string
		}{{"0s", "0s"}, {0, "0s"}, {"-1s", "-1s"}, {"500us", "500µs"}, {"25h", "25h"}, {"1500us", "1.5ms"}} {
			checks = append(checks, check{"PUT", path, map[string]any{"rate": rate(c.v), "admission": "exact"},
				"rate.per", want(c.show, perRange, "", false)})
		}
		checks = append(checks, check{"PUT", path, map[string]any{"limit": "10", "admission": "exact", "max_skew": "0s"},
			"max_skew", want("0s", skewRange, "max_skew", true)})
	}
	for _, c := range []struct {
		v    any
		show string
	}{{"0s", "0s"}, {0, "0s"}, {"-1s", "-1s"}, {"1500ms", "1.5s"}} {
		checks = append(checks, check{"PUT", "/v1/customers/acme/quotas/calls", map[string]any{"limit": "10", "stale_after": c.v},
			"stale_after", want(c.show, secsRange, "stale_after", c.show == "0s")})
		checks = append(checks, check{"PUT", "/v1/customers/acme/quotas/calls", map[string]any{"limit": "10", "admission": "exact",
			"on_unreachable": "local", "local_amount": "5", "local_every": c.v}, "local_every", want(c.show, secsRange, "", false)})
	}
	checks = append(checks, check{"PUT", "/v1/customers/acme/quotas/calls", map[string]any{"limit": "10", "admission": "exact",
		"local_every": "0s"}, "local_every", want("0s", secsRange, "", false)})
	for _, c := range []struct {
		v    any
		show string
	}{{"0s", "0s"}, {"-1s", "-1s"}, {"2h", "2h"}, {"500ns", "500ns"}} {
		checks = append(checks, check{"POST", "/v1/grants", map[string]any{"holder": "gw1", "generation": 1, "customer": "acme",
			"meter": "calls", "amount": "1", "ttl": c.v}, "ttl", want(c.show, ttlRange, "ttl", c.show == "0s")})
	}
	if r := f.do("PUT", "/v1/webhooks/ops", adminToken, map[string]any{"url": "https://hooks.example.com/t"}); r.status != 201 {
		t.Fatalf("webhook: %d %s", r.status, r.body)
	}
	for _, v := range []string{"-1s", "169h"} {
		checks = append(checks, check{"POST", "/v1/webhooks/ops/rotate-secret", map[string]any{"keep_previous_for": v},
			"keep_previous_for", want(v, "from 0s to 168h", "", false)})
	}
	gw := f.gatewayToken("gw1")
	for _, c := range checks {
		token := adminToken
		if c.path == "/v1/grants" {
			token = gw
		}
		r := f.do(c.method, c.path, token, c.body)
		if r.status != 400 {
			t.Errorf("%s %s %v: %d %s, want 400", c.method, c.path, c.body, r.status, r.body)
			continue
		}
		p := r.problem(t, 400, api.TypeInvalidRequest)
		if len(p.Errors) != 1 || p.Errors[0].Field != c.field || p.Errors[0].Detail != c.want {
			t.Errorf("%s %s %v: errors %+v, want %s: %q", c.method, c.path, c.body, p.Errors, c.field, c.want)
		}
	}
}
