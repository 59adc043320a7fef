package api_test

import (
	"testing"

	"github.com/tally-ledger/tally/api"
)

// TestGatewayCannotOptACustomerOutOfItsBudget: a gateway's grant draws from
// every exact budget that applies (docs/design.md §13); naming a subset
// that leaves one out is the admin's alone, and a gateway trying it is
// refused 403 naming the field, with nothing taken from any budget.
func TestGatewayCannotOptACustomerOutOfItsBudget(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	for path, limit := range map[string]string{"/v1/customers/acme/quotas/tokens": "100", "/v1/global/quotas/tokens": "100000"} {
		if r := f.do("PUT", path, adminToken, map[string]any{"limit": limit, "admission": "exact"}); r.status != 201 {
			t.Fatalf("%s: %d %s", path, r.status, r.body)
		}
	}
	gw := f.gatewayToken("gw1")
	grant := func(tok string, amount string, budgets ...string) response {
		body := map[string]any{"holder": "gw1", "generation": 1, "customer": "acme", "meter": "tokens", "amount": amount, "ttl": "30s"}
		if budgets != nil {
			body["budgets"] = budgets
		}
		return f.do("POST", "/v1/grants", tok, body)
	}
	for range 5 {
		p := grant(gw, "1000", "global").problem(t, 403, api.TypeForbidden)
		if len(p.Errors) != 1 || p.Errors[0].Field != "budgets" {
			t.Fatalf("a gateway leaving the customer's budget out: %+v", p)
		}
	}
	if r := grant(gw, "10", "global", "customer:acme"); r.status != 201 {
		t.Fatalf("a gateway naming every budget: %d %s", r.status, r.body)
	}
	if r := grant(gw, "10"); r.status != 201 {
		t.Fatalf("a gateway naming none: %d %s", r.status, r.body)
	}
	r := f.do("GET", "/v1/customers/acme/budgets", adminToken, nil)
	for _, it := range asSlice(r.json(t)["items"]) {
		b := it.(map[string]any)
		if b["consumed"] != "20" {
			t.Fatalf("after the refusals: %s", r.body)
		}
	}
	// The admin may (an operator's tool, e.g. a global-only top-up).
	if r := grant(adminToken, "1000", "global"); r.status != 201 {
		t.Fatalf("the admin naming a subset: %d %s", r.status, r.body)
	}
}
