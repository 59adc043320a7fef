package migrations_test

import (
	"context"
	"encoding/json"
	"fmt"
	"log/slog"
	"slices"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/tally-ledger/tally/migrations"
)

// TestUsageNotifications: migration 00007 notifies channel tally_api_cache
// at commit of every change to what a usage answer is read from, one
// notification per 50 customers per statement, of every move of an ingest
// position, and of every revoked or deleted token; nothing for a
// rolled-back transaction.
func TestUsageNotifications(t *testing.T) {
	ctx := context.Background()
	pool := emptyPool(t)
	if _, err := migrations.Up(ctx, pool, slog.New(slog.DiscardHandler)); err != nil {
		t.Fatal(err)
	}
	listener, err := pool.Acquire(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer listener.Release()
	if _, err := listener.Exec(ctx, `LISTEN tally_api_cache`); err != nil {
		t.Fatal(err)
	}
	type payload struct {
		Tokens         []string   `json:"tokens"`
		Customers      []string   `json:"customers"`
		Topic          string     `json:"topic"`
		Partition      int32      `json:"partition"`
		AppliedThrough *time.Time `json:"applied_through"`
		Deleted        bool       `json:"deleted"`
		Truncated      string     `json:"truncated"`
	}
	// expect runs sql and returns the notifications it caused.
	expect := func(sql string, want int) []payload {
		t.Helper()
		if _, err := pool.Exec(ctx, sql); err != nil {
			t.Fatalf("%s: %v", sql, err)
		}
		var got []payload
		for {
			wctx, cancel := context.WithTimeout(ctx, 200*time.Millisecond)
			n, err := listener.Conn().WaitForNotification(wctx)
			cancel()
			if err != nil {
				break
			}
			var p payload
			if err := json.Unmarshal([]byte(n.Payload), &p); err != nil {
				t.Fatalf("payload %s: %v", n.Payload, err)
			}
			got = append(got, p)
		}
		if len(got) != want {
			t.Fatalf("%s: %d notifications, want %d: %+v", sql, len(got), want, got)
		}
		return got
	}
	customers := func(ps []payload) []string {
		var out []string
		for _, p := range ps {
			out = append(out, p.Customers...)
		}
		slices.Sort(out)
		return out
	}

	// 120 customers in one statement: three notifications of at most 50.
	got := expect(`INSERT INTO rollups (customer, meter, period_start, bucket, quantity)
		SELECT 'c' || lpad(i::text, 3, '0'), m, '2026-11-01', '2026-11-02 10:00', 1
		FROM generate_series(1, 120) i CROSS JOIN unnest(ARRAY['a', 'b']) m`, 3)
	var want []string
	for i := 1; i <= 120; i++ {
		want = append(want, fmt.Sprintf("c%03d", i))
	}
	if c := customers(got); !slices.Equal(c, want) {
		t.Fatalf("customers %v", c)
	}
	for _, p := range got {
		if len(p.Customers) > 50 {
			t.Fatalf("%d customers in one notification", len(p.Customers))
		}
	}
	for _, sql := range []string{
		`UPDATE rollups SET quantity = quantity + 1 WHERE customer IN ('c001', 'c002')`,
		`DELETE FROM rollups WHERE customer IN ('c001', 'c002')`,
		`INSERT INTO rollups_daily (customer, period_start, meter, day, quantity) VALUES ('c001', '2026-11-01', 'a', '2026-11-02', 1), ('c002', '2026-11-01', 'a', '2026-11-02', 1)`,
		`UPDATE rollups_daily SET quantity = 2`,
		`DELETE FROM rollups_daily`,
		`INSERT INTO period_closes (customer, period_start, period_end, closed_at, statement, forced, reason, actor) VALUES
			('c001', '2026-10-01', '2026-11-01', now(), '{}', true, 'r', 'a'), ('c002', '2026-10-01', '2026-11-01', now(), '{}', true, 'r', 'a')`,
		`INSERT INTO ingest_customers (customer, topic, partition, first_seen) VALUES ('c001', 't', 0, now()), ('c002', 't', 1, now())`,
		`UPDATE ingest_customers SET partition = 2`,
		`DELETE FROM ingest_customers`,
		// Gauges and unique meters (migrations 00032 and 00044).
		`INSERT INTO gauge_days (customer, meter, day_start, day_end, period_start, level_in, unit_seconds, level_out) VALUES
			('c001', 'g', '2026-11-02', '2026-11-03', '2026-11-01', 0, 0, 0), ('c002', 'g', '2026-11-02', '2026-11-03', '2026-11-01', 0, 0, 0)`,
		`UPDATE gauge_days SET unit_seconds = 1`,
		`DELETE FROM gauge_days`,
		`INSERT INTO gauge_points (customer, meter, at, delta) VALUES ('c001', 'g', '2026-11-02', 1), ('c002', 'g', '2026-11-02', 1)`,
		`UPDATE gauge_points SET delta = 2`,
		`DELETE FROM gauge_points`,
		`INSERT INTO gauge_adjustments (id, customer, meter, period_start, prior_period, unit_seconds, operation_id, created_at) VALUES
			(gen_random_uuid(), 'c001', 'g', '2026-11-01', '2026-10-01', 1, gen_random_uuid(), now()),
			(gen_random_uuid(), 'c002', 'g', '2026-11-01', '2026-10-01', 1, gen_random_uuid(), now())`,
		`UPDATE gauge_adjustments SET unit_seconds = 2`,
		`DELETE FROM gauge_adjustments`,
		`INSERT INTO unique_counts (customer, meter, period_start, per_day, day, members) VALUES
			('c001', 'u', '2026-11-01', false, '2026-11-01', 1), ('c002', 'u', '2026-11-01', false, '2026-11-01', 1)`,
		`UPDATE unique_counts SET members = 2`,
		`DELETE FROM unique_counts`,
	} {
		if c := customers(expect(sql, 1)); !slices.Equal(c, []string{"c001", "c002"}) {
			t.Fatalf("%s: customers %v", sql, c)
		}
	}
	// One transaction writing the same customers to both rollups, as an
	// ingest micro-batch does: one notification (identical payloads of a
	// transaction are sent once).
	if c := customers(expect(`WITH h AS (INSERT INTO rollups (customer, meter, period_start, bucket, quantity)
		SELECT 'c' || lpad(i::text, 3, '0'), 'a', '2026-11-01', '2026-11-02 11:00', 1 FROM generate_series(1, 3) i RETURNING customer)
		INSERT INTO rollups_daily (customer, period_start, meter, day, quantity)
		SELECT 'c' || lpad(i::text, 3, '0'), '2026-11-01', 'a', '2026-11-02', 1 FROM generate_series(3, 1, -1) i`, 1)); !slices.Equal(c, []string{"c001", "c002", "c003"}) {
		t.Fatalf("both rollups: customers %v", c)
	}
	// Positions: one notification per row; a statement that changes
	// nothing sends nothing; a rolled-back transaction sends nothing.
	expect(`INSERT INTO ingest_partitions (topic, partition, next_offset, applied_through) VALUES ('t', 0, 0, NULL), ('t', 1, 0, '2026-11-02T10:00:00Z')`, 2)
	p := expect(`UPDATE ingest_partitions SET applied_through = '2026-11-02T10:00:05Z', next_offset = 7 WHERE partition = 0`, 1)[0]
	if p.Topic != "t" || p.Partition != 0 || p.AppliedThrough == nil || !p.AppliedThrough.Equal(time.Date(2026, 11, 2, 10, 0, 5, 0, time.UTC)) || p.Deleted {
		t.Fatalf("position %+v", p)
	}
	expect(`UPDATE ingest_partitions SET high_watermark = 99`, 0)
	expect(`UPDATE rollups SET quantity = 0 WHERE false`, 0)
	if p := expect(`DELETE FROM ingest_partitions WHERE partition = 1`, 1)[0]; !p.Deleted || p.Partition != 1 {
		t.Fatalf("deleted position %+v", p)
	}
	// Tokens: a revocation or a deletion names the token's hash; a new
	// token nothing (only valid tokens are cached).
	expect(`INSERT INTO api_tokens (id, customer, token_hash, created_at) VALUES (gen_random_uuid(), 'c001', sha256('secret'), now())`, 0)
	hash := "2bb80d537b1da3e38bd30361aa855686bde0eacd7162fef6a25fe97bf527a25b" // sha256("secret")
	for _, sql := range []string{`UPDATE api_tokens SET revoked_at = now()`, `DELETE FROM api_tokens`} {
		if p := expect(sql, 1)[0]; !slices.Equal(p.Tokens, []string{hash}) {
			t.Fatalf("%s: tokens %v", sql, p.Tokens)
		}
	}
	// TRUNCATE fires no row trigger: each table names itself (migration
	// 00012).
	for _, table := range []string{"api_tokens", "rollups", "rollups_daily", "period_closes", "ingest_customers", "ingest_partitions",
		"meters", "gauge_days", "gauge_points", "gauge_adjustments", "unique_counts"} {
		if p := expect(`TRUNCATE `+table, 1)[0]; p.Truncated != table {
			t.Fatalf("TRUNCATE %s: %+v", table, p)
		}
	}
	err = pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
		if _, err := tx.Exec(ctx, `UPDATE rollups SET quantity = 5`); err != nil {
			return err
		}
		return fmt.Errorf("roll back")
	})
	if err == nil {
		t.Fatal("the transaction committed")
	}
	expect(`SELECT 1`, 0)
}

// TestNotifyQueueGuard: Postgres's notification queue fills while some
// listening connection does not read, and a commit that notifies into a
// full queue fails. Migration 00012's triggers stop notifying once the
// queue is as full as tally.notify_queue_limit (0.5 unless set), so
// writes never fail for it. Here a listener that never reads (idle in a
// transaction) holds the queue, writes fill it past a limit set just
// below its usage, and the next write notifies nothing and commits.
func TestNotifyQueueGuard(t *testing.T) {
	ctx := context.Background()
	pool := emptyPool(t)
	if _, err := migrations.Up(ctx, pool, slog.New(slog.DiscardHandler)); err != nil {
		t.Fatal(err)
	}
	conn := func() *pgx.Conn {
		t.Helper()
		c, err := pool.Acquire(ctx)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(c.Release)
		return c.Conn()
	}
	reader, writer, stuck := conn(), conn(), conn()
	for _, c := range []*pgx.Conn{reader, stuck} {
		if _, err := c.Exec(ctx, `LISTEN tally_api_cache`); err != nil {
			t.Fatal(err)
		}
	}
	heard := func() int {
		n := 0
		for {
			wctx, cancel := context.WithTimeout(ctx, 200*time.Millisecond)
			_, err := reader.WaitForNotification(wctx)
			cancel()
			if err != nil {
				return n
			}
			n++
		}
	}
	batch := 0
	write := func() {
		t.Helper()
		batch++
		if _, err := writer.Exec(ctx, `INSERT INTO rollups (customer, meter, period_start, bucket, quantity)
			SELECT 'cust_' || lpad(($1 * 1000 + i)::text, 8, '0'), 'a', '2026-11-01', '2026-11-02 10:00', 1
			FROM generate_series(1, 1000) i`, batch); err != nil {
			t.Fatalf("write %d: %v", batch, err)
		}
	}
	usage := func() float64 {
		t.Helper()
		var u float64
		if err := writer.QueryRow(ctx, `SELECT pg_notification_queue_usage()`).Scan(&u); err != nil {
			t.Fatal(err)
		}
		return u
	}
	setLimit := func(limit float64) {
		t.Helper()
		if _, err := writer.Exec(ctx, `SELECT set_config('tally.notify_queue_limit', $1, false)`, fmt.Sprint(limit)); err != nil {
			t.Fatal(err)
		}
	}

	// Below the limit (the default): every write notifies.
	write()
	if n := heard(); n != 20 {
		t.Fatalf("below the limit: %d notifications, want 20", n)
	}
	// The stuck listener stops reading; the queue grows.
	if _, err := stuck.Exec(ctx, `BEGIN`); err != nil {
		t.Fatal(err)
	}
	if _, err := stuck.Exec(ctx, `SELECT 1`); err != nil {
		t.Fatal(err)
	}
	start := usage()
	for usage() <= start {
		write()
		heard()
		if batch > 1000 {
			t.Fatalf("the queue did not grow (usage %g) with a listener idle in a transaction", usage())
		}
	}
	// Full as far as the limit says: writes commit, and notify nothing.
	setLimit(usage())
	for range 3 {
		write()
	}
	if n := heard(); n != 0 {
		t.Fatalf("at the limit (usage %g): %d notifications, want none", usage(), n)
	}
	// With room below the limit, notifications flow again.
	setLimit(1)
	write()
	if n := heard(); n != 20 {
		t.Fatalf("below the limit again: %d notifications, want 20", n)
	}
	if _, err := stuck.Exec(ctx, `ROLLBACK`); err != nil {
		t.Fatal(err)
	}
}
