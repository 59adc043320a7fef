package api_test

import "testing"

// A path parameter is percent-decoded once before it is checked: a client
// that escapes "-" (demo%2Dacme) reads demo-acme; it answered 400 as if the
// id held a "%". An escaped slash stays inside its parameter: it is an
// invalid id, never a route of its own.
func TestPathParametersArePercentDecoded(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	f.usage("demo-acme", "api_calls", date("2026-11-20T10:00:00Z"), "5")
	for _, p := range []string{
		"/v1/customers/demo%2Dacme",
		"/v1/customers/demo%2dacme",
		"/v1/customers/%64emo-acme/usage?meter=api%5Fcalls",
		"/v1/customers/demo%2Dacme/usage?meter=api_calls",
	} {
		r := f.do("GET", p, adminToken, nil)
		if r.status != 200 {
			t.Errorf("GET %s: %d %s", p, r.status, r.body)
			continue
		}
		if got := r.json(t)["customer"]; got != "demo-acme" {
			t.Errorf("GET %s: customer %v", p, got)
		}
	}
	if r := f.do("PUT", "/v1/meters/api%5Fcalls", adminToken, map[string]any{"kind": "counter", "unit": "call"}); r.status != 200 && r.status != 201 {
		t.Errorf("PUT /v1/meters/api%%5Fcalls: %d %s", r.status, r.body)
	} else if got := r.json(t)["meter"]; got != "api_calls" {
		t.Errorf("PUT /v1/meters/api%%5Fcalls declared %v", got)
	}
	for _, c := range []struct{ path, field string }{
		{"/v1/customers/demo%2Facme", "customer"},
		{"/v1/customers/demo-acme%2Fusage", "customer"},
		{"/v1/customers/demo%2Dacme%2F..%2Fother", "customer"},
		{"/v1/meters/api_calls%2Fx", "meter"},
	} {
		f.do("GET", c.path, adminToken, nil).fieldProblem(t, c.field, "is not 1-128 characters")
	}
	// Decoded once: %25 is a "%", which no id holds.
	f.do("GET", "/v1/customers/demo%2Dacme%2541", adminToken, nil).fieldProblem(t, "customer", `"demo-acme%41"`)
	f.do("GET", "/v1/customers/demo-acme%2541", adminToken, nil).fieldProblem(t, "customer", `"demo-acme%41"`)
}
