package api_test

import "testing"

// "." and ".." are no ids nor names: a URL holding one names its parent
// (/v1/customers/.. is /v1/), so whatever carried one could be read by no
// one. Every way in refuses them, naming the field.
func TestDotsAreNoIds(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	for _, id := range []string{".", ".."} {
		f.do("POST", "/v1/adjustments", adminToken, map[string]any{"operation_id": "0193e0a1-7c00-7d4e-9a51-3c2f9b7e4a10",
			"customer": id, "meter": "calls", "quantity": "1", "reason": "r", "actor": "a"}).fieldProblem(t, "customer", "not . or ..")
		f.do("POST", "/v1/tokens", adminToken, map[string]any{"customer": id}).fieldProblem(t, "customer", "not . or ..")
		f.do("PUT", "/v1/pools/gold", adminToken, map[string]any{"members": []string{id}}).fieldProblem(t, "members[0]", "not . or ..")
		f.do("GET", "/v1/customers/"+map[string]string{".": "%2E", "..": "%2E%2E"}[id]+"/usage", adminToken, nil).fieldProblem(t, "customer", "not . or ..")
	}
}
