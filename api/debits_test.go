package api_test

import (
	"strings"
	"testing"
)

// POST /v1/grants/debits: a gateway token debits its own holder, the same
// id is taken once, a refusal is a budget-exhausted problem, and bad
// bodies name their field.
func TestDebits(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	const problem = "urn:tally:problem:"
	if r := f.do("PUT", "/v1/customers/acme/quotas/tokens", adminToken, map[string]any{"limit": "10", "admission": "exact"}); r.status != 201 {
		t.Fatalf("exact rule: %d %s", r.status, r.body)
	}
	gw1, cust := f.gatewayToken("gw1"), f.token("acme")
	debit := func(tok, id, amount string) response {
		return f.do("POST", "/v1/grants/debits", tok, map[string]any{"id": id, "holder": "gw1", "generation": 1,
			"customer": "acme", "meter": "tokens", "amount": amount})
	}
	const id1 = "6f1c2d3e-4b5a-4c6d-8e7f-0a1b2c3d4e5f"
	r := debit(gw1, id1, "6")
	g := r.json(t)
	if r.status != 201 || g["id"] != id1 || g["amount"] != "6" || g["spent"] != "6" || g["state"] != "ended" || g["end_reason"] != "released" {
		t.Fatalf("debit: %d %s", r.status, r.body)
	}
	if r := debit(gw1, id1, "6"); r.status != 201 || r.json(t)["id"] != id1 {
		t.Fatalf("debit sent again: %d %s", r.status, r.body)
	}
	p := debit(gw1, "0e1c2d3e-4b5a-4c6d-8e7f-0a1b2c3d4e5f", "5").problem(t, 409, problem+"budget-exhausted")
	if p.Binding != "customer:acme/tokens" || p.Available != "4" {
		t.Fatalf("refusal: %+v", p)
	}
	if r := debit(gw1, "1e1c2d3e-4b5a-4c6d-8e7f-0a1b2c3d4e5f", "4"); r.status != 201 {
		t.Fatalf("debit of what is left: %d %s", r.status, r.body)
	}
	debit(cust, "2e1c2d3e-4b5a-4c6d-8e7f-0a1b2c3d4e5f", "1").problem(t, 403, problem+"forbidden")
	for _, c := range []struct{ id, amount, field string }{
		{"", "1", "id"},
		{"not-a-uuid", "1", "id"},
		{"3e1c2d3e-4b5a-4c6d-8e7f-0a1b2c3d4e5f", "-1", "amount"},
		{id1, "7", "id"}, // the id of another debit
	} {
		p := debit(gw1, c.id, c.amount).problem(t, 400, problem+"invalid-request")
		if got := strings.Join(fields(p), ","); got != c.field {
			t.Errorf("debit id %q amount %s: fields %s, want %s", c.id, c.amount, got, c.field)
		}
	}
	if r := f.do("GET", "/v1/customers/acme/budgets", adminToken, nil); r.status != 200 || !strings.Contains(string(r.body), `"consumed":"10"`) {
		t.Fatalf("budgets after debits of 6 and 4: %d %s", r.status, r.body)
	}
}
