package api_test

import (
	"context"
	"encoding/json"
	"fmt"
	"net/url"
	"strconv"
	"testing"
	"time"

	"github.com/google/uuid"

	"github.com/tally-ledger/tally/api"
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

// genericPlans makes every new session of f's database plan its prepared
// statements once, for any parameters, as Postgres does by itself after
// five executions of a statement on a connection when that plan looks no
// dearer: a page must read a page then too, not every row before it.
func (f *fixture) genericPlans() {
	f.t.Helper()
	f.exec(`DO $$ BEGIN EXECUTE format('ALTER DATABASE %I SET plan_cache_mode = force_generic_plan', current_database()); END $$`)
	f.pool.Reset()
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

// listPage is a page of a list, its items left as JSON objects.
type listPage struct {
	Items      []map[string]any `json:"items"`
	NextCursor string           `json:"next_cursor"`
}

// pageOf GETs path (with cursor, unless empty) and returns the page and
// the path asked, reporting an error when it read more than 50 rows of
// table for a page of 2.
func (f *fixture) pageOf(table, path, cursor string) (listPage, string, response) {
	f.t.Helper()
	if cursor != "" {
		path += "&cursor=" + url.QueryEscape(cursor)
	}
	n, r := f.readsOf(table, path)
	if n > 50 {
		f.t.Errorf("GET %s read %d rows of %s for a page of 2", path, n, table)
	}
	var page listPage
	if err := json.Unmarshal(r.body, &page); err != nil {
		f.t.Fatalf("GET %s: %v %s", path, err, r.body)
	}
	return page, path, r
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
	f.genericPlans()
	for _, query := range []string{"customer=acme", "pending=true", "customer=acme&pending=true"} {
		seen := 0
		cursor := ""
		for pages := 0; ; pages++ {
			if pages > 3 {
				t.Fatalf("%s: more than 3 pages of 2", query)
			}
			page, _, _ := f.pageOf("dead_letters", "/v1/dead-letters?limit=2&"+query, cursor)
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

// A page of tokens reads about a page of rows, and pages every token once
// while tokens are created between pages: a deployment with 100,000
// customers has a token (or several) for each.
func TestTokenPagesReadAPage(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	f.exec(`INSERT INTO api_tokens (id, customer, description, token_hash, created_at)
		SELECT gen_random_uuid(), 'c-' || i, '', sha256(convert_to('t' || i, 'UTF8')),
		       timestamptz '2026-11-01T00:00:00Z' + i * interval '1 second'
		FROM generate_series(1, 5000) i`)
	f.exec(`ANALYZE api_tokens`)
	f.genericPlans()
	seen := map[string]bool{}
	cursor := ""
	for pages := 0; pages < 3; pages++ {
		page, path, r := f.pageOf("api_tokens", "/v1/tokens?limit=2", cursor)
		if len(page.Items) != 2 || page.NextCursor == "" {
			t.Fatalf("GET %s: %s", path, r.body)
		}
		for _, it := range page.Items {
			c, _ := it["customer"].(string)
			if seen[c] {
				t.Errorf("%s repeated", c)
			}
			seen[c] = true
		}
		cursor = page.NextCursor
		f.token("new-" + cursor[len(cursor)-6:]) // created now, after every listed one
	}
	for i := 1; i <= 6; i++ {
		if c := "c-" + strconv.Itoa(i); !seen[c] {
			t.Errorf("%s skipped: %v", c, seen)
		}
	}
}

// A page of alert events reads about a page of events and their
// deliveries, however many events there are.
func TestAlertEventPagesReadAPage(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	f.exec(`INSERT INTO alert_events (id, seq, rule, subject, meter, type, body, occurred_at)
		SELECT md5(i::text)::uuid, i, 'r' || (i % 3), 'customer:c', 'calls', 'alert.triggered', '{}', '2026-11-20T11:00:00Z'
		FROM generate_series(1, 5000) i`)
	// From the same series, not from alert_events: a read of it here would
	// be counted against the first page.
	f.exec(`INSERT INTO alert_deliveries (event_id, endpoint, rule, subject, seq, state, next_attempt_at, give_up_at, created_at)
		SELECT md5(i::text)::uuid, 'kafka', 'r' || (i % 3), 'customer:c', i, CASE WHEN i % 1000 = 0 THEN 'failed' ELSE 'delivered' END,
		       '2026-11-20T11:00:00Z', '2026-11-20T11:00:00Z', '2026-11-20T11:00:00Z'
		FROM generate_series(1, 5000) i`)
	f.exec(`ANALYZE alert_events`)
	f.exec(`ANALYZE alert_deliveries`)
	f.genericPlans()
	// The deliveries' foreign key checks read every event once: wait until
	// they are reported, so that they are not counted against a page.
	if err := eventuallyOK(15*time.Second, func() bool {
		time.Sleep(50 * time.Millisecond)
		return f.rowsRead("alert_events") >= 5000
	}); err != nil {
		t.Fatal(err)
	}
	for _, query := range []string{"", "&alert=r1", "&state=failed"} {
		cursor := ""
		for pages := 0; pages < 2; pages++ {
			page, path, r := f.pageOf("alert_events", "/v1/alert-events?limit=2"+query, cursor)
			if len(page.Items) != 2 || page.NextCursor == "" {
				t.Fatalf("GET %s: %s", path, r.body)
			}
			cursor = page.NextCursor
		}
	}
}

// A page of a customer's grants, live or all, reads about a page of rows
// however many grants it had before: a gateway takes grants all day, and a
// customer has a million ended ones within a month.
func TestGrantPagesReadAPage(t *testing.T) {
	t.Parallel()
	f := newFixture(t) // now: 2026-11-20T12:00Z
	if r := f.do("PUT", "/v1/customers/acme/quotas/tokens", adminToken, map[string]any{"limit": "1000000", "admission": "exact"}); r.status != 201 {
		t.Fatalf("exact rule: %d %s", r.status, r.body)
	}
	gw := f.gatewayToken("gw1")
	grant := func() {
		t.Helper()
		if r := f.do("POST", "/v1/grants", gw, map[string]any{"holder": "gw1", "generation": 1, "customer": "acme",
			"meter": "tokens", "amount": "1", "ttl": "30s"}); r.status != 201 {
			t.Fatalf("grant: %d %s", r.status, r.body)
		}
	}
	grant()
	// 5,000 ended grants before it, copies of it issued up to a day before
	// (built in a table of the test's own database: a temporary one lives
	// on one of the pool's connections, and the next statement may run on
	// another).
	f.exec(`CREATE TABLE old_grants AS SELECT g.* FROM admission_grants g CROSS JOIN generate_series(1, 5000)`)
	f.exec(`UPDATE old_grants SET id = gen_random_uuid(), issued_at = issued_at - interval '1 hour' - random() * interval '1 day'`)
	f.exec(`UPDATE old_grants SET valid_until = issued_at, reclaim_at = issued_at, ended_at = issued_at, end_reason = 'released'`)
	f.exec(`INSERT INTO admission_grants SELECT * FROM old_grants`)
	f.exec(`DROP TABLE old_grants`)
	grant()
	grant()
	f.exec(`ANALYZE admission_grants`)
	f.genericPlans()
	for _, query := range []string{"state=live", ""} {
		cursor := ""
		for pages := 0; pages < 3; pages++ {
			page, path, _ := f.pageOf("admission_grants", "/v1/customers/acme/grants?limit=2&"+query, cursor)
			if query == "state=live" && pages == 1 && len(page.Items) != 1 {
				t.Fatalf("GET %s: %d live grants on the second page, want the third one", path, len(page.Items))
			}
			if page.NextCursor == "" {
				break
			}
			cursor = page.NextCursor
		}
	}
}

// A page of reconciliation runs reads about a page of runs however deep
// the cursor: a deployment keeps years of nightly runs. (The period
// index orders a period's runs by start, not id: a page of one period's
// runs reads them all, a few a night.)
func TestReconciliationPagesReadAPage(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	// 5,000 runs, UUIDv7-like ids in start order (the time in the first
	// six bytes).
	f.exec(`INSERT INTO reconciliation_runs (id, period, status, started_at)
		SELECT (lpad(to_hex(1700000000000 + i), 12, '0') || '7000' || '8000' || lpad(to_hex(i), 12, '0'))::uuid,
		       '2026-10-01', 'clean', '2026-11-01T00:00:00Z'::timestamptz + i * interval '1 minute'
		FROM generate_series(1, 5000) i`)
	f.exec(`ANALYZE reconciliation_runs`)
	f.genericPlans()
	for _, query := range []string{"", "period=2026-10-01"} {
		// A cursor 3,000 runs deep (run 2,000 of 5,000, newest first): made
		// here, so that no page before it is read (and counted) first.
		id, err := uuid.Parse(fmt.Sprintf("%012x70008000%012x", 1700000000000+2000, 2000))
		if err != nil {
			t.Fatal(err)
		}
		cursor := api.CursorFor("/v1/reconciliations?"+query, id.String())
		for pages := 0; pages < 3; pages++ {
			page, path, _ := f.pageOf("reconciliation_runs", "/v1/reconciliations?limit=2&"+query, cursor)
			if len(page.Items) != 2 || page.NextCursor == "" {
				t.Fatalf("GET %s: %d runs, cursor %q", path, len(page.Items), page.NextCursor)
			}
			cursor = page.NextCursor
		}
	}
}
