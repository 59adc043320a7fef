package api_test

import (
	"strings"
	"testing"
	"time"
)

// metrics scrapes /metrics into sample line → value text.
func (f *fixture) metrics() map[string]string {
	f.t.Helper()
	m := f.do("GET", "/metrics", adminToken, nil)
	out := map[string]string{}
	for _, line := range strings.Split(string(m.body), "\n") {
		if name, v, ok := strings.Cut(line, " "); ok && !strings.HasPrefix(line, "#") {
			out[name] = v
		}
	}
	return out
}

// The grant protocol's metrics count what gateways did: grants issued and
// refused by reason, renewals and releases, bypass reports, the issue
// latency, and (read at scrape) live and expired grants with the units an
// expired grant stranded.
func TestGrantMetrics(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	f.do("PUT", "/v1/customers/acme/quotas/tokens", adminToken, map[string]any{"limit": "100", "admission": "exact"})
	f.do("PUT", "/v1/customers/acme/quotas/calls", adminToken, map[string]any{"limit": "100"})
	grant := func(holder, meter, amount string) response {
		return f.do("POST", "/v1/grants", adminToken, map[string]any{"holder": holder, "generation": 1, "customer": "acme",
			"meter": meter, "amount": amount, "ttl": "30s"})
	}
	a := grant("gw1", "tokens", "60").json(t)["id"].(string)
	grant("gw2", "tokens", "30")
	grant("gw2", "tokens", "50") // budget_exhausted
	grant("gw2", "calls", "5")   // not_exact
	grant("gw1", "tokens", "-1") // invalid
	f.do("POST", "/v1/grants/"+a+"/renew", adminToken, map[string]any{"holder": "gw1", "generation": 1, "spent": "10"})
	f.do("POST", "/v1/grants/"+a+"/renew", adminToken, map[string]any{"holder": "gw2", "generation": 1, "spent": "10"}) // not_holder
	f.do("POST", "/v1/bypasses", adminToken, map[string]any{"holder": "gw1", "generation": 1, "report_id": "r1",
		"items": []map[string]any{{"customer": "acme", "meter": "tokens", "amount": "7", "admissions": 3,
			"first_at": f.clock(), "last_at": f.clock()}}})

	m := f.metrics()
	for name, want := range map[string]string{
		"tally_grants_issued_total":                                   "2",
		"tally_grants_issued_units_total":                             "90",
		`tally_grants_refused_total{reason="budget_exhausted"}`:       "1",
		`tally_grants_refused_total{reason="not_exact"}`:              "1",
		`tally_grants_refused_total{reason="invalid"}`:                "1",
		`tally_grant_renewals_total{outcome="ok"}`:                    "1",
		`tally_grant_renewals_total{outcome="not_holder"}`:            "1",
		`tally_bypass_reports_total{outcome="ok"}`:                    "1",
		"tally_bypassed_units_total":                                  "7",
		"tally_bypassed_admissions_total":                             "3",
		`tally_grant_issue_duration_seconds_count{outcome="issued"}`:  "2",
		`tally_grant_issue_duration_seconds_count{outcome="refused"}`: "3",
		"tally_grants_live":                                           "2",
		"tally_grants_live_units":                                     "90",
		"tally_grants_expired":                                        "0",
	} {
		if m[name] != want {
			t.Errorf("%s = %q, want %s", name, m[name], want)
		}
	}

	// gw1 releases; gw2 goes silent and its grant expires at valid_until
	// + max_skew, stranding all 30 units (it never reported a spend).
	f.do("POST", "/v1/grants/"+a+"/release", adminToken, map[string]any{"holder": "gw1", "generation": 1, "spent": "20"})
	f.setNow(f.clock().Add(36 * time.Second))
	m = f.metrics()
	for name, want := range map[string]string{
		`tally_grant_releases_total{outcome="ok"}`: "1",
		"tally_grants_live":                        "0",
		"tally_grants_live_units":                  "0",
		"tally_grants_expired":                     "1",
		"tally_grants_expired_stranded_units":      "30",
	} {
		if m[name] != want {
			t.Errorf("after expiry: %s = %q, want %s", name, m[name], want)
		}
	}
}

// The admission counters an alert is written on are exported at 0 before
// the first grant, with every label value they take.
func TestAdmissionCountersAreExportedBeforeTheFirstGrant(t *testing.T) {
	t.Parallel()
	m := newFixture(t).metrics()
	for _, name := range []string{
		`tally_admission_grants_refused_total{binding="customer"}`,
		`tally_admission_grants_refused_total{binding="pool"}`,
		`tally_admission_grants_refused_total{binding="global"}`,
		`tally_admission_debits_total{path="one_round_trip"}`,
		`tally_admission_debits_total{path="batch"}`,
		`tally_admission_budgets_brought_total{kind="customer"}`,
		`tally_admission_budgets_brought_total{kind="scope"}`,
		`tally_grants_refused_total{reason="budget_exhausted"}`,
		// docs/operations.md: renewals and releases are ok or refused as
		// stale_generation, not_holder, grant_ended, not_found, invalid or
		// error; debits ok or refused as a grant request is; bypass
		// reports ok, invalid or error.
		`tally_grant_renewals_total{outcome="stale_generation"}`,
		`tally_grant_renewals_total{outcome="not_holder"}`,
		`tally_grant_renewals_total{outcome="grant_ended"}`,
		`tally_grant_renewals_total{outcome="not_found"}`,
		`tally_grant_renewals_total{outcome="invalid"}`,
		`tally_grant_renewals_total{outcome="error"}`,
		`tally_grant_releases_total{outcome="stale_generation"}`,
		`tally_grant_releases_total{outcome="not_holder"}`,
		`tally_grant_releases_total{outcome="grant_ended"}`,
		`tally_grant_releases_total{outcome="not_found"}`,
		`tally_grant_releases_total{outcome="invalid"}`,
		`tally_grant_releases_total{outcome="error"}`,
		`tally_debits_total{outcome="budget_exhausted"}`,
		`tally_debits_total{outcome="not_exact"}`,
		`tally_debits_total{outcome="stale_generation"}`,
		`tally_debits_total{outcome="invalid"}`,
		`tally_debits_total{outcome="error"}`,
		`tally_bypass_reports_total{outcome="invalid"}`,
		`tally_bypass_reports_total{outcome="error"}`,
	} {
		if m[name] != "0" {
			t.Errorf("%s = %q, want 0", name, m[name])
		}
	}
}
