package api_test

import "testing"

// The admin bodies' values with a syntax of their own (a pool's and the
// global quota's limit, warn_at, max_skew and effective_at, a pool's
// effective_at, an alert's thresholds and hysteresis) are refused as
// invalid input naming their field when they do not parse; they were
// answered malformed-json with the parser's words and no field.
func TestAdminBodiesNameTheValueAtFault(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	f.putPool("team", "acme")
	alert := func(extra map[string]any) map[string]any {
		b := map[string]any{"subject": "customer:acme", "meter": "calls", "thresholds": []any{map[string]any{"percent": "80"}}}
		for k, v := range extra {
			b[k] = v
		}
		return b
	}
	for _, c := range []struct {
		path         string
		body         map[string]any
		field, about string
	}{
		{"/v1/pools/team/quotas/calls", map[string]any{"limit": "lots"}, "limit", `must be an exact decimal string like "12.5" or "-3" (no exponent`}, {"/v1/pools/team/quotas/calls", map[string]any{"limit": "lots"}, "limit", `, not "lots"`},
		{"/v1/global/quotas/calls", map[string]any{"limit": "10", "warn_at": []int{1}}, "warn_at", "exact decimal string"},
		{"/v1/global/quotas/calls", map[string]any{"limit": "10", "max_skew": "soon"}, "max_skew", `must be a duration like "30s"`},
		{"/v1/pools/team/quotas/calls", map[string]any{"limit": "10", "effective_at": "tomorrow"}, "effective_at", "an RFC 3339 time"},
		{"/v1/pools/team", map[string]any{"members": []string{"acme"}, "effective_at": 12}, "effective_at", "not 12"},
		{"/v1/alerts/a1", alert(map[string]any{"hysteresis_percent": "a bit"}), "hysteresis_percent", "exact decimal string"},
		{"/v1/alerts/a1", alert(map[string]any{"thresholds": []any{map[string]any{"percent": "most"}}}), "thresholds[0].percent", "exact decimal string"},
		{"/v1/alerts/a1", alert(map[string]any{"thresholds": []any{map[string]any{"percent": "80"}, map[string]any{"percent": true}}}), "thresholds[1].percent", "exact decimal string"},
	} {
		f.do("PUT", c.path, adminToken, c.body).fieldProblem(t, c.field, c.about)
	}
}

// A value of the wrong type inside an array is named by its JSON path,
// index included, as every other field problem is (docs/api.md): the
// decoder's own path left the index out (thresholds.percent), so a
// client could not tell which element was at fault.
func TestTypeErrorsNameTheElementAtFault(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	const grantID = "0193e0a1-7c00-7d4e-9a51-3c2f9b7e4a10"
	for _, c := range []struct {
		method, path, body, field, about string
	}{
		{"PUT", "/v1/alerts/a1", `{"subject":"customer:acme","meter":"calls","thresholds":[{"percent":"80"},{"percent":5}]}`,
			"thresholds[1].percent", "exact decimal string"},
		{"POST", "/v1/grants/release", `{"holder":"gw","releases":[{"grant":"` + grantID + `","generation":1,"spent":"1"},{"grant":"` + grantID + `","generation":1,"spent":"1e2"}]}`,
			"releases[1].spent", `not "1e2"`},
		{"POST", "/v1/grants/release", `{"holder":"gw","releases":[{"grant":"` + grantID + `","generation":"1","spent":"1"}]}`,
			"releases[0].generation", "must be an integer in range, not string"},
		{"PUT", "/v1/pools/team", `{"members":["acme",5]}`, "members[1]", "must be a string, not number"},
	} {
		r := f.do(c.method, c.path, adminToken, c.body)
		if r.status != 400 {
			t.Errorf("%s %s %s: %d %s", c.method, c.path, c.body, r.status, r.body)
			continue
		}
		r.fieldProblem(t, c.field, c.about)
	}
}

// A pool's or the global rule without a limit or a rate is refused on
// limit, as a customer's is: it was stored as an exact limit of 0, which
// refuses every member.
func TestScopeRuleWithoutLimitOrRateIsRefused(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	f.putPool("team", "acme")
	for _, path := range []string{"/v1/pools/team/quotas/calls", "/v1/global/quotas/calls"} {
		f.do("PUT", path, adminToken, map[string]any{"admission": "exact"}).fieldProblem(t, "limit", "is required (or a rate)")
		f.do("PUT", path, adminToken, map[string]any{"limit": nil}).fieldProblem(t, "limit", "is required (or a rate)")
	}
}

// A null where a decimal is required is refused saying that the value is
// required, for every such field alike: a customer's limit answered
// `"": not a decimal number` (null was read as the empty string), and a
// grant's, debit's or bypass item's amount null was read as 0.
func TestNullRequiredDecimalIsRefusedAsRequired(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	f.putPool("team", "acme")
	for _, c := range []struct {
		method, path, body, field, about string
	}{
		{"PUT", "/v1/customers/acme/quotas/calls", `{"limit":null}`, "limit", "is required (or a rate)"},
		{"PUT", "/v1/pools/team/quotas/calls", `{"limit":null}`, "limit", "is required (or a rate)"},
		{"PUT", "/v1/customers/acme/quotas/calls", `{"rate":{"amount":null,"per":"1s","burst":"5"},"admission":"exact"}`, "rate.amount", "is required"},
		{"POST", "/v1/grants", `{"holder":"gw","generation":1,"customer":"acme","meter":"calls","amount":null}`, "amount", "is required"},
		{"POST", "/v1/grants/debits", `{"id":"0193e0a1-7c00-7d4e-9a51-3c2f9b7e4a10","holder":"gw","generation":1,"customer":"acme","meter":"calls","amount":null}`, "amount", "is required"},
		{"POST", "/v1/bypasses", `{"holder":"gw","generation":1,"report_id":"r1","items":[{"customer":"acme","meter":"calls","amount":null,"admissions":1,"first_at":"2026-01-01T00:00:00Z","last_at":"2026-01-01T00:00:00Z"}]}`, "items[0].amount", "is required"},
	} {
		r := f.do(c.method, c.path, adminToken, c.body)
		if r.status != 400 {
			t.Errorf("%s %s %s: %d %s", c.method, c.path, c.body, r.status, r.body)
			continue
		}
		r.fieldProblem(t, c.field, c.about)
	}
}

// The zero time (0001-01-01T00:00:00Z) given as an instant is refused on
// its field: it read as if the field were left out, so a rule or a
// membership change took effect now.
func TestZeroTimeIsRefusedNotTakenAsNow(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	f.putPool("team", "acme")
	const zero = "0001-01-01T00:00:00Z"
	for _, c := range []struct {
		path string
		body map[string]any
	}{
		{"/v1/customers/acme/quotas/calls", map[string]any{"limit": "10", "effective_at": zero}},
		{"/v1/pools/team/quotas/calls", map[string]any{"limit": "10", "effective_at": zero}},
		{"/v1/global/quotas/calls", map[string]any{"limit": "10", "effective_at": zero}},
		{"/v1/pools/team", map[string]any{"members": []string{"acme", "beta"}, "effective_at": zero}},
	} {
		r := f.do("PUT", c.path, adminToken, c.body)
		if r.status != 400 {
			t.Errorf("PUT %s %v: %d %s", c.path, c.body, r.status, r.body)
			continue
		}
		r.fieldProblem(t, "effective_at", "zero time")
	}
}
