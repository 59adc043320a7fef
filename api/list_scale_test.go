package api_test

import (
	"context"
	"encoding/json"
	"net/url"
	"testing"
	"time"
)

// rowsRead is what Postgres's statistics say was read of table so far
// (tuples returned by sequential scans and fetched by index scans).
func (f *fixture) rowsRead(table string) int64 {
	f.t.Helper()
	var n int64
	if err := f.pool.QueryRow(context.Background(), `SELECT coalesce(seq_tup_read, 0) + coalesce(idx_tup_fetch, 0)
		FROM pg_stat_user_tables WHERE relname = $1`, table).Scan(&n); err != nil {
		f.t.Fatal(err)
	}
	return n
}

// readsOf is how many rows of table a GET of path read: a backend reports
// its statistics once idle, within a second or so, all of a transaction's
// at once.
func (f *fixture) readsOf(table, path string) (int64, response) {
	f.t.Helper()
	before := f.rowsRead(table)
	r := f.do("GET", path, adminToken, nil)
	if r.status != 200 {
		f.t.Fatalf("GET %s: %d %s", path, r.status, r.body)
	}
	var n int64
	if err := eventuallyOK(15*time.Second, func() bool {
		n = f.rowsRead(table) - before
		if n == 0 {
			time.Sleep(50 * time.Millisecond)
		}
		return n > 0
	}); err != nil {
		f.t.Fatalf("GET %s: no read of %s reported: %v", path, table, err)
	}
	return n, r
}

// A page of dead letters of one customer, or of those pending, reads about
// a page of rows however many other dead letters there are: a large
// deployment keeps a million, nearly all replayed or of other customers.
func TestDeadLetterPagesReadAPage(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	f.exec(`INSERT INTO dead_letters (id, topic, partition, "offset", reason, detail, key, raw, created_at, replayed_at)
		SELECT gen_random_uuid(), 'tally.meter-batches', 0, i, 'bad_json', 'x', convert_to('c-' || (i % 5000), 'UTF8'), 'x',
		       '2026-11-20T11:00:00Z', '2026-11-20T11:00:00Z'
		FROM generate_series(1, 20000) i`)
	f.exec(`INSERT INTO dead_letters (id, topic, partition, "offset", reason, detail, key, raw, created_at)
		SELECT gen_random_uuid(), 'tally.meter-batches', 1, i, 'bad_json', 'x', 'acme', 'x', '2026-11-20T11:00:00Z'
		FROM generate_series(1, 5) i`)
	f.exec(`ANALYZE dead_letters`)
	for _, query := range []string{"customer=acme", "pending=true", "customer=acme&pending=true"} {
		seen := 0
		cursor := ""
		for pages := 0; ; pages++ {
			if pages > 3 {
				t.Fatalf("%s: more than 3 pages of 2", query)
			}
			path := "/v1/dead-letters?limit=2&" + query
			if cursor != "" {
				path += "&cursor=" + url.QueryEscape(cursor)
			}
			n, r := f.readsOf("dead_letters", path)
			if n > 50 {
				t.Errorf("GET %s read %d rows of dead_letters for a page of 2", path, n)
			}
			var page struct {
				Items      []map[string]any `json:"items"`
				NextCursor string           `json:"next_cursor"`
			}
			if err := json.Unmarshal(r.body, &page); err != nil {
				t.Fatal(err)
			}
			seen += len(page.Items)
			if cursor = page.NextCursor; cursor == "" {
				break
			}
		}
		if seen != 5 {
			t.Errorf("%s: %d dead letters, want 5", query, seen)
		}
	}
}
