package api_test

import (
	"encoding/json"
	"net/http"
	"testing"
)

// A 404's detail names what is missing as a user would say it, never with
// a Go package's prefix ("alerts:", "pools:", "admission:"): `no alert
// "nope"`, as `no alert event "…"` and `no token …` are worded; nor does
// any other problem's detail carry one.
func TestNotFoundDetailsNameWhatIsMissing(t *testing.T) {
	t.Parallel()
	f := newFixture(t) // now: 2026-11-20T12:00Z
	if r := f.do("PUT", "/v1/customers/acme/quotas/tokens", adminToken, map[string]any{"limit": "100", "admission": "exact"}); r.status != 201 {
		t.Fatalf("exact rule: %d %s", r.status, r.body)
	}
	gw := f.gatewayToken("gw1")
	// A grant makes gw1 a known holder, so a report of an unknown grant is
	// a 404 rather than a fenced holder.
	if r := f.do("POST", "/v1/grants", gw, map[string]any{"holder": "gw1", "generation": 1, "customer": "acme",
		"meter": "tokens", "amount": "1", "ttl": "30s"}); r.status != 201 {
		t.Fatalf("grant: %d %s", r.status, r.body)
	}
	const unknown = "0193e0a1-7c00-7d4e-9a51-3c2f9b7e4a10"
	for _, tc := range []struct {
		method, path, token string
		body                any
		want                string
	}{
		{"GET", "/v1/alerts/nope", adminToken, nil, `no alert "nope"`},
		{"DELETE", "/v1/alerts/nope", adminToken, nil, `no alert "nope"`},
		{"GET", "/v1/webhooks/nope", adminToken, nil, `no webhook "nope"`},
		{"DELETE", "/v1/webhooks/nope", adminToken, nil, `no webhook "nope"`},
		{"POST", "/v1/webhooks/nope/rotate-secret", adminToken, map[string]any{}, `no webhook "nope"`},
		{"POST", "/v1/alert-events/" + unknown + "/redeliver", adminToken, nil, `no alert event "` + unknown + `"`},
		{"GET", "/v1/pools/nope", adminToken, nil, `no pool "nope"`},
		{"PUT", "/v1/pools/nope/quotas/tokens", adminToken, map[string]any{"limit": "10"}, `no pool "nope"`},
		{"POST", "/v1/holders/nope/retire", adminToken, nil, `no grant was ever issued to holder "nope"`},
		{"POST", "/v1/grants/" + unknown + "/renew", gw, map[string]any{"holder": "gw1", "generation": 1, "spent": "0"}, `no grant "` + unknown + `"`},
		{"POST", "/v1/grants/" + unknown + "/release", gw, map[string]any{"holder": "gw1", "generation": 1, "spent": "0"}, `no grant "` + unknown + `"`},
	} {
		p := f.do(tc.method, tc.path, tc.token, tc.body).problem(t, http.StatusNotFound, "urn:tally:problem:not-found")
		if p.Detail != tc.want {
			t.Errorf("%s %s: detail %q, want %q", tc.method, tc.path, p.Detail, tc.want)
		}
	}
	// Nor does any other problem's detail: refusals of exact admission.
	grant := func(gen int, meter, amount string) response {
		return f.do("POST", "/v1/grants", gw, map[string]any{"holder": "gw1", "generation": gen, "customer": "acme",
			"meter": meter, "amount": amount, "ttl": "30s"})
	}
	refusal := func(r response, typ, want string) {
		t.Helper()
		if p := r.problem(t, http.StatusConflict, "urn:tally:problem:"+typ); p.Detail != want {
			t.Errorf("%s: detail %q, want %q", typ, p.Detail, want)
		}
	}
	refusal(grant(1, "calls", "1"), "not-exact", `acme/calls has no quota rule`)
	refusal(grant(1, "tokens", "1000"), "budget-exhausted", `budget customer:acme/tokens exhausted: 99 available, retry after 35s`)
	if r := grant(2, "tokens", "1"); r.status != 201 {
		t.Fatalf("generation 2: %d %s", r.status, r.body)
	}
	refusal(grant(1, "tokens", "1"), "stale-generation",
		`holder gw1 generation 1 is older than its generation 2 (a holder that lost its state starts again at 3)`)
	// In a batch release, an item's problem is worded the same.
	r := f.do("POST", "/v1/grants/release", gw, map[string]any{"holder": "gw1", "releases": []map[string]any{
		{"grant": unknown, "generation": 2, "spent": "0"}}})
	var out struct {
		Items []struct {
			Status  int
			Problem *struct{ Detail string }
		}
	}
	if err := json.Unmarshal(r.body, &out); err != nil || r.status != 200 || len(out.Items) != 1 || out.Items[0].Problem == nil ||
		out.Items[0].Status != 404 || out.Items[0].Problem.Detail != `no grant "`+unknown+`"` {
		t.Errorf("batch release: %d %s", r.status, r.body)
	}
}
