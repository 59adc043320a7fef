package console_test

import (
	"net/http"
	"strconv"
	"testing"

	"github.com/tally-ledger/tally/api"
)

// TestConsolePagesCountAgainstTheTokensRate: a signed-in customer's pages
// take from the same per-token limit as its REST requests, and a customer
// page (about ten reads) costs as much as ten: with a burst of 25, two
// customer pages go through, the third is answered 429 with Retry-After,
// and the token's REST requests have only what the pages left.
func TestConsolePagesCountAgainstTheTokensRate(t *testing.T) {
	t.Parallel()
	f := newFixtureWith(t, false, func(c *api.Config) { c.TokenRate, c.TokenBurst = 0.01, 25 }, nil)
	f.calendar("acme", "UTC")
	tok := f.customerToken("acme")
	c := f.client()
	f.signInHTTP(c, tok) // the landing page is not loaded (no redirect followed)
	for i := range 2 {
		if res := f.get(c, "/console/customers/acme"); res.status != 200 {
			t.Fatalf("customer page %d: %d %s", i, res.status, res.body)
		}
	}
	res := f.get(c, "/console/customers/acme")
	if res.status != http.StatusTooManyRequests {
		t.Fatalf("a third customer page over the token's rate: %d, want 429", res.status)
	}
	if s, err := strconv.Atoi(res.header.Get("Retry-After")); err != nil || s < 1 {
		t.Fatalf("Retry-After %q", res.header.Get("Retry-After"))
	}
	// Sign-in 1 and two pages of 10: 4 of the burst are left for REST.
	ok := 0
	for range 10 {
		req, _ := http.NewRequest("GET", f.srv.URL+"/v1/customers/acme", nil)
		req.Header.Set("Authorization", "Bearer "+tok)
		if res := f.send(f.client(), req); res.status != 200 {
			break
		}
		ok++
	}
	if ok != 4 {
		t.Fatalf("REST with the same token after the pages: %d answered before a refusal, want 4", ok)
	}
	// The admin has no per-token limit.
	admin := f.client()
	f.signInHTTP(admin, adminToken)
	for range 5 {
		if res := f.get(admin, "/console/customers/acme"); res.status != 200 {
			t.Fatalf("admin: %d", res.status)
		}
	}
}
