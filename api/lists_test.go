package api_test

import (
	"encoding/json"
	"fmt"
	"net/url"
	"slices"
	"testing"
)

// Every list takes ?limit= and ?cursor=, the lists an operator keeps too
// (tokens, meters, pools, alert rules, webhooks): paged two at a time they
// give every item once, in order, then an empty next_cursor.
func TestEveryListPages(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	names := []string{"n1", "n2", "n3", "n4", "n5"}
	for _, n := range names {
		f.token("cust-" + n)
		for path, body := range map[string]any{
			"/v1/meters/" + n:   map[string]any{"kind": "gauge"},
			"/v1/pools/" + n:    map[string]any{"members": []string{"m-" + n}},
			"/v1/webhooks/" + n: map[string]any{"url": "https://hooks.example.com/" + n},
		} {
			if r := f.do("PUT", path, adminToken, body); r.status != 200 && r.status != 201 {
				t.Fatalf("PUT %s: %d %s", path, r.status, r.body)
			}
		}
		if r := f.do("PUT", "/v1/alerts/"+n, adminToken, map[string]any{"subject": "customer:acme", "meter": "calls",
			"thresholds": []any{map[string]any{"value": "10"}}, "endpoints": []string{n}}); r.status != 201 {
			t.Fatalf("PUT alert: %d %s", r.status, r.body)
		}
	}
	// A customer's budgets, one per meter in this period.
	for _, n := range names {
		if r := f.do("PUT", "/v1/customers/acme/quotas/c-"+n, adminToken, map[string]any{"limit": "100", "admission": "exact"}); r.status != 201 {
			t.Fatalf("exact rule: %d %s", r.status, r.body)
		}
		if r := f.do("POST", "/v1/grants", adminToken, map[string]any{"holder": "gw1", "generation": 1, "customer": "acme",
			"meter": "c-" + n, "amount": "1"}); r.status != 201 {
			t.Fatalf("grant: %d %s", r.status, r.body)
		}
	}
	for list, field := range map[string]string{"/v1/tokens": "customer", "/v1/meters": "meter", "/v1/pools": "name",
		"/v1/webhooks": "name", "/v1/alerts": "name", "/v1/customers/acme/budgets": "meter"} {
		var got []string
		cursor := ""
		for pages := 0; ; pages++ {
			if pages > 5 {
				t.Fatalf("%s: more than 5 pages of 2: %v", list, got)
			}
			path := list + "?limit=2"
			if cursor != "" {
				path += "&cursor=" + url.QueryEscape(cursor)
			}
			r := f.do("GET", path, adminToken, nil)
			var page struct {
				Items      []map[string]any `json:"items"`
				NextCursor string           `json:"next_cursor"`
			}
			if err := json.Unmarshal(r.body, &page); err != nil || r.status != 200 || len(page.Items) > 2 {
				t.Fatalf("GET %s: %d %v %s", path, r.status, err, r.body)
			}
			for _, it := range page.Items {
				got = append(got, fmt.Sprint(it[field]))
			}
			if cursor = page.NextCursor; cursor == "" {
				break
			}
		}
		want := names
		if prefix := map[string]string{"/v1/tokens": "cust-", "/v1/customers/acme/budgets": "c-"}[list]; prefix != "" {
			want = nil
			for _, n := range names {
				want = append(want, prefix+n)
			}
		}
		if !slices.Equal(got, want) {
			t.Errorf("%s paged: %v, want %v", list, got, want)
		}
	}
}
