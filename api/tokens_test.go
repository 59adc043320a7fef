package api_test

import (
	"fmt"
	"testing"
)

// TestTokensOverREST: an admin creates customer and gateway tokens over
// REST (the secret shown once), lists and revokes them; the new tokens
// work at once, a revoked one stops once the revocation is heard; no other
// caller may manage tokens.
func TestTokensOverREST(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	const problem = "urn:tally:problem:"

	r := f.do("POST", "/v1/tokens", adminToken, map[string]any{"customer": "newco", "description": "newco portal"})
	cust := r.json(t)
	secret, _ := cust["secret"].(string)
	if r.status != 201 || cust["customer"] != "newco" || cust["description"] != "newco portal" || len(secret) != 47 || cust["revoked_at"] != nil {
		t.Fatalf("create customer token: %d %s", r.status, r.body)
	}
	// It reads its customer, which exists from now on (zero usage).
	if r := f.do("GET", "/v1/customers/newco/usage", secret, nil); r.status != 200 {
		t.Fatalf("the new customer token: %d %s", r.status, r.body)
	}
	r = f.do("POST", "/v1/tokens", adminToken, map[string]any{"gateway": "gw-eu-1"})
	gw := r.json(t)
	gwSecret, _ := gw["secret"].(string)
	if r.status != 201 || gw["gateway"] != "gw-eu-1" || gw["customer"] != "" || gwSecret == "" {
		t.Fatalf("create gateway token: %d %s", r.status, r.body)
	}
	if r := f.do("PUT", "/v1/customers/newco/quotas/calls", adminToken, map[string]any{"limit": "10", "admission": "exact"}); r.status != 201 {
		t.Fatalf("rule: %d %s", r.status, r.body)
	}
	if r := f.do("POST", "/v1/grants", gwSecret, map[string]any{"holder": "gw-eu-1", "generation": 1, "customer": "newco", "meter": "calls", "amount": "1"}); r.status != 201 {
		t.Fatalf("a grant with the new gateway token: %d %s", r.status, r.body)
	}

	// Listed without secrets, oldest first; filtered by customer.
	r = f.do("GET", "/v1/tokens", adminToken, nil)
	items := asSlice(r.json(t)["items"])
	if r.status != 200 || len(items) != 2 || items[0].(map[string]any)["id"] != cust["id"] || items[1].(map[string]any)["gateway"] != "gw-eu-1" {
		t.Fatalf("list: %d %s", r.status, r.body)
	}
	for _, it := range items {
		if _, leaked := it.(map[string]any)["secret"]; leaked {
			t.Fatalf("a listed token shows its secret: %s", r.body)
		}
	}
	if r := f.do("GET", "/v1/tokens?customer=newco", adminToken, nil); len(asSlice(r.json(t)["items"])) != 1 {
		t.Fatalf("list of newco: %s", r.body)
	}

	// Revoked: it stops working once the API hears the revocation; revoking
	// again keeps the first time.
	r = f.do("POST", fmt.Sprintf("/v1/tokens/%s/revoke", cust["id"]), adminToken, nil)
	rev := r.json(t)
	if r.status != 200 || rev["revoked_at"] == nil || rev["customer"] != "newco" || rev["description"] != "newco portal" {
		t.Fatalf("revoke: %d %s", r.status, r.body)
	}
	f.sync()
	f.do("GET", "/v1/customers/newco/usage", secret, nil).problem(t, 401, problem+"unauthorized")
	if again := f.do("POST", fmt.Sprintf("/v1/tokens/%s/revoke", cust["id"]), adminToken, nil).json(t); again["revoked_at"] != rev["revoked_at"] {
		t.Fatalf("revoked again: %v, first %v", again["revoked_at"], rev["revoked_at"])
	}

	// Mistakes, each named.
	f.do("POST", "/v1/tokens/019a3c8e-7a40-7000-8000-0000000000d4/revoke", adminToken, nil).problem(t, 404, problem+"not-found")
	f.do("POST", "/v1/tokens/not-an-id/revoke", adminToken, nil).problem(t, 400, problem+"invalid-request")
	for _, body := range []map[string]any{{}, {"customer": "a", "gateway": "b"}, {"customer": "a b"}, {"gateway": ""}} {
		p := f.do("POST", "/v1/tokens", adminToken, body).problem(t, 400, problem+"invalid-request")
		if len(p.Errors) == 0 {
			t.Errorf("%v: no field named: %+v", body, p)
		}
	}
	// Only the admin manages tokens.
	for _, tok := range []string{f.token("acme"), gwSecret} {
		f.do("POST", "/v1/tokens", tok, map[string]any{"customer": "acme"}).problem(t, 403, problem+"forbidden")
		f.do("GET", "/v1/tokens", tok, nil).problem(t, 403, problem+"forbidden")
		f.do("POST", fmt.Sprintf("/v1/tokens/%s/revoke", gw["id"]), tok, nil).problem(t, 403, problem+"forbidden")
	}
	f.do("GET", "/v1/tokens", "", nil).problem(t, 401, problem+"unauthorized")
}
