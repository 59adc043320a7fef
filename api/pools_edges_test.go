package api_test

import (
	"testing"
)

// A warn_at given with trailing zeros ("0.8000000000", ten digits of
// which nine count) is the fraction 0.8, as every other decimal of a rule
// reads it (amount.Check: trailing zeros do not count); it was refused as
// "0.8 has more than 9 digits after the point", on a pool's, the global
// and a customer's rule alike.
func TestWarnAtWithTrailingZerosIsItsValue(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	if r := f.do("PUT", "/v1/pools/free", adminToken, map[string]any{"members": []string{"acme"}}); r.status != 201 {
		t.Fatalf("pool: %d %s", r.status, r.body)
	}
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
