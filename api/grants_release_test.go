package api_test

import (
	"encoding/json"
	"strings"
	"testing"
)

// POST /v1/grants/release: several releases of one holder in one call,
// each fenced by the holder and its own generation and decided all or
// nothing on its own; the answer lists every outcome in order, and only
// the accepted releases free their budget.
func TestReleaseSeveralGrants(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	const problem = "urn:tally:problem:"
	if r := f.do("PUT", "/v1/customers/acme/quotas/tokens", adminToken, map[string]any{"limit": "100", "admission": "exact"}); r.status != 201 {
		t.Fatalf("exact rule: %d %s", r.status, r.body)
	}
	gw1, gw2 := f.gatewayToken("gw1"), f.gatewayToken("gw2")
	grant := func(tok, holder string, gen int) string {
		t.Helper()
		r := f.do("POST", "/v1/grants", tok, map[string]any{"holder": holder, "generation": gen, "customer": "acme",
			"meter": "tokens", "amount": "10"})
		if r.status != 201 {
			t.Fatalf("grant: %d %s", r.status, r.body)
		}
		return r.json(t)["id"].(string)
	}
	old := grant(gw1, "gw1", 1)
	other := grant(gw2, "gw2", 1)
	a, b := grant(gw1, "gw1", 2), grant(gw1, "gw1", 2)
	release := func(tok, holder string, items ...map[string]any) response {
		return f.do("POST", "/v1/grants/release", tok, map[string]any{"holder": holder, "releases": items})
	}
	item := func(id string, gen int, spent string) map[string]any {
		return map[string]any{"grant": id, "generation": gen, "spent": spent}
	}
	// A gateway token speaks only for its own holder: the whole call is refused.
	release(gw1, "gw2", item(other, 1, "1")).problem(t, 403, problem+"forbidden")
	release(gw1, "gw1").problem(t, 400, problem+"invalid-request")

	r := release(gw1, "gw1", item(a, 2, "4"), item(old, 1, "1"), item(other, 2, "1"), item(b, 2, "11"), item(a, 2, "4"))
	if r.status != 200 {
		t.Fatalf("release: %d %s", r.status, r.body)
	}
	var out struct {
		Items []struct {
			Status int `json:"status"`
			Grant  *struct {
				ID, State, Spent string
			} `json:"grant"`
			Problem *struct{ Type string } `json:"problem"`
		} `json:"items"`
	}
	if err := json.Unmarshal(r.body, &out); err != nil || len(out.Items) != 5 {
		t.Fatalf("answer: %v %s", err, r.body)
	}
	if it := out.Items[0]; it.Status != 200 || it.Grant == nil || it.Grant.ID != a || it.Grant.State != "ended" || it.Grant.Spent != "4" {
		t.Errorf("release of a: %s", r.body)
	}
	for i, want := range map[int]string{1: "stale-generation", 2: "not-holder", 3: "invalid-request", 4: "grant-ended"} {
		if it := out.Items[i]; it.Problem == nil || it.Problem.Type != problem+want || it.Grant != nil {
			t.Errorf("item %d: %+v, want %s in %s", i, it, want, r.body)
		}
	}
	// Only a's 6 unspent units came back: 40 granted, 6 freed.
	if r := f.do("GET", "/v1/customers/acme/budgets", adminToken, nil); r.status != 200 {
		t.Fatalf("budgets: %d %s", r.status, r.body)
	} else if got := r.json(t)["items"].([]any)[0].(map[string]any)["consumed"]; got != "34" {
		t.Errorf("consumed %v, want 34: %s", got, r.body)
	}
	// The refused ones are untouched: b can still be released by its holder.
	if r := release(gw1, "gw1", item(b, 2, "10")); r.status != 200 || !json.Valid(r.body) {
		t.Fatalf("release b: %d %s", r.status, r.body)
	}
	// Each call's releases shared one transaction: two batches, 5 + 1.
	m := f.do("GET", "/metrics", adminToken, nil)
	for _, want := range []string{"tally_admission_report_batch_reports_sum 6", "tally_admission_report_batch_reports_count 2"} {
		if !strings.Contains(string(m.body), want) {
			t.Errorf("metrics lack %s", want)
		}
	}
}

// A release item with a grant id that is not a UUID, or not a string, is
// refused as invalid input naming the item's field, as the single release
// route names its id.
func TestReleaseItemsNameTheFieldAtFault(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	gw1 := f.gatewayToken("gw1")
	for _, c := range []struct {
		grant        any
		field, about string
	}{
		{"not-a-uuid", "releases[1].grant", `"not-a-uuid" is not a grant id`},
		{12, "releases[1].grant", "must be a string, not number"},
	} {
		ok := map[string]any{"grant": "0193a4c2-0000-7000-8000-000000000001", "generation": 1, "spent": "0"}
		bad := map[string]any{"grant": c.grant, "generation": 1, "spent": "0"}
		f.do("POST", "/v1/grants/release", gw1, map[string]any{"holder": "gw1", "releases": []any{ok, bad}}).fieldProblem(t, c.field, c.about)
	}
}

// Every value of the grant protocol's bodies that has a syntax of its own
// (amounts, durations, times) is refused as invalid input naming its
// field when it does not parse, as the quota routes do; it was answered
// malformed-json with the parser's words and no field.
func TestGrantBodiesNameTheValueAtFault(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	if r := f.do("PUT", "/v1/customers/acme/quotas/tokens", adminToken, map[string]any{"limit": "100", "admission": "exact"}); r.status != 201 {
		t.Fatalf("exact rule: %d %s", r.status, r.body)
	}
	gw1 := f.gatewayToken("gw1")
	grant := func(extra map[string]any) map[string]any {
		b := map[string]any{"holder": "gw1", "generation": 1, "customer": "acme", "meter": "tokens", "amount": "1"}
		for k, v := range extra {
			b[k] = v
		}
		return b
	}
	// A decimal is a string, as an adjustment's quantity: a JSON number is
	// refused (docs/api.md).
	f.do("POST", "/v1/grants", gw1, grant(map[string]any{"amount": 5})).fieldProblem(t, "amount", "exact decimal string")
	r := f.do("POST", "/v1/grants", gw1, grant(map[string]any{"amount": "5"}))
	if r.status != 201 {
		t.Fatalf("amount 5: %d %s", r.status, r.body)
	}
	id := r.json(t)["id"].(string)
	bypass := func(extra map[string]any) map[string]any {
		it := map[string]any{"customer": "acme", "meter": "tokens", "amount": "1", "admissions": 1,
			"first_at": "2026-12-06T00:00:00Z", "last_at": "2026-12-06T00:00:01Z"}
		for k, v := range extra {
			it[k] = v
		}
		return map[string]any{"holder": "gw1", "generation": 1, "report_id": "r1", "items": []any{it}}
	}
	release := func(spent any) map[string]any {
		return map[string]any{"holder": "gw1", "releases": []any{map[string]any{"grant": id, "generation": 1, "spent": spent}}}
	}
	for _, c := range []struct {
		path         string
		body         map[string]any
		field, about string
	}{
		{"/v1/grants", grant(map[string]any{"amount": "abc"}), "amount", `must be an exact decimal string like "12.5" or "-3" (no exponent, "+" or bare point; at most 9 digits after the point, 38 in all), not "abc"`},
		{"/v1/grants", grant(map[string]any{"amount": true}), "amount", "not true"},
		{"/v1/grants", grant(map[string]any{"min_amount": "x"}), "min_amount", "exact decimal string"},
		{"/v1/grants", grant(map[string]any{"ttl": "forever"}), "ttl", `must be a duration like "30s", or whole seconds, not "forever"`},
		{"/v1/grants/" + id + "/renew", map[string]any{"holder": "gw1", "generation": 1, "spent": "x"}, "spent", "exact decimal string"},
		{"/v1/grants/release", release("1/2"), "releases[0].spent", "exact decimal string"},
		{"/v1/bypasses", bypass(map[string]any{"amount": "x"}), "items[0].amount", "exact decimal string"},
		{"/v1/bypasses", bypass(map[string]any{"first_at": "yesterday"}), "items[0].first_at", `must be an RFC 3339 time, not "yesterday"`},
	} {
		f.do("POST", c.path, gw1, c.body).fieldProblem(t, c.field, c.about)
	}
}

// A renew or release that leaves out spent is refused naming it: a
// gateway whose report lost the field would otherwise record nothing
// spent and give every unit back, unbilled. The grant is untouched.
func TestReportsWithoutSpentAreRefused(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	if r := f.do("PUT", "/v1/customers/acme/quotas/tokens", adminToken, map[string]any{"limit": "100", "admission": "exact"}); r.status != 201 {
		t.Fatalf("exact rule: %d %s", r.status, r.body)
	}
	gw1 := f.gatewayToken("gw1")
	r := f.do("POST", "/v1/grants", gw1, map[string]any{"holder": "gw1", "generation": 1, "customer": "acme", "meter": "tokens", "amount": "20"})
	if r.status != 201 {
		t.Fatalf("grant: %d %s", r.status, r.body)
	}
	id := r.json(t)["id"].(string)
	for _, route := range []string{"renew", "release"} {
		f.do("POST", "/v1/grants/"+id+"/"+route, gw1, map[string]any{"holder": "gw1", "generation": 1}).fieldProblem(t, "spent", "required")
	}
	f.do("POST", "/v1/grants/release", gw1, map[string]any{"holder": "gw1", "releases": []any{
		map[string]any{"grant": id, "generation": 1, "spent": "1"}, map[string]any{"grant": id, "generation": 1}}}).fieldProblem(t, "releases[1].spent", "required")
	r = f.do("GET", "/v1/customers/acme/grants?state=live", adminToken, nil)
	if items := r.json(t)["items"].([]any); len(items) != 1 || items[0].(map[string]any)["spent"] != "0" {
		t.Fatalf("the grant after refused reports: %s", r.body)
	}
	if r := f.do("POST", "/v1/grants/"+id+"/release", gw1, map[string]any{"holder": "gw1", "generation": 1, "spent": "7"}); r.status != 200 {
		t.Fatalf("release with spent: %d %s", r.status, r.body)
	}
}

// A grant's ttl is kept as Tally keeps times, to the microsecond, and a
// grant lives at least a millisecond: "1ns" gave a grant valid for no time
// and "30.0000014s" an answer's valid_until that GET did not give back.
func TestGrantTTLIsWholeMicroseconds(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	if r := f.do("PUT", "/v1/customers/acme/quotas/tokens", adminToken, map[string]any{"limit": "100", "admission": "exact"}); r.status != 201 {
		t.Fatalf("exact rule: %d %s", r.status, r.body)
	}
	gw1 := f.gatewayToken("gw1")
	grant := func(ttl string) map[string]any {
		return map[string]any{"holder": "gw1", "generation": 1, "customer": "acme", "meter": "tokens", "amount": "1", "ttl": ttl}
	}
	for _, bad := range []string{"1ns", "999us", "30.0000014s"} {
		f.do("POST", "/v1/grants", gw1, grant(bad)).fieldProblem(t, "ttl", "whole microseconds from 1ms")
	}
	r := f.do("POST", "/v1/grants", gw1, grant("30.000001s"))
	if r.status != 201 {
		t.Fatalf("ttl 30.000001s: %d %s", r.status, r.body)
	}
	issued := r.json(t)
	id := issued["id"].(string)
	var stored any
	for _, g := range f.do("GET", "/v1/customers/acme/grants", adminToken, nil).json(t)["items"].([]any) {
		if g := g.(map[string]any); g["id"] == id {
			stored = g["valid_until"]
		}
	}
	if issued["valid_until"] != stored {
		t.Fatalf("valid_until answered %v, stored %v", issued["valid_until"], stored)
	}
	f.do("POST", "/v1/grants/"+id+"/renew", gw1, map[string]any{"holder": "gw1", "generation": 1, "spent": "0", "ttl": "1ns"}).fieldProblem(t, "ttl", "whole microseconds from 1ms")
}
