package api_test

import (
	"strings"
	"testing"
)

// TestCustomerSeesNoOperatorNotes: a customer token sees its quotas'
// limits, usage and decision state, and its statements' lines; never a
// rule's mode, on_stale, stale_after, actor or reason, nor how a period
// was closed (forced, reason, actor, reconciliation). The admin sees all.
func TestCustomerSeesNoOperatorNotes(t *testing.T) {
	t.Parallel()
	f := newFixture(t) // now: 2026-11-20T12:00Z
	f.usage("acme", "api_calls", date("2026-10-15T10:00:00Z"), "10")
	f.usage("acme", "api_calls", date("2026-11-15T10:00:00Z"), "5")
	acme := f.token("acme")
	if r := f.do("PUT", "/v1/customers/acme/quotas/api_calls", adminToken, map[string]any{
		"limit": "1000", "mode": "shadow", "on_stale": "deny", "stale_after": "10m",
		"reason": "trial-not-enforced", "actor": "ops-alice",
	}); r.status != 201 {
		t.Fatalf("put quota: %d %s", r.status, r.body)
	}
	f.exec(`INSERT INTO quota_decisions (customer, meter, rule_version, period_start, state, used, decided_at, stale, leader_epoch, decision)
		VALUES ('acme', 'api_calls', 1, '2026-11-01T00:00:00Z', 'ok', 5, '2026-11-20T11:59:00Z', false, 1,
		'{"customer":"acme","meter":"api_calls","period":"2026-11-01","state":"ok","used":"5","limit":"1000","remaining":"995",
		  "as_of":"2026-11-20T11:58:00Z","lag_seconds":60,"projected":"5","rule_version":1,"mode":"shadow","on_stale":"deny",
		  "stale_after":600,"decided_at":"2026-11-20T11:59:00Z"}')`)
	if r := f.do("POST", "/v1/customers/acme/periods/2026-10-01/close", adminToken,
		map[string]any{"force": true, "reason": "deadline-close", "actor": "ops-bob"}); r.status != 200 {
		t.Fatalf("close: %d %s", r.status, r.body)
	}
	notes := []string{"shadow", `"on_stale"`, `"stale_after"`, `"mode"`, `"actor"`, `"reason"`, "trial-not-enforced", "ops-alice",
		"deadline-close", "ops-bob", `"forced"`, `"reconciliation_id"`}

	quotas := f.do("GET", "/v1/customers/acme/quotas", acme, nil)
	statement := f.do("GET", "/v1/customers/acme/periods/2026-10-01/statement", acme, nil)
	for _, r := range []response{quotas, statement} {
		if r.status != 200 {
			t.Fatalf("customer: %d %s", r.status, r.body)
		}
		for _, n := range notes {
			if strings.Contains(string(r.body), n) {
				t.Errorf("a customer token sees %s: %s", n, r.body)
			}
		}
	}
	for _, want := range []string{`"limit":"1000"`, `"warn_at":"0.8"`, `"used":"5"`, `"remaining":"995"`, `"decided_at":"2026-11-20T11:59:00Z"`, `"state":"ok"`} {
		if !strings.Contains(string(quotas.body), want) {
			t.Errorf("the customer's quotas lack %s: %s", want, quotas.body)
		}
	}
	for _, want := range []string{`"billed":"10"`, `"final":true`, `"closed_at"`} {
		if !strings.Contains(string(statement.body), want) {
			t.Errorf("the customer's statement lacks %s: %s", want, statement.body)
		}
	}
	// The admin sees every note.
	all := string(f.do("GET", "/v1/customers/acme/quotas", adminToken, nil).body) +
		string(f.do("GET", "/v1/customers/acme/periods/2026-10-01/statement", adminToken, nil).body)
	for _, n := range notes[:len(notes)-1] { // a forced close has no reconciliation
		if !strings.Contains(all, n) {
			t.Errorf("the admin does not see %s: %s", n, all)
		}
	}
}
