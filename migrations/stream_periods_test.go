package migrations_test

import (
	"context"
	"testing"

	"github.com/tally-ledger/tally/migrations"
)

// TestStreamPeriodsBackfill: migration 00020 gives every (stream, period)
// of records written by the previous schema its seq range, so that the
// reads of a customer's period (ledger_period_records) find exactly the
// rows records_period found, and drops that index.
func TestStreamPeriodsBackfill(t *testing.T) {
	ctx := context.Background()
	pool := poolAt(t, 14)
	exec := func(sql string) {
		t.Helper()
		if _, err := pool.Exec(ctx, sql); err != nil {
			t.Fatalf("%s: %v", sql, err)
		}
	}
	exec(`INSERT INTO streams (producer, epoch, customer, meter) VALUES ('gw', 1, 'acme', 'calls'), ('gw', 1, 'acme', 'bytes'), ('gw', 2, 'zeta', 'calls')`)
	// acme's calls: seqs 1-3 in October, 4 in November, then 5 a late fill
	// of October; a prior-period adjustment (seq 6) booked in November.
	exec(`INSERT INTO records (stream_id, seq, operation_id, customer, meter, total, quantity, occurred_at, late_fill, billed,
	                           period_start, bucket, prior_period, ingested_at)
	SELECT s.id, v.seq, gen_random_uuid(), s.customer, s.meter, v.total, NULL, v.at, v.late, v.billed, v.period, v.at, v.prior, now()
	FROM streams s JOIN (VALUES
	  ('acme', 'calls', 1, 1, 1, false, '2026-10-01T00:00:00Z'::timestamptz, '2026-10-02T00:00:00Z'::timestamptz, NULL::timestamptz),
	  ('acme', 'calls', 2, 3, 2, false, '2026-10-01T00:00:00Z', '2026-10-03T00:00:00Z', NULL),
	  ('acme', 'calls', 3, 6, 3, false, '2026-10-01T00:00:00Z', '2026-10-04T00:00:00Z', NULL),
	  ('acme', 'calls', 4, 10, 4, false, '2026-11-01T00:00:00Z', '2026-11-02T00:00:00Z', NULL),
	  ('acme', 'calls', 5, 10, 0, true, '2026-10-01T00:00:00Z', '2026-10-05T00:00:00Z', NULL),
	  ('acme', 'calls', 6, 15, 5, false, '2026-11-01T00:00:00Z', '2026-11-03T00:00:00Z', '2026-10-01T00:00:00Z'),
	  ('acme', 'bytes', 1, 7, 7, false, '2026-11-01T00:00:00Z', '2026-11-02T00:00:00Z', NULL),
	  ('zeta', 'calls', 1, 2, 2, false, '2026-11-01T00:00:00Z', '2026-11-02T00:00:00Z', NULL)
	) AS v(customer, meter, seq, total, billed, late, period, at, prior)
	ON s.customer = v.customer AND s.meter = v.meter`)

	if err := migrations.UpTo(ctx, pool, 20); err != nil {
		t.Fatal(err)
	}
	var ranges string
	if err := pool.QueryRow(ctx, `
SELECT string_agg(format('%s/%s/%s:%s-%s', sp.customer, s.meter, to_char(sp.period_start AT TIME ZONE 'UTC', 'MM'), sp.min_seq, sp.max_seq), ' '
                  ORDER BY sp.customer, s.meter, sp.period_start)
FROM stream_periods sp JOIN streams s ON s.id = sp.stream_id`).Scan(&ranges); err != nil {
		t.Fatal(err)
	}
	if want := "acme/bytes/11:1-1 acme/calls/10:1-5 acme/calls/11:4-6 zeta/calls/11:1-1"; ranges != want {
		t.Fatalf("stream periods:\n got %s\nwant %s", ranges, want)
	}
	// Every (customer, period) reads the same rows through the function as
	// straight from records.
	var differ int
	if err := pool.QueryRow(ctx, `
WITH pairs AS (SELECT DISTINCT customer, period_start FROM records),
direct AS (SELECT customer, period_start, string_agg(format('%s:%s', stream_id, seq), ',' ORDER BY stream_id, seq) AS rows
           FROM records GROUP BY 1, 2),
through AS (SELECT p.customer, p.period_start,
                   (SELECT string_agg(format('%s:%s', r.stream_id, r.seq), ',' ORDER BY r.stream_id, r.seq)
                    FROM ledger_period_records(ARRAY[p.customer], ARRAY[p.period_start]) r) AS rows
            FROM pairs p)
SELECT count(*) FROM direct d FULL JOIN through t USING (customer, period_start) WHERE d.rows IS DISTINCT FROM t.rows`).Scan(&differ); err != nil {
		t.Fatal(err)
	}
	if differ != 0 {
		t.Fatalf("%d customer periods read other rows through ledger_period_records than from records", differ)
	}
	var all int
	if err := pool.QueryRow(ctx, `SELECT count(*) FROM ledger_period_records(NULL, ARRAY['2026-10-01T00:00:00Z'::timestamptz, '2026-11-01T00:00:00Z'])`).Scan(&all); err != nil {
		t.Fatal(err)
	}
	if all != 8 {
		t.Fatalf("every customer's periods: %d records, want 8", all)
	}
	var indexed bool
	if err := pool.QueryRow(ctx, `SELECT EXISTS (SELECT 1 FROM pg_indexes WHERE indexname = 'records_period')`).Scan(&indexed); err != nil {
		t.Fatal(err)
	}
	if indexed {
		t.Fatal("records_period is still there")
	}
}
