package api_test

import (
	"slices"
	"strings"
	"testing"

	"github.com/tally-ledger/tally/api"
)

func TestQuotas(t *testing.T) {
	t.Parallel()
	f := newFixture(t) // now: 2026-11-20T12:00Z
	f.usage("acme", "api_calls", date("2026-11-10T10:00:00Z"), "850")

	// A known customer without rules has none.
	if r := f.do("GET", "/v1/customers/acme/quotas", adminToken, nil); r.status != 200 || string(r.body) != `{"items":[],"rate_rules":[],"next_cursor":""}`+"\n" {
		t.Fatalf("no rules: %d %s", r.status, r.body)
	}
	r := f.do("PUT", "/v1/customers/acme/quotas/api_calls", adminToken, map[string]any{"limit": "1000", "reason": "plan: pro"})
	rule := r.json(t)
	if r.status != 201 || r.header.Get("Location") != "/v1/customers/acme/quotas" || rule["version"] != 1.0 ||
		rule["limit"] != "1000" || rule["warn_at"] != "0.8" || rule["mode"] != "enforce" || rule["stale_after"] != "5m" || rule["actor"] != "admin" {
		t.Fatalf("first version: %d %s", r.status, r.body)
	}
	r = f.do("PUT", "/v1/customers/acme/quotas/api_calls", adminToken,
		map[string]any{"limit": "2000", "warn_at": "0.4", "mode": "shadow", "stale_after": "10m", "actor": "ops@example.com"})
	rule = r.json(t)
	if r.status != 200 || rule["version"] != 2.0 || rule["limit"] != "2000" || rule["mode"] != "shadow" || rule["stale_after"] != "10m" || rule["actor"] != "ops@example.com" {
		t.Fatalf("second version: %d %s", r.status, r.body)
	}

	// Read by the customer's own token: usage counted from the period start.
	tok := f.token("acme")
	r = f.do("GET", "/v1/customers/acme/quotas", tok, nil)
	items := asSlice(r.json(t)["items"])
	if r.status != 200 || len(items) != 1 {
		t.Fatalf("quotas: %d %s", r.status, r.body)
	}
	q := items[0].(map[string]any)
	if q["meter"] != "api_calls" || q["period"] != "2026-11-01" || q["used"] != "850" || q["remaining"] != "1150" ||
		q["state"] != "warning" || q["rule"].(map[string]any)["version"] != 2.0 || q["as_of"] != nil || q["decision"] != nil {
		t.Fatalf("quota: %s", r.body)
	}

	// Errors.
	f.do("GET", "/v1/customers/nobody/quotas", adminToken, nil).problem(t, 404, "urn:tally:problem:not-found")
	f.do("GET", "/v1/customers/acme/quotas", f.token("globex"), nil).problem(t, 404, "urn:tally:problem:not-found")
	f.do("PUT", "/v1/customers/acme/quotas/api_calls", tok, map[string]any{"limit": "1"}).problem(t, 403, "urn:tally:problem:forbidden")
	p := f.do("PUT", "/v1/customers/acme/quotas/api_calls", adminToken,
		map[string]any{"limit": "lots", "warn_at": "1.5", "on_stale": "panic"}).problem(t, 400, "urn:tally:problem:invalid-request")
	if got := strings.Join(fields(p), ","); got != "limit,on_stale,warn_at" {
		t.Fatalf("fields %s: %+v", got, p)
	}
	// Values of the wrong JSON type are reported with the other problems.
	p = f.do("PUT", "/v1/customers/acme/quotas/api_calls", adminToken,
		map[string]any{"limit": "-1", "mode": 5, "stale_after": "soon", "effective_at": "yesterday"}).problem(t, 400, "urn:tally:problem:invalid-request")
	if got := strings.Join(fields(p), ","); got != "effective_at,limit,mode,stale_after" {
		t.Fatalf("fields %s: %+v", got, p)
	}
	p = f.do("PUT", "/v1/customers/acme/quotas/api_calls", adminToken, map[string]any{}).problem(t, 400, "urn:tally:problem:invalid-request")
	if got := strings.Join(fields(p), ","); got != "limit" {
		t.Fatalf("fields %s: %+v", got, p)
	}
	p = f.do("PUT", "/v1/customers/acme/quotas/api_calls", adminToken, map[string]any{"limit": "1", "limt": "2"}).problem(t, 400, "urn:tally:problem:invalid-request")
	if got := strings.Join(fields(p), ","); got != "limt" {
		t.Fatalf("fields %s", got)
	}
	p = f.do("PUT", "/v1/customers/acme/quotas/api_calls", adminToken,
		map[string]any{"limit": "1", "effective_at": "2026-01-01T00:00:00Z"}).problem(t, 400, "urn:tally:problem:invalid-request")
	if got := strings.Join(fields(p), ","); got != "effective_at" || !strings.Contains(p.Errors[0].Detail, "version 2") {
		t.Fatalf("fields %s: %+v", got, p)
	}
	p = f.do("PUT", "/v1/customers/acme/quotas/a%20b", adminToken, map[string]any{"limit": "1"}).problem(t, 400, "urn:tally:problem:invalid-request")
	if got := strings.Join(fields(p), ","); got != "meter" {
		t.Fatalf("fields %s", got)
	}
	f.do("PUT", "/v1/customers/acme/quotas/api_calls", adminToken, `{"limit": "1"} {}`).problem(t, 400, "urn:tally:problem:malformed-json")
}

// TestPutQuotaEveryProblemAtOnce: a PUT body is decoded once, and every
// value of a wrong JSON type (null included, where the type refuses it) is
// reported with quota's own checks, each with its field and detail.
func TestPutQuotaEveryProblemAtOnce(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	p := f.do("PUT", "/v1/customers/acme/quotas/api_calls", adminToken, map[string]any{
		"limit": "1", "mode": nil, "stale_after": nil, "reason": 7, "admission": true, "on_unreachable": 1,
		"local_every": "x", "local_amount": "-3"}).problem(t, 400, "urn:tally:problem:invalid-request")
	want := []api.FieldError{
		{Field: "admission", Detail: `must be a string, not "true"`},
		{Field: "local_every", Detail: `must be whole seconds or a duration such as "5m", not "\"x\""`},
		{Field: "on_unreachable", Detail: `must be a string, not "1"`},
		{Field: "on_unreachable", Detail: `local_amount and local_every go only with "local"`},
		{Field: "reason", Detail: `must be a string, not "7"`},
	}
	if !slices.Equal(p.Errors, want) {
		t.Fatalf("errors\n%+v\nwant\n%+v", p.Errors, want)
	}
}

// Durations have one form in and out: a rule's stale_after and
// local_every, given as "10m" and "1m", come back as "10m" and "1m", in
// the rule and in the grant that carries the rule's policy; the error for
// a bad local_every asks for that same form.
func TestRuleDurationsOneFormInAndOut(t *testing.T) {
	t.Parallel()
	f := newFixture(t) // now: 2026-11-20T12:00Z
	f.usage("acme", "api_calls", date("2026-11-10T10:00:00Z"), "1")
	r := f.do("PUT", "/v1/customers/acme/quotas/api_calls", adminToken, map[string]any{"limit": "1000", "stale_after": "10m",
		"admission": "exact", "on_unreachable": "local", "local_amount": "50", "local_every": "1m"})
	if rule := r.json(t); r.status != 201 || rule["stale_after"] != "10m" || rule["local_every"] != "1m" {
		t.Fatalf("put: %d %s", r.status, r.body)
	}
	r = f.do("GET", "/v1/customers/acme/quotas", adminToken, nil)
	if rule := asSlice(r.json(t)["items"])[0].(map[string]any)["rule"].(map[string]any); rule["stale_after"] != "10m" || rule["local_every"] != "1m" {
		t.Fatalf("get: %s", r.body)
	}
	g := f.do("POST", "/v1/grants", f.gatewayToken("gw1"), map[string]any{"holder": "gw1", "generation": 1, "customer": "acme",
		"meter": "api_calls", "amount": "10", "ttl": "30s"})
	if g.status != 201 || g.json(t)["local_every"] != "1m" {
		t.Fatalf("grant: %d %s", g.status, g.body)
	}
	p := f.do("PUT", "/v1/customers/acme/quotas/api_calls", adminToken, map[string]any{"limit": "1000", "admission": "exact",
		"on_unreachable": "local", "local_amount": "50", "local_every": "1.5s"}).problem(t, 400, "urn:tally:problem:invalid-request")
	if len(p.Errors) != 1 || p.Errors[0].Field != "local_every" || !strings.Contains(p.Errors[0].Detail, `"1m"`) {
		t.Fatalf("local_every error: %+v", p.Errors)
	}
}
