package reconcile_test

import (
	"context"
	"io"
	"net/url"
	"os"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/tally-ledger/tally/internal/pgtest"
	"github.com/tally-ledger/tally/reconcile"
)

// BenchmarkReconcileScan reconciles one monthly period holding
// TALLY_BENCH_ENTRIES ledger entries (default 1,000,000) spread over one
// customer × 2 meters per 10,000 entries, and reports entries checked per
// second. With TALLY_BENCH_HISTORY=h, the ledger also holds h months
// before it of the same traffic (a ledger in use for a while). The data
// is loaded once into a database of its own
// (tally_bench_reconcile_v5_<n>[_h<h>]) and kept for later runs.
//
//	TALLY_BENCH_ENTRIES=10000000 go test ./reconcile -run '^$' -bench ReconcileScan -benchtime 3x
func BenchmarkReconcileScan(b *testing.B) {
	n, history := 1_000_000, 0
	for v, dst := range map[string]*int{"TALLY_BENCH_ENTRIES": &n, "TALLY_BENCH_HISTORY": &history} {
		if s := os.Getenv(v); s != "" {
			var err error
			if *dst, err = strconv.Atoi(s); err != nil {
				b.Fatal(err)
			}
		}
	}
	pool := benchDB(b, n, history)
	rc, err := reconcile.New(reconcile.Config{Pool: pool, Clock: func() time.Time { return time.Date(2026, 12, 5, 0, 0, 0, 0, time.UTC) }})
	if err != nil {
		b.Fatal(err)
	}
	b.ResetTimer()
	var scanned int64
	for i := 0; i < b.N; i++ {
		r, err := rc.Run(context.Background(), reconcile.Options{Period: "2026-11-01"})
		if err != nil || r.Status != reconcile.StatusClean {
			b.Fatalf("run: %v %s", err, r.Status)
		}
		scanned += r.EntriesScanned
	}
	b.ReportMetric(float64(scanned)/b.Elapsed().Seconds(), "entries/s")
}

func benchDB(b *testing.B, n, history int) *pgxpool.Pool {
	ctx := context.Background()
	name := "tally_bench_reconcile_v5_" + strconv.Itoa(n)
	if history > 0 {
		name += "_h" + strconv.Itoa(history)
	}
	admin, err := pgx.Connect(ctx, pgtest.AdminURL())
	if err != nil {
		b.Fatal(err)
	}
	defer admin.Close(ctx)
	var ready bool
	_ = admin.QueryRow(ctx, `SELECT EXISTS (SELECT 1 FROM pg_database WHERE datname = $1)`, name).Scan(&ready)
	dbURL := pgtest.WithDatabase(pgtest.AdminURL(), name)
	if ready {
		pool, err := pgxpool.New(ctx, dbURL)
		if err == nil {
			var loaded bool
			if pool.QueryRow(ctx, `SELECT EXISTS (SELECT 1 FROM bench_loaded)`).Scan(&loaded) == nil && loaded {
				return pool
			}
			pool.Close()
		}
		if _, err := admin.Exec(ctx, "DROP DATABASE "+name+" WITH (FORCE)"); err != nil {
			b.Fatal(err)
		}
	}
	// A migrated clone, then the data.
	tmpURL := pgtest.NewURL(b)
	if _, err := admin.Exec(ctx, "CREATE DATABASE "+name+" TEMPLATE "+pgx.Identifier{dbName(tmpURL)}.Sanitize()); err != nil {
		b.Fatal(err)
	}
	pool, err := pgxpool.New(ctx, dbURL)
	if err != nil {
		b.Fatal(err)
	}
	// Each of n/10,000 customers has 2 meters of 5,000 records over the
	// month: several records per rollup hour, as with real traffic.
	customers := n / 10000
	if customers < 1 {
		customers = 1
	}
	perStream := n / (2 * customers)
	start := time.Now()
	for _, q := range []string{
		`INSERT INTO customers (id, schedule) SELECT 'c' || i,
		 '[{"effective_from":"0001-01-01T00:00:00Z","calendar":{"cadence":"monthly","anchor_day":1,"anchor_time":"00:00","zone":"UTC"}}]'
		 FROM generate_series(1, $1::int) i`,
		`INSERT INTO streams (producer, epoch, customer, meter, last_seq, last_total)
		 SELECT 'gw', 1, 'c' || c, m, $1::int * ($3::int + 1), $1::int * ($3::int + 1) * 1.5
		 FROM generate_series(1, $2::int) c, unnest(ARRAY['calls', 'bytes']) m`,
		// Month by month, oldest first (seqs grow with time), the streams
		// interleaved in each as live traffic writes them.
		`INSERT INTO records (stream_id, seq, operation_id, customer, meter, total, quantity, occurred_at, final, late_fill,
		                      billed, period_start, bucket, prior_period, ingested_at)
		 SELECT s.id, seq, gen_random_uuid(), s.customer, s.meter, seq * 1.5, 1.5, ts, false, false, 1.5,
		        p.start, date_trunc('hour', ts), NULL, now()
		 FROM generate_series(0, $2::int) mo,
		      LATERAL (SELECT '2026-11-01T00:00:00Z'::timestamptz - ($2::int - mo) * interval '1 month') p(start),
		      generate_series(1, $1::int) j, streams s,
		      LATERAL (SELECT mo * $1::int + j, p.start + j * (interval '27 days' / $1::int)) t(seq, ts)`,
		`INSERT INTO stream_periods SELECT customer, period_start, stream_id, min(seq), max(seq) FROM records GROUP BY 1, 2, 3`,
		`INSERT INTO rollups SELECT customer, meter, period_start, bucket, sum(billed) FROM records GROUP BY 1, 2, 3, 4`,
		`INSERT INTO rollups_daily SELECT customer, period_start, meter, (bucket AT TIME ZONE 'UTC')::date, sum(quantity) FROM rollups GROUP BY 1, 2, 3, 4`,
		`VACUUM ANALYZE`,
		`CREATE TABLE bench_loaded AS SELECT true AS loaded`,
	} {
		var err error
		switch {
		case strings.Contains(q, "INSERT INTO customers"):
			_, err = pool.Exec(ctx, q, customers)
		case strings.Contains(q, "INSERT INTO streams"):
			_, err = pool.Exec(ctx, q, perStream, customers, history)
		case strings.Contains(q, "INSERT INTO records"):
			_, err = pool.Exec(ctx, q, perStream, history)
		default:
			_, err = pool.Exec(ctx, q)
		}
		if err != nil {
			b.Fatalf("load: %v", err)
		}
	}
	b.Logf("loaded %d entries in %s", perStream*2*customers, time.Since(start).Round(time.Second))
	return pool
}

func dbName(u string) string {
	p, err := url.Parse(u)
	if err != nil {
		return u
	}
	return strings.TrimPrefix(p.Path, "/")
}

// BenchmarkReconcileManyCustomers reconciles and reports a period of
// many small customers (two meters, a few records each) and reports the
// time per customer, which should not grow with their number.
//
//	go test ./reconcile -run '^$' -bench ReconcileManyCustomers -benchtime 1x
func BenchmarkReconcileManyCustomers(b *testing.B) {
	for _, n := range []int{2_000, 20_000} {
		b.Run(strconv.Itoa(n), func(b *testing.B) {
			ctx := context.Background()
			pool := pgtest.New(b)
			for _, q := range []string{
				`INSERT INTO customers (id, schedule) SELECT 'c' || i,
				 '[{"effective_from":"0001-01-01T00:00:00Z","calendar":{"cadence":"monthly","anchor_day":1,"anchor_time":"00:00","zone":"UTC"}}]'
				 FROM generate_series(1, $1::int) i`,
				`INSERT INTO streams (producer, epoch, customer, meter, last_seq, last_total)
				 SELECT 'gw', 1, 'c' || c, m, 3, 4.5 FROM generate_series(1, $1::int) c, unnest(ARRAY['calls', 'bytes']) m`,
				`INSERT INTO records (stream_id, seq, operation_id, customer, meter, total, quantity, occurred_at, final, late_fill,
				                      billed, period_start, bucket, prior_period, ingested_at)
				 SELECT s.id, seq, gen_random_uuid(), s.customer, s.meter, seq * 1.5, 1.5, ts, false, false, 1.5,
				        '2026-11-01T00:00:00Z', date_trunc('hour', ts), NULL, now()
				 FROM streams s, generate_series(1, 3) seq,
				      LATERAL (SELECT '2026-11-01T00:00:00Z'::timestamptz + seq * interval '1 day') t(ts)
				 WHERE $1::int > 0`,
				`INSERT INTO stream_periods SELECT customer, period_start, stream_id, min(seq), max(seq) FROM records GROUP BY 1, 2, 3 HAVING $1::int > 0`,
				`INSERT INTO rollups SELECT customer, meter, period_start, bucket, sum(billed) FROM records GROUP BY 1, 2, 3, 4 HAVING $1::int > 0`,
				`INSERT INTO rollups_daily SELECT customer, period_start, meter, (bucket AT TIME ZONE 'UTC')::date, sum(quantity) FROM rollups GROUP BY 1, 2, 3, 4 HAVING $1::int > 0`,
				`ANALYZE`,
			} {
				var err error
				if strings.HasPrefix(q, "ANALYZE") {
					_, err = pool.Exec(ctx, q)
				} else {
					_, err = pool.Exec(ctx, q, n)
				}
				if err != nil {
					b.Fatalf("load: %v", err)
				}
			}
			rc, err := reconcile.New(reconcile.Config{Pool: pool, Clock: func() time.Time { return time.Date(2026, 12, 5, 0, 0, 0, 0, time.UTC) }})
			if err != nil {
				b.Fatal(err)
			}
			b.ResetTimer()
			for i := 0; i < b.N; i++ {
				r, err := rc.Run(ctx, reconcile.Options{Period: "2026-11-01"})
				if err != nil || r.Status != reconcile.StatusClean {
					b.Fatalf("run: %v %s", err, r.Status)
				}
				if err := reconcile.WriteReport(io.Discard, reconcile.FormatText, r); err != nil {
					b.Fatal(err)
				}
			}
			b.ReportMetric(float64(b.Elapsed().Microseconds())/float64(b.N*n), "µs/customer")
		})
	}
}
