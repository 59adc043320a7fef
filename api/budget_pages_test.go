package api_test

import (
	"testing"
	"time"
)

// A page of a customer's budgets reads about a page of them however many
// periods it had: a budget is kept for every period an exact rule was in
// force (a daily customer has 365 a year per meter), and each is read
// with its rule version in force, its grants and its bypasses.
func TestBudgetPagesReadAPage(t *testing.T) {
	t.Parallel()
	f := newFixture(t) // now: 2026-11-20T12:00Z
	if r := f.do("PUT", "/v1/customers/acme/quotas/tokens", adminToken, map[string]any{"limit": "1000000", "admission": "exact"}); r.status != 201 {
		t.Fatalf("exact rule: %d %s", r.status, r.body)
	}
	// 3,000 budgets of days before this month, under the rule's version 1.
	f.exec(`INSERT INTO admission_budgets (customer, meter, period_start, period_end, period, "limit", rule_version, consumed, updated_at)
		SELECT 'acme', 'tokens', d, d + interval '1 day', to_char(d, 'YYYY-MM-DD'), 1000000, 1, 0, d
		FROM generate_series(timestamptz '2026-10-31T00:00:00Z' - interval '2999 days', timestamptz '2026-10-31T00:00:00Z', interval '1 day') d`)
	f.exec(`ANALYZE admission_budgets`)
	f.exec(`ANALYZE quota_rules`)
	var starts []string
	cursor := ""
	for pages := 0; pages < 3; pages++ {
		page, path, r := f.pageOf("quota_rules", "/v1/customers/acme/budgets?limit=2", cursor)
		if len(page.Items) != 2 || page.NextCursor == "" {
			t.Fatalf("GET %s: %s", path, r.body)
		}
		for _, it := range page.Items {
			s, _ := it["period_start"].(string)
			starts = append(starts, s)
		}
		cursor = page.NextCursor
	}
	// Newest first: this month's budget (no grant yet: the one its first
	// grant will find), then the days before it.
	want := []string{"2026-11-01T00:00:00Z"}
	for d := time.Date(2026, 10, 31, 0, 0, 0, 0, time.UTC); len(want) < 6; d = d.AddDate(0, 0, -1) {
		want = append(want, d.Format(time.RFC3339))
	}
	for i := range want {
		if starts[i] != want[i] {
			t.Fatalf("budgets by period start %v, want %v", starts, want)
		}
	}
}
