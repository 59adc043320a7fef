package api_test

import (
	"testing"

	"github.com/tally-ledger/tally/api"
)

// A NUL character (U+0000, JSON "\u0000") in any string a request carries
// is refused as invalid input naming where it was — the body's field by its
// JSON path, the query parameter, the path parameter — before anything
// reaches Postgres, whose text cannot hold it (it was a 500, SQLSTATE
// 22021).
func TestNULRefusedNamingTheField(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	f.putPool("team", "acme")
	const op = `"operation_id":"0193e0a1-7c00-7d4e-9a51-3c2f9b7e4a10","customer":"acme","meter":"calls","quantity":"1"`
	const alert = `"subject":"customer:acme","meter":"calls","thresholds":[{"percent":"80"}]`
	for _, c := range []struct {
		method, path, body, field string
	}{
		{"POST", "/v1/adjustments", `{` + op + `,"reason":"outage\u0000","actor":"me"}`, "reason"},
		{"POST", "/v1/adjustments", `{` + op + `,"reason":"outage","actor":"\u0000"}`, "actor"},
		{"POST", "/v1/tokens", `{"customer":"acme","description":"portal\u0000"}`, "description"},
		{"PUT", "/v1/meters/calls", `{"kind":"counter","unit":"call\u0000"}`, "unit"},
		{"PUT", "/v1/meters/calls", `{"kind":"counter","description":"a\u0000b"}`, "description"},
		{"PUT", "/v1/customers/acme", `{"cadence":"monthly","zone":"UTC\u0000"}`, "zone"},
		{"PUT", "/v1/customers/acme/quotas/calls", `{"limit":"10","reason":"why\u0000"}`, "reason"},
		{"PUT", "/v1/customers/acme/quotas/calls", `{"limit":"10","actor":"\u0000"}`, "actor"},
		{"PUT", "/v1/pools/team", `{"members":["acme"],"actor":"ops\u0000"}`, "actor"},
		{"PUT", "/v1/pools/team", `{"members":["acme","b\u0000"]}`, "members[1]"},
		{"PUT", "/v1/pools/team/quotas/calls", `{"limit":"10","reason":"\u0000"}`, "reason"},
		{"POST", "/v1/customers/acme/periods/2026-10-01/close", `{"force":true,"reason":"late\u0000"}`, "reason"},
		{"PUT", "/v1/alerts/a1", `{` + alert + `,"actor":"ops\u0000"}`, "actor"},
		{"PUT", "/v1/alerts/a1", `{` + alert + `,"endpoints":["w","\u0000"]}`, "endpoints[1]"},
		{"PUT", "/v1/webhooks/w", `{"url":"https://example.com/\u0000"}`, "url"},
		{"POST", "/v1/grants/release", `{"holder":"gw","releases":[{"grant":"0193e0a1-7c00-7d4e-9a51-3c2f9b7e4a10","generation":1,"spent":"1"},{"grant":"\u0000","generation":1,"spent":"1"}]}`, "releases[1].grant"},
		{"POST", "/v1/reconciliations", `{"period":"2026-10-01","customer":"acme\u0000"}`, "customer"},
		// Query and path parameters (%00).
		{"GET", "/v1/alert-events?alert=a%00b", "", "alert"},
		{"GET", "/v1/alert-events?cursor=" + api.CursorFor("/v1/alert-events", "a\x00b", "1"), "", "cursor"},
		{"GET", "/v1/alerts/a%00b", "", "name"},
		{"DELETE", "/v1/alerts/a%00b", "", "name"},
		{"GET", "/v1/webhooks/a%00b", "", "name"},
		{"GET", "/v1/pools/a%00b", "", "name"},
	} {
		var body any
		if c.body != "" {
			body = c.body
		}
		r := f.do(c.method, c.path, adminToken, body)
		if r.status != 400 {
			t.Errorf("%s %s %s: %d %s", c.method, c.path, c.body, r.status, r.body)
			continue
		}
		if c.field == "cursor" {
			r.fieldProblem(t, c.field, "not a cursor")
			continue
		}
		r.fieldProblem(t, c.field, "NUL")
	}
	// Nothing was written.
	var n int
	if err := f.pool.QueryRow(t.Context(), `SELECT (SELECT count(*) FROM entries) + (SELECT count(*) FROM api_tokens) + (SELECT count(*) FROM quota_rules) + (SELECT count(*) FROM alert_rules)`).Scan(&n); err != nil {
		t.Fatal(err)
	}
	if n != 0 {
		t.Errorf("%d entries, tokens, quota and alert rules written", n)
	}
}

// A body's keys match its fields exactly: a key given twice is refused
// naming it (encoding/json took the last), and a key that differs from a
// field only in case is an unknown field (encoding/json matched it to the
// field, so {"customer":"cx","Customer":"other"} booked to "other").
// Nested keys are named by their JSON path (thresholds[0].x, not x).
func TestBodyKeysMatchExactlyOnce(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	f.putPool("team", "acme")
	const op = `"operation_id":"0193e0a1-7c00-7d4e-9a51-3c2f9b7e4a10","meter":"calls","quantity":"1","reason":"r","actor":"me"`
	const alert = `"subject":"customer:acme","meter":"calls"`
	const grant = `"0193e0a1-7c00-7d4e-9a51-3c2f9b7e4a10"`
	for _, c := range []struct {
		method, path, body, field, about string
	}{
		{"POST", "/v1/adjustments", `{` + op + `,"customer":"cx","Customer":"other"}`, "Customer", "unknown field"},
		{"POST", "/v1/adjustments", `{` + op + `,"customer":"cx","customer":"other"}`, "customer", "duplicate field"},
		{"POST", "/v1/tokens", `{"customer":"acme","description":"a","DESCRIPTION":"b"}`, "DESCRIPTION", "unknown field"},
		{"POST", "/v1/tokens", `{"customer":"acme","customer":"other"}`, "customer", "duplicate field"},
		{"PUT", "/v1/customers/acme", `{"cadence":"monthly","Zone":"UTC"}`, "Zone", "unknown field"},
		{"PUT", "/v1/meters/calls", `{"kind":"counter","kind":"gauge"}`, "kind", "duplicate field"},
		{"PUT", "/v1/customers/acme/quotas/calls", `{"limit":"10","limit":"20"}`, "limit", "duplicate field"},
		{"PUT", "/v1/customers/acme/quotas/calls", `{"limit":"10","Limit":"20"}`, "Limit", "unknown field"},
		{"PUT", "/v1/customers/acme/quotas/calls", `{"rate":{"amount":"1","per":"1s","burst":"2","amount":"5"},"admission":"exact"}`, "rate.amount", "duplicate field"},
		{"PUT", "/v1/pools/team", `{"members":["acme"],"Members":["other"]}`, "Members", "unknown field"},
		{"PUT", "/v1/alerts/a1", `{` + alert + `,"thresholds":[{"percent":"80"},{"percent":"90","percent":"95"}]}`, "thresholds[1].percent", "duplicate field"},
		{"PUT", "/v1/alerts/a1", `{` + alert + `,"thresholds":[{"percent":"80","x":1}]}`, "thresholds[0].x", "unknown field"},
		{"PUT", "/v1/alerts/a1", `{` + alert + `,"thresholds":[{"Percent":"80"}]}`, "thresholds[0].Percent", "unknown field"},
		{"POST", "/v1/grants/release", `{"holder":"gw","releases":[{"grant":` + grant + `,"generation":1,"Spent":"1"}]}`, "releases[0].Spent", "unknown field"},
		{"POST", "/v1/grants", `{"holder":"gw","generation":1,"customer":"acme","meter":"calls","amount":"1","amount":"100"}`, "amount", "duplicate field"},
	} {
		r := f.do(c.method, c.path, adminToken, c.body)
		if r.status != 400 {
			t.Errorf("%s %s %s: %d %s", c.method, c.path, c.body, r.status, r.body)
			continue
		}
		r.fieldProblem(t, c.field, c.about)
	}
	var n int
	if err := f.pool.QueryRow(t.Context(), `SELECT (SELECT count(*) FROM entries) + (SELECT count(*) FROM api_tokens) + (SELECT count(*) FROM quota_rules) + (SELECT count(*) FROM alert_rules)`).Scan(&n); err != nil {
		t.Fatal(err)
	}
	if n != 0 {
		t.Errorf("%d entries, tokens, quota and alert rules written", n)
	}
}

// Every decimal a body gives follows the adjustments' one rule
// (amount.Parse): a JSON string of digits with an optional leading "-" and
// an optional point with digits on both sides, at most 9 digits after it
// and 38 in all. Grants took exponents, "+", bare points and JSON numbers,
// alert thresholds exponents.
func TestDecimalsFollowOneRule(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	f.putPool("team", "acme")
	const grantID = "0193e0a1-7c00-7d4e-9a51-3c2f9b7e4a10"
	grant := func(amount string) string {
		return `{"holder":"gw","generation":1,"customer":"acme","meter":"calls","amount":` + amount + `}`
	}
	for _, bad := range []string{`"1e1"`, `"+5"`, `".5"`, `"5."`, `"2.5e-1"`, `"0x10"`, `" 5"`, `"1.0000000001"`, `"NaN"`, `5`, `2.5`, `true`} {
		f.do("POST", "/v1/grants", adminToken, grant(bad)).fieldProblem(t, "amount", "decimal string")
	}
	for _, c := range []struct {
		method, path, body, field string
	}{
		{"POST", "/v1/grants", `{"holder":"gw","generation":1,"customer":"acme","meter":"calls","amount":"10","min_amount":"1e0"}`, "min_amount"},
		{"POST", "/v1/grants/debits", `{"id":"` + grantID + `","holder":"gw","generation":1,"customer":"acme","meter":"calls","amount":"+5"}`, "amount"},
		{"POST", "/v1/grants/" + grantID + "/release", `{"holder":"gw","generation":1,"spent":".5"}`, "spent"},
		{"POST", "/v1/grants/" + grantID + "/renew", `{"holder":"gw","generation":1,"spent":5}`, "spent"},
		{"POST", "/v1/bypasses", `{"holder":"gw","generation":1,"report_id":"` + grantID + `","items":[{"customer":"acme","meter":"calls","amount":"1E2","admissions":1,"first_at":"2026-11-20T12:00:00Z","last_at":"2026-11-20T12:00:00Z"}]}`, "items[0].amount"},
		{"PUT", "/v1/alerts/a1", `{"subject":"customer:acme","meter":"calls","thresholds":[{"percent":"1e2"}]}`, "thresholds[0].percent"},
		{"PUT", "/v1/alerts/a1", `{"subject":"customer:acme","meter":"calls","thresholds":[{"percent":"50"},{"percent":"90"},{"percent":"1e2"}]}`, "thresholds[2].percent"},
		{"PUT", "/v1/alerts/a1", `{"subject":"customer:acme","meter":"calls","thresholds":[{"value":"10"},{"value":1000}]}`, "thresholds[1].value"},
		{"PUT", "/v1/alerts/a1", `{"subject":"customer:acme","meter":"calls","thresholds":[{"percent":"80"}],"hysteresis_percent":"5."}`, "hysteresis_percent"},
		{"PUT", "/v1/pools/team/quotas/calls", `{"limit":"1e3"}`, "limit"},
		{"PUT", "/v1/global/quotas/calls", `{"limit":"100","warn_at":".5"}`, "warn_at"},
	} {
		f.do(c.method, c.path, adminToken, c.body).fieldProblem(t, c.field, "decimal string")
	}
	// The forms the rule takes are still taken.
	for _, c := range []struct{ path, body string }{
		{"/v1/pools/team/quotas/calls", `{"limit":"1000.5","warn_at":"0.75"}`},
		{"/v1/alerts/a1", `{"subject":"customer:acme","meter":"calls","thresholds":[{"percent":"80"},{"value":"1500.25"}],"hysteresis_percent":"5"}`},
	} {
		if r := f.do("PUT", c.path, adminToken, c.body); r.status != 201 {
			t.Errorf("PUT %s %s: %d %s", c.path, c.body, r.status, r.body)
		}
	}
}

// An unknown query parameter is refused naming the ones the route takes,
// and on a route that takes none, saying so (not "allowed: " and nothing).
func TestUnknownQueryParameterSaysWhatTheRouteTakes(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	f.usage("acme", "calls", f.clock(), "1")
	f.do("GET", "/v1/customers/acme/usage?bogus=1", adminToken, nil).fieldProblem(t, "bogus", "allowed: meter, period, group_by")
	f.do("GET", "/v1/customers/acme/quotas?limit=1", adminToken, nil).fieldProblem(t, "limit", "unknown query parameter; this route takes none")
}
