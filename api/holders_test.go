package api_test

import (
	"testing"

	"github.com/tally-ledger/tally/admission"
	"github.com/tally-ledger/tally/api"
)

// TestGenerationsMoveForwardInBoundedSteps: a holder's new generation may
// exceed its stored highest by at most admission.MaxGenerationStep, so one
// request cannot fence a holder for good (a generation of 2^63-1 used to
// make every later one stale); a holder can always move forward from the
// stored highest.
func TestGenerationsMoveForwardInBoundedSteps(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	f.do("PUT", "/v1/customers/acme/quotas/tokens", adminToken, map[string]any{"limit": "1000", "admission": "exact"})
	gw := f.gatewayToken("gw1")
	grant := func(gen int64) response {
		return f.do("POST", "/v1/grants", gw, map[string]any{"holder": "gw1", "generation": gen, "customer": "acme",
			"meter": "tokens", "amount": "1"})
	}
	if r := grant(1); r.status != 201 {
		t.Fatalf("generation 1: %d %s", r.status, r.body)
	}
	p := grant(9223372036854775807).problem(t, 400, api.TypeInvalidRequest)
	if got := fields(p); len(got) != 1 || got[0] != "generation" {
		t.Fatalf("a jump to 2^63-1: %+v", p)
	}
	if r := grant(2); r.status != 201 {
		t.Fatalf("generation 2 after the refused jump: %d %s", r.status, r.body)
	}
	top := int64(2 + admission.MaxGenerationStep)
	if r := grant(top); r.status != 201 {
		t.Fatalf("generation %d (the stored 2 plus the step): %d %s", top, r.status, r.body)
	}
	grant(top+admission.MaxGenerationStep+1).problem(t, 400, api.TypeInvalidRequest)
	// A new holder starts within a step of nothing.
	gw2 := f.gatewayToken("gw2")
	r := f.do("POST", "/v1/grants", gw2, map[string]any{"holder": "gw2", "generation": admission.MaxGenerationStep + 1,
		"customer": "acme", "meter": "tokens", "amount": "1"})
	r.problem(t, 400, api.TypeInvalidRequest)
}

// TestAnAdminRetiresAHolder: POST /v1/holders/{holder}/retire (admin
// only) ends the holder's live grants, counted as fully spent (nothing is
// handed back: its processes may still be admitting with them), and
// forgets its generation, so the holder starts again from any generation
// within a step of none.
func TestAnAdminRetiresAHolder(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	f.do("PUT", "/v1/customers/acme/quotas/tokens", adminToken, map[string]any{"limit": "100", "admission": "exact"})
	gw, cust := f.gatewayToken("gw1"), f.token("acme")
	grant := func(gen int64, amount string) response {
		return f.do("POST", "/v1/grants", gw, map[string]any{"holder": "gw1", "generation": gen, "customer": "acme",
			"meter": "tokens", "amount": amount, "ttl": "30s"})
	}
	if r := grant(1, "30"); r.status != 201 {
		t.Fatalf("%d %s", r.status, r.body)
	}
	if r := grant(admission.MaxGenerationStep, "20"); r.status != 201 {
		t.Fatalf("%d %s", r.status, r.body)
	}
	grant(5, "1").problem(t, 409, api.TypeStaleGeneration) // fenced: its process at 5 is stuck

	f.do("POST", "/v1/holders/gw1/retire", gw, nil).problem(t, 403, api.TypeForbidden)
	f.do("POST", "/v1/holders/gw1/retire", cust, nil).problem(t, 403, api.TypeForbidden)
	f.do("POST", "/v1/holders/nobody/retire", adminToken, nil).problem(t, 404, api.TypeNotFound)
	r := f.do("POST", "/v1/holders/gw1/retire", adminToken, nil)
	m := r.json(t)
	if r.status != 200 || m["holder"] != "gw1" || m["grants_ended"] != float64(2) ||
		m["previous_generation"] != float64(admission.MaxGenerationStep) {
		t.Fatalf("retire: %d %s", r.status, r.body)
	}
	if r := f.do("GET", "/v1/customers/acme/grants?state=live", adminToken, nil); len(asSlice(r.json(t)["items"])) != 0 {
		t.Fatalf("live grants after retiring their holder: %s", r.body)
	}
	b := asSlice(f.do("GET", "/v1/customers/acme/budgets", adminToken, nil).json(t)["items"])[0].(map[string]any)
	if b["consumed"] != "50" || b["live"] != "0" || b["stranded"] != "50" {
		t.Fatalf("the budget after retiring: %v (want 50 consumed: ended grants count as fully spent)", b)
	}
	if r := grant(5, "10"); r.status != 201 {
		t.Fatalf("the holder at generation 5 after retiring: %d %s", r.status, r.body)
	}
	// Retiring again ends the new grant and says so.
	if r := f.do("POST", "/v1/holders/gw1/retire", adminToken, nil); r.status != 200 || r.json(t)["grants_ended"] != float64(1) ||
		r.json(t)["previous_generation"] != float64(5) {
		t.Fatalf("retire again: %d %s", r.status, r.body)
	}
}
