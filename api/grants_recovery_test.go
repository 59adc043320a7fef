package api_test

import "testing"

// A gateway that lost its state starts again at generation 1: the refusal
// says which generation it recovers with, and that generation is served.
// A bypass report id reused for other content is refused, never dropped.
func TestHolderRecoveryAndBypassConflict(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	const problem = "urn:tally:problem:"
	if r := f.do("PUT", "/v1/customers/acme/quotas/tokens", adminToken, map[string]any{"limit": "100", "admission": "exact"}); r.status != 201 {
		t.Fatalf("exact rule: %d %s", r.status, r.body)
	}
	gw := f.gatewayToken("gw1")
	grant := func(gen int64) response {
		return f.do("POST", "/v1/grants", gw, map[string]any{"holder": "gw1", "generation": gen, "customer": "acme",
			"meter": "tokens", "amount": "10"})
	}
	if r := grant(4); r.status != 201 {
		t.Fatalf("grant: %d %s", r.status, r.body)
	}
	p := grant(1).problem(t, 409, problem+"stale-generation")
	if p.CurrentGeneration == nil || *p.CurrentGeneration != 4 || p.NextGeneration == nil || *p.NextGeneration != 5 {
		t.Fatalf("stale generation: %+v", p)
	}
	if r := grant(*p.NextGeneration); r.status != 201 {
		t.Fatalf("grant at the next generation: %d %s", r.status, r.body)
	}

	report := func(amount string) response {
		return f.do("POST", "/v1/bypasses", gw, map[string]any{"holder": "gw1", "generation": 5, "report_id": "bypass-1-0",
			"items": []map[string]any{{"customer": "acme", "meter": "tokens", "amount": amount, "admissions": 1,
				"first_at": "2026-11-20T11:00:00Z", "last_at": "2026-11-20T11:00:00Z"}}})
	}
	for range 2 {
		if r := report("3"); r.status != 200 {
			t.Fatalf("bypass report: %d %s", r.status, r.body)
		}
	}
	report("4").problem(t, 409, problem+"bypass-conflict")
}
