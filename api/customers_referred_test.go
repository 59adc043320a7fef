package api_test

import (
	"testing"
)

// TestCustomerExistsOnceReferredTo: a customer exists once anything refers
// to it — a quota rule, a pool membership, a token, a grant — and reads as
// a customer with the default calendar and zero usage until metered.
func TestCustomerExistsOnceReferredTo(t *testing.T) {
	t.Parallel()
	f := newFixture(t) // now: 2026-11-20T12:00Z
	if r := f.do("PUT", "/v1/customers/ruled/quotas/calls", adminToken, map[string]any{"limit": "500", "admission": "exact"}); r.status != 201 {
		t.Fatalf("rule: %d %s", r.status, r.body)
	}
	f.putPool("free", "pooled")
	tokened := f.token("tokened")
	// A grant from the global budget alone: the customer has no rule of its own.
	if r := f.do("PUT", "/v1/global/quotas/calls", adminToken, map[string]any{"limit": "100", "admission": "exact"}); r.status != 201 {
		t.Fatalf("global rule: %d %s", r.status, r.body)
	}
	if r := f.do("POST", "/v1/grants", f.gatewayToken("gw"), map[string]any{
		"holder": "gw", "generation": 1, "customer": "granted", "meter": "calls", "amount": "5"}); r.status != 201 {
		t.Fatalf("grant: %d %s", r.status, r.body)
	}

	for _, c := range []struct{ customer, token string }{
		{"ruled", adminToken}, {"pooled", adminToken}, {"tokened", tokened}, {"granted", adminToken},
	} {
		r := f.do("GET", "/v1/customers/"+c.customer, c.token, nil)
		if r.status != 200 {
			t.Errorf("GET /v1/customers/%s: %d %s", c.customer, r.status, r.body)
			continue
		}
		if p := r.json(t)["current_period"].(map[string]any); p["name"] != "2026-11-01" {
			t.Errorf("%s: current period %v, want the default calendar's 2026-11-01", c.customer, p)
		}
		r = f.do("GET", "/v1/customers/"+c.customer+"/usage", c.token, nil)
		if u := r.json(t); r.status != 200 || u["total"] != nil && u["total"] != "0" {
			t.Errorf("GET /v1/customers/%s/usage: %d %s", c.customer, r.status, r.body)
		}
		if r := f.do("GET", "/v1/customers/"+c.customer+"/quotas", c.token, nil); r.status != 200 {
			t.Errorf("GET /v1/customers/%s/quotas: %d %s", c.customer, r.status, r.body)
		}
	}
	r := f.do("GET", "/v1/customers/ruled/quotas", adminToken, nil)
	items := asSlice(r.json(t)["items"])
	if len(items) != 1 || items[0].(map[string]any)["used"] != "0" {
		t.Fatalf("ruled's quota before any usage: %s", r.body)
	}
	// Nothing refers to nobody: still unknown.
	f.do("GET", "/v1/customers/nobody", adminToken, nil).problem(t, 404, "urn:tally:problem:not-found")
	f.do("GET", "/v1/customers/nobody/usage", adminToken, nil).problem(t, 404, "urn:tally:problem:not-found")
}
