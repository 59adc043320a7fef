package periods_test

import (
	"context"
	"testing"
	"time"

	"github.com/tally-ledger/tally/internal/pgtest"
	"github.com/tally-ledger/tally/periods"
)

// BenchmarkLiveStatement: the statement of an open month with 100,000
// usage records (about 134 per hour), read from rollups (what Statement
// does) and, as the baseline, computed from the records as a close does.
//
//	go test ./periods -run '^$' -bench LiveStatement -benchtime 2s
func BenchmarkLiveStatement(b *testing.B) {
	ctx := context.Background()
	pool := pgtest.New(b)
	for _, q := range []string{
		`INSERT INTO customers (id, schedule) VALUES ('acme', '[{"effective_from":"0001-01-01T00:00:00Z","calendar":{"cadence":"monthly","anchor_day":1,"anchor_time":"00:00","zone":"UTC"}}]')`,
		`INSERT INTO records (stream_id, seq, operation_id, customer, meter, total, quantity, occurred_at, late_fill, billed, period_start, bucket, ingested_at)
		 SELECT 1, i, gen_random_uuid(), 'acme', 'calls', i, 1, t, false, 1, '2026-11-01T00:00:00Z', date_trunc('hour', t), t
		 FROM generate_series(1, 100000) AS i, LATERAL (SELECT '2026-11-01T00:00:00Z'::timestamptz + (i * interval '25 seconds') AS t) AS x`,
		`INSERT INTO stream_periods SELECT customer, period_start, stream_id, min(seq), max(seq) FROM records GROUP BY 1, 2, 3`,
		`INSERT INTO rollups (customer, meter, period_start, bucket, quantity)
		 SELECT customer, meter, period_start, bucket, sum(billed) FROM records GROUP BY 1, 2, 3, 4`,
		`ANALYZE`,
	} {
		if _, err := pool.Exec(ctx, q); err != nil {
			b.Fatal(err)
		}
	}
	store := periods.Store{Clock: func() time.Time { return time.Date(2026, 11, 30, 0, 0, 0, 0, time.UTC) }}
	sch, err := store.Schedule(ctx, pool, "acme")
	if err != nil {
		b.Fatal(err)
	}
	p, err := sch.Resolve("2026-11-01", time.Time{})
	if err != nil {
		b.Fatal(err)
	}
	b.Run("from-records", func(b *testing.B) {
		for b.Loop() {
			if st, err := store.StatementFromRecords(ctx, pool, "acme", p); err != nil || st.Lines[0].Billed.String() != "100000" {
				b.Fatal(st, err)
			}
		}
	})
	b.Run("from-rollups", func(b *testing.B) {
		for b.Loop() {
			if st, err := store.Statement(ctx, pool, "acme", "2026-11-01"); err != nil || st.Lines[0].Billed.String() != "100000" {
				b.Fatal(st, err)
			}
		}
	})
}
