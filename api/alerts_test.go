package api_test

import (
	"fmt"
	"net/http"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/tally-ledger/tally/api"
)

// TestAlertRulesAndWebhooksOverREST: validation names every field at
// fault, a webhook's secret is shown once (and again only when rotated),
// private addresses need the operator's consent, rules are versioned and
// show each subject × threshold's state, and DELETE removes them.
func TestAlertRulesAndWebhooksOverREST(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	p := f.do("PUT", "/v1/alerts/bad", adminToken, map[string]any{"subject": "tenant:x", "meter": "calls",
		"thresholds": []any{map[string]any{"value": "1", "percent": "2"}, map[string]any{"percent": "0"}}, "notify_on": []string{"fired"}}).
		problem(t, http.StatusBadRequest, api.TypeInvalidRequest)
	if got, want := fields(p), []string{"subject", "thresholds[0]", "thresholds[1].percent", "notify_on[0]"}; !slices.Equal(got, want) {
		t.Fatalf("fields %v, want %v", got, want)
	}
	p = f.do("PUT", "/v1/alerts/a", adminToken, map[string]any{"subject": "customers", "meter": "calls",
		"thresholds": []any{map[string]any{"value": "10"}}, "endpoints": []string{"nobody"}}).problem(t, http.StatusBadRequest, api.TypeInvalidRequest)
	if got := fields(p); !slices.Equal(got, []string{"endpoints[0]"}) {
		t.Fatalf("fields %v", got)
	}
	p = f.do("PUT", "/v1/webhooks/ops", adminToken, map[string]any{"url": "http://10.1.2.3/hook"}).problem(t, http.StatusBadRequest, api.TypeInvalidRequest)
	if got := fields(p); !slices.Equal(got, []string{"url"}) {
		t.Fatalf("a private address without TALLY_WEBHOOK_ALLOW_PRIVATE: fields %v", got)
	}

	r := f.do("PUT", "/v1/webhooks/ops", adminToken, map[string]any{"url": "https://hooks.example.com/tally"})
	created := r.json(t)
	if r.status != http.StatusCreated || created["secret"] == nil || r.header.Get("Location") != "/v1/webhooks/ops" {
		t.Fatalf("create webhook: %d %s", r.status, r.body)
	}
	r = f.do("PUT", "/v1/webhooks/ops", adminToken, map[string]any{"url": "https://hooks.example.com/v2", "events": []string{"alert.triggered"}})
	if m := r.json(t); r.status != http.StatusOK || m["secret"] != nil || m["url"] != "https://hooks.example.com/v2" {
		t.Fatalf("change webhook: %d %s", r.status, r.body)
	}
	if m := f.do("GET", "/v1/webhooks/ops", adminToken, nil).json(t); m["secret"] != nil {
		t.Fatalf("GET shows the secret: %v", m)
	}
	r = f.do("POST", "/v1/webhooks/ops/rotate-secret", adminToken, nil)
	if m := r.json(t); r.status != http.StatusOK || m["secret"] == nil || m["secret"] == created["secret"] || m["previous_secret_valid_until"] != nil {
		t.Fatalf("rotate: %d %s", r.status, r.body)
	}
	// With an overlap, the secret replaced keeps signing until the time
	// the answer gives (docs/operations.md, "Alerts").
	r = f.do("POST", "/v1/webhooks/ops/rotate-secret", adminToken, map[string]any{"keep_previous_for": "24h"})
	until, _ := time.Parse(time.RFC3339Nano, fmt.Sprint(r.json(t)["previous_secret_valid_until"]))
	rotated, _ := time.Parse(time.RFC3339Nano, fmt.Sprint(r.json(t)["secret_rotated_at"]))
	if r.status != http.StatusOK || until.Sub(rotated) != 24*time.Hour {
		t.Fatalf("rotate with an overlap: %d %s", r.status, r.body)
	}
	if m := f.do("GET", "/v1/webhooks/ops", adminToken, nil).json(t); m["previous_secret_valid_until"] != r.json(t)["previous_secret_valid_until"] {
		t.Fatalf("GET after a rotation with an overlap: %v", m)
	}
	for _, bad := range []any{"8d", "169h", "-1s", "soon"} {
		f.do("POST", "/v1/webhooks/ops/rotate-secret", adminToken, map[string]any{"keep_previous_for": bad}).fieldProblem(t, "keep_previous_for", "")
	}

	rule := map[string]any{"subject": "customer:acme", "meter": "calls",
		"thresholds": []any{map[string]any{"percent": "80"}, map[string]any{"value": "5000"}}, "endpoints": []string{"ops"}}
	r = f.do("PUT", "/v1/alerts/acme-calls", adminToken, rule)
	if m := r.json(t); r.status != http.StatusCreated || m["version"] != float64(1) || r.header.Get("Location") != "/v1/alerts/acme-calls" {
		t.Fatalf("create rule: %d %s", r.status, r.body)
	}
	r = f.do("PUT", "/v1/alerts/acme-calls", adminToken, rule)
	if m := r.json(t); r.status != http.StatusOK || m["version"] != float64(2) {
		t.Fatalf("second version: %d %s", r.status, r.body)
	}
	states := f.do("GET", "/v1/alerts/acme-calls", adminToken, nil).json(t)["states"].([]any)
	if len(states) != 2 {
		t.Fatalf("states %v", states)
	}
	percent, value := states[0].(map[string]any), states[1].(map[string]any)
	if percent["state"] != "not_evaluated" || percent["note"] == nil || value["state"] != "ok" || value["at"] != "5000" {
		t.Fatalf("without a quota rule: %v %v", percent, value)
	}
	f.do("PUT", "/v1/customers/acme/quotas/calls", adminToken, map[string]any{"limit": "1000"})
	states = f.do("GET", "/v1/alerts/acme-calls", adminToken, nil).json(t)["states"].([]any)
	if s := states[0].(map[string]any); s["state"] != "ok" || s["at"] != "800" || s["limit"] != "1000" {
		t.Fatalf("with a quota rule: %v", s)
	}
	if items := f.do("GET", "/v1/alerts", adminToken, nil).json(t)["items"].([]any); len(items) != 1 {
		t.Fatalf("list: %v", items)
	}
	if r := f.do("DELETE", "/v1/alerts/acme-calls", adminToken, nil); r.status != http.StatusNoContent {
		t.Fatalf("delete: %d %s", r.status, r.body)
	}
	f.do("GET", "/v1/alerts/acme-calls", adminToken, nil).problem(t, http.StatusNotFound, api.TypeNotFound)
	f.do("DELETE", "/v1/alerts/acme-calls", adminToken, nil).problem(t, http.StatusNotFound, api.TypeNotFound)
	if r := f.do("PUT", "/v1/alerts/acme-calls", adminToken, rule); r.status != http.StatusCreated || r.json(t)["version"] != float64(4) {
		t.Fatalf("after delete: %d %s", r.status, r.body)
	}

	p = f.do("DELETE", "/v1/webhooks/ops", adminToken, nil).problem(t, http.StatusConflict, api.TypeWebhookInUse)
	if !strings.Contains(p.Detail, "acme-calls") {
		t.Fatalf("the detail does not name the rule: %q", p.Detail)
	}
	f.do("DELETE", "/v1/alerts/acme-calls", adminToken, nil)
	if r := f.do("DELETE", "/v1/webhooks/ops", adminToken, nil); r.status != http.StatusNoContent {
		t.Fatalf("delete an unused webhook: %d %s", r.status, r.body)
	}
	f.do("GET", "/v1/webhooks/ops", adminToken, nil).problem(t, http.StatusNotFound, api.TypeNotFound)
	f.do("DELETE", "/v1/webhooks/ops", adminToken, nil).problem(t, http.StatusNotFound, api.TypeNotFound)

	p = f.do("GET", "/v1/alert-events?state=lost", adminToken, nil).problem(t, http.StatusBadRequest, api.TypeInvalidRequest)
	if got := fields(p); !slices.Equal(got, []string{"state"}) {
		t.Fatalf("fields %v", got)
	}
	f.do("POST", "/v1/alert-events/not-a-uuid/redeliver", adminToken, nil).problem(t, http.StatusNotFound, api.TypeNotFound)
	if items := f.do("GET", "/v1/alert-events?state=failed", adminToken, nil).json(t)["items"].([]any); len(items) != 0 {
		t.Fatalf("events %v", items)
	}
}

// TestWebhooksOnPrivateAddressesWhenAllowed: TALLY_WEBHOOK_ALLOW_PRIVATE
// (api.Config.WebhookAllowPrivate) lets a webhook use a loopback address.
func TestWebhooksOnPrivateAddressesWhenAllowed(t *testing.T) {
	t.Parallel()
	f := newFixtureWith(t, func(c *api.Config) { c.WebhookAllowPrivate = true })
	if r := f.do("PUT", "/v1/webhooks/local", adminToken, map[string]any{"url": "http://127.0.0.1:9000/hook"}); r.status != http.StatusCreated {
		t.Fatalf("%d %s", r.status, r.body)
	}
}

// TestAlertListsRefuseRepeats: a rule's endpoints and notify_on and a
// webhook's events name each item once; a repeat is a 400 naming it, as a
// repeated threshold is.
func TestAlertListsRefuseRepeats(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	if r := f.do("PUT", "/v1/webhooks/ops", adminToken, map[string]any{"url": "https://hooks.example.com/tally"}); r.status != http.StatusCreated {
		t.Fatalf("create webhook: %d %s", r.status, r.body)
	}
	p := f.do("PUT", "/v1/alerts/a", adminToken, map[string]any{"subject": "customers", "meter": "calls",
		"thresholds": []any{map[string]any{"value": "10"}, map[string]any{"value": "10"}},
		"notify_on":  []string{"triggered", "triggered"}, "endpoints": []string{"ops", "ops"}}).
		problem(t, http.StatusBadRequest, api.TypeInvalidRequest)
	if got, want := fields(p), []string{"thresholds[1]", "notify_on[1]", "endpoints[1]"}; !slices.Equal(got, want) {
		t.Errorf("fields %v, want %v (%s)", got, want, p.Detail)
	}
	p = f.do("PUT", "/v1/webhooks/ops", adminToken, map[string]any{"url": "https://hooks.example.com/tally",
		"events": []string{"alert.triggered", "alert.triggered"}}).problem(t, http.StatusBadRequest, api.TypeInvalidRequest)
	if got, want := fields(p), []string{"events[1]"}; !slices.Equal(got, want) {
		t.Errorf("fields %v, want %v (%s)", got, want, p.Detail)
	}
	if m := f.do("GET", "/v1/webhooks/ops", adminToken, nil).json(t); fmt.Sprint(m["events"]) != "[alert.triggered alert.resolved]" {
		t.Fatalf("the refused PUT changed the webhook: %v", m)
	}
	f.do("GET", "/v1/alerts/a", adminToken, nil).problem(t, http.StatusNotFound, api.TypeNotFound)
}

// A percent given with trailing zeros ("80.0000000": seven digits after
// the point, none of them past the sixth counting) is 80, as every other
// decimal reads (amount.Check); it was refused as "80 has more than 6
// digits after the point".
func TestAlertPercentWithTrailingZerosIsItsValue(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	rule := func(percent string) map[string]any {
		return map[string]any{"subject": "customer:acme", "meter": "calls",
			"thresholds": []any{map[string]any{"percent": percent}}}
	}
	if r := f.do("PUT", "/v1/alerts/acme-calls", adminToken, rule("80.0000000")); r.status != http.StatusCreated {
		t.Fatalf("percent 80.0000000: %d %s", r.status, r.body)
	}
	f.do("PUT", "/v1/alerts/acme-calls", adminToken, rule("80.0000001")).fieldProblem(t, "thresholds[0].percent", "more than 6 digits")
}
