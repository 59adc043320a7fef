package console_test

import (
	"net/http"
	"testing"

	"github.com/tally-ledger/tally/api"
)

// BenchmarkCustomerPage compares the console's customer page (usage,
// quotas, rule history, periods, budgets and grants: several reads and a
// rendered chart) with the REST usage answer it is built around, both
// uncached, over HTTP on the same server. Compare the two ns/op.
func BenchmarkCustomerPage(b *testing.B) {
	f := newFixtureWith(b, false, func(c *api.Config) { c.AddressRate = -1 }, nil) // no rate limit
	f.demo()
	c := f.client()
	f.signInHTTP(c, adminToken)
	b.Run("rest_usage", func(b *testing.B) {
		for b.Loop() {
			req, _ := http.NewRequest("GET", f.srv.URL+"/v1/customers/acme/usage", nil)
			req.Header.Set("Authorization", "Bearer "+adminToken)
			if res := f.send(c, req); res.status != 200 {
				b.Fatalf("usage: %d", res.status)
			}
		}
	})
	b.Run("console_page", func(b *testing.B) {
		for b.Loop() {
			if res := f.get(c, "/console/customers/acme"); res.status != 200 {
				b.Fatalf("page: %d", res.status)
			}
		}
	})
}
