package api_test

import (
	"encoding/json"
	"net/url"
	"strings"
	"testing"

	"github.com/google/uuid"

	"github.com/tally-ledger/tally/api"
)

// A cursor continues only the list that made it, under the same filters:
// passed to another list, or to the same list under another filter or
// another customer's path, it is refused naming cursor, never read as a
// key of that list (which would skip or repeat items silently). The same
// list under the same filters, given in another order, still pages.
func TestCursorBoundToItsListAndFilters(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	for _, c := range []string{"acme", "acme", "globex", "globex"} {
		f.token(c)
	}
	for _, n := range []string{"m1", "m2", "m3"} {
		if r := f.do("PUT", "/v1/meters/"+n, adminToken, map[string]any{"kind": "gauge"}); r.status != 201 && r.status != 200 {
			t.Fatalf("PUT meter: %d %s", r.status, r.body)
		}
	}
	for _, c := range []string{"acme", "globex"} {
		for _, m := range []string{"c1", "c2"} {
			if r := f.do("PUT", "/v1/customers/"+c+"/quotas/"+m, adminToken, map[string]any{"limit": "100", "admission": "exact"}); r.status != 201 {
				t.Fatalf("exact rule: %d %s", r.status, r.body)
			}
			if r := f.do("POST", "/v1/grants", adminToken, map[string]any{"holder": "gw1", "generation": 1, "customer": c,
				"meter": m, "amount": "1"}); r.status != 201 {
				t.Fatalf("grant: %d %s", r.status, r.body)
			}
		}
	}
	f.exec(`INSERT INTO dead_letters (id, topic, partition, "offset", reason, detail, key, raw, created_at) VALUES
		($1, 'tally.meter-batches', 0, 1, 'bad_json', 'x', 'acme', 'x', '2026-11-20T11:00:00Z'),
		($2, 'tally.meter-batches', 0, 2, 'bad_json', 'x', 'acme', 'x', '2026-11-20T11:00:01Z'),
		($3, 'tally.meter-batches', 0, 3, 'bad_json', 'x', 'globex', 'x', '2026-11-20T11:00:02Z'),
		($4, 'tally.meter-batches', 0, 4, 'bad_json', 'x', 'globex', 'x', '2026-11-20T11:00:03Z')`,
		uuid.Must(uuid.NewV7()), uuid.Must(uuid.NewV7()), uuid.Must(uuid.NewV7()), uuid.Must(uuid.NewV7()))

	// next reads a first page of one and returns its next_cursor.
	next := func(path string) string {
		t.Helper()
		r := f.do("GET", path, adminToken, nil)
		var page struct {
			Items      []json.RawMessage `json:"items"`
			NextCursor string            `json:"next_cursor"`
		}
		if err := json.Unmarshal(r.body, &page); err != nil || r.status != 200 || len(page.Items) != 1 || page.NextCursor == "" {
			t.Fatalf("GET %s: %d %v %s", path, r.status, err, r.body)
		}
		return page.NextCursor
	}
	for _, tt := range []struct{ from, to string }{
		// Another list.
		{"/v1/dead-letters?limit=1", "/v1/reconciliations?limit=1"},
		{"/v1/tokens?limit=1", "/v1/customers/acme/grants?limit=1"},
		{"/v1/meters?limit=1", "/v1/pools?limit=1"},
		{"/v1/meters?limit=1", "/v1/webhooks?limit=1"},
		// The same list under another filter.
		{"/v1/dead-letters?limit=1&customer=acme", "/v1/dead-letters?limit=1&customer=globex"},
		{"/v1/dead-letters?limit=1&customer=acme", "/v1/dead-letters?limit=1"},
		{"/v1/dead-letters?limit=1", "/v1/dead-letters?limit=1&pending=true"},
		{"/v1/tokens?limit=1&customer=acme", "/v1/tokens?limit=1&customer=globex"},
		{"/v1/customers/acme/grants?limit=1", "/v1/customers/acme/grants?limit=1&state=live"},
		// The same list of another customer.
		{"/v1/customers/acme/grants?limit=1", "/v1/customers/globex/grants?limit=1"},
		{"/v1/customers/acme/budgets?limit=1", "/v1/customers/globex/budgets?limit=1"},
	} {
		cursor := next(tt.from)
		r := f.do("GET", tt.to+"&cursor="+url.QueryEscape(cursor), adminToken, nil)
		if r.status != 400 {
			t.Errorf("cursor of %s passed to %s: %d %s, want 400 naming cursor", tt.from, tt.to, r.status, r.body)
			continue
		}
		p := r.problem(t, 400, api.TypeInvalidRequest)
		if len(p.Errors) != 1 || p.Errors[0].Field != "cursor" {
			t.Errorf("cursor of %s passed to %s: errors %+v, want cursor", tt.from, tt.to, p.Errors)
		}
	}
	// The same filters in another order, a limit changed between pages,
	// and the same path escaped otherwise continue the list.
	for _, tt := range []struct{ from, to string }{
		{"/v1/dead-letters?limit=1&customer=acme&pending=true", "/v1/dead-letters?pending=true&customer=acme&limit=5"},
		{"/v1/tokens?customer=acme&limit=1", "/v1/tokens?limit=1&customer=acme"},
		{"/v1/customers/acme/grants?limit=1&state=live", "/v1/customers/acme/grants?state=live"},
		{"/v1/customers/acme/budgets?limit=1", "/v1/customers/%61cme/budgets?limit=1"},
	} {
		cursor := next(tt.from)
		if r := f.do("GET", tt.to+"&cursor="+url.QueryEscape(cursor), adminToken, nil); r.status != 200 {
			t.Errorf("cursor of %s passed to %s: %d %s, want 200", tt.from, tt.to, r.status, r.body)
		}
	}
}

// Every list of openapi.json (every GET that takes ?cursor=) checks that a
// cursor is its own: a cursor holding a key valid for the list continues
// it when made for the list, and is refused naming cursor when made for
// another. A list added later needs a key here, so that it is checked too.
func TestEveryListChecksItsCursors(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	if r := f.do("PUT", "/v1/customers/acme", adminToken, map[string]any{"cadence": "monthly"}); r.status != 200 && r.status != 201 {
		t.Fatalf("PUT customer: %d %s", r.status, r.body)
	}
	id := "0193e0a1-7c00-7d4e-9a51-3c2f9b7e4a10"
	keys := map[string][]string{
		"/v1/customers/{customer}/periods":      {"2026-11-01T00:00:00Z"},
		"/v1/customers/{customer}/grants":       {"2026-11-20T12:00:00Z", id},
		"/v1/customers/{customer}/budgets":      {"2026-11-01T00:00:00Z", "calls"},
		"/v1/customers/{customer}/rate-budgets": {"customer:acme", "calls"},
		"/v1/dead-letters":                      {id},
		"/v1/reconciliations":                   {id},
		"/v1/tokens":                            {"2026-11-20T12:00:00.000000Z", id},
		"/v1/alert-events":                      {"5"},
		"/v1/pools":                             {"p"},
		"/v1/alerts":                            {"a"},
		"/v1/webhooks":                          {"w"},
		"/v1/meters":                            {"m"},
	}
	doc, _ := openapiDoc(t)
	lists := 0
	for route, item := range doc.Paths.Map() {
		if item.Get == nil || item.Get.Parameters.GetByInAndName("query", "cursor") == nil {
			continue
		}
		lists++
		key, ok := keys[route]
		if !ok {
			t.Errorf("GET %s takes a cursor: give it a key in TestEveryListChecksItsCursors", route)
			continue
		}
		path := strings.ReplaceAll(route, "{customer}", "acme")
		if r := f.do("GET", path+"?cursor="+url.QueryEscape(api.CursorFor(path, key...)), adminToken, nil); r.status != 200 {
			t.Errorf("GET %s with its own cursor: %d %s", path, r.status, r.body)
		}
		r := f.do("GET", path+"?cursor="+url.QueryEscape(api.CursorFor("/v1/another-list", key...)), adminToken, nil)
		if r.status != 400 {
			t.Errorf("GET %s with a cursor of another list: %d %s", path, r.status, r.body)
			continue
		}
		r.fieldProblem(t, "cursor", "another list")
	}
	if lists != len(keys) {
		t.Errorf("openapi.json has %d lists, want the %d given keys here", lists, len(keys))
	}
}
