package api_test

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"maps"
	"math/rand/v2"
	"net/http"
	"net/http/httptest"
	"os"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/shopspring/decimal"

	"github.com/tally-ledger/tally/api"
	"github.com/tally-ledger/tally/internal/pgtest"
	"github.com/tally-ledger/tally/ledger"
	"github.com/tally-ledger/tally/migrations"
	"github.com/tally-ledger/tally/periods"
	"github.com/tally-ledger/tally/tokens"
)

// The benchmark database: 10,000 customers × 2 meters, 500 records per
// stream every 4 hours from 2026-09-10 (10M ledger records, 10M hourly
// rollups over four monthly periods). Loading takes minutes, so it is built
// once and kept as database tally_bench_api (new migrations are applied to
// it on each run). Drop it by hand to rebuild it after a migration was
// edited, or to reclaim its 4 GB.
const (
	benchCustomers = 10_000
	benchRecords   = 500 // per stream
	benchClients   = 50
	// benchKindCustomers have a gauge (a reading every 30 minutes of the
	// current period) and a unique meter (benchMembers members) as well.
	benchKindCustomers = benchCustomers / 2
	benchReadings      = 72
	benchMembers       = 20
)

var benchNow = time.Date(2026, 12, 2, 12, 0, 0, 0, time.UTC)

// BenchmarkUsage measures GET /v1/customers/{c}/usage through the real
// handler and a real HTTP server, with 50 concurrent clients using
// customer tokens, and reports latency percentiles. Run:
//
//	go test -run '^$' -bench BenchmarkUsage -benchtime 20000x -timeout 30m ./api/
func BenchmarkUsage(b *testing.B) {
	pool := benchDatabase(b)
	l, _ := ledger.New(ledger.Config{Clock: func() time.Time { return benchNow }})
	registries := map[string]*prometheus.Registry{} // by server URL
	server := func(cacheTTL time.Duration) string {
		reg := prometheus.NewRegistry()
		h, err := api.New(api.Config{Pool: pool, Ledger: l, AdminToken: adminToken, Clock: func() time.Time { return benchNow },
			Logger: slog.New(slog.DiscardHandler), Registry: reg, UsageCacheTTL: cacheTTL,
			AddressRate: -1}) // every client is one address here
		if err != nil {
			b.Fatal(err)
		}
		ctx, cancel := context.WithCancel(context.Background())
		done := make(chan error, 1)
		go func() { done <- h.Run(ctx) }()
		b.Cleanup(func() { cancel(); <-done })
		srv := httptest.NewServer(h)
		b.Cleanup(srv.Close)
		registries[srv.URL] = reg
		return srv.URL
	}
	cached, uncached := server(0), server(-1) // the default cache; none
	tokens := benchTokens(b, pool)
	// The floor: the same clients against a handler that only writes a
	// fixed answer of the same size (no auth, no routing, no Postgres).
	floor := func() string {
		res, err := http.DefaultClient.Do(benchRequest(b, cached, "cust-00000", tokens["cust-00000"], "?meter=api_calls&period=previous"))
		if err != nil {
			b.Fatal(err)
		}
		body, _ := io.ReadAll(res.Body)
		res.Body.Close()
		srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			w.Header().Set("Content-Type", "application/json")
			_, _ = w.Write(body)
		}))
		b.Cleanup(srv.Close)
		return srv.URL
	}()
	all := slices.Sorted(maps.Keys(tokens))
	// Half the customers also have a seats gauge and a mau unique meter
	// (docs/design.md §16): the same query over each half, in the same run,
	// is the usage query's p99 with and without gauges.
	withKinds, countersOnly := all[:benchKindCustomers], all[benchKindCustomers:]
	benchKinds(b, pool, l, withKinds)

	// Saturation: 50 clients send back to back, so latency is 50 /
	// throughput. At a fixed load: 50 clients together offer a rate, each
	// on its own schedule; latency counts from the scheduled send time, so
	// a slow response delays nothing unmeasured (no coordinated omission).
	// Clients pick customers uniformly at random among all 10,000;
	// "no-cache" reads Postgres on every request, "cache" uses the API's
	// usage cache, coherent through Postgres's notifications: with no
	// writes every answer after a customer's first is a hit (hit-% says how
	// many were); "ingest-2000rps" books usage meanwhile, forgetting the
	// answers it changes. "floor" is the same clients against a handler
	// that writes a fixed answer: what the harness and HTTP cost alone.
	for _, q := range []struct {
		name, url string
		customers []string
		query     string
		rate      float64
		writes    int // records/s booked meanwhile, like ingest
	}{
		{"floor/fixed-answer", floor, all, "?meter=api_calls&period=previous", 0, 0},
		{"floor/fixed-answer-at-8000rps", floor, all, "?meter=api_calls&period=previous", 8000, 0},
		{"month-by-day-one-meter/no-cache", uncached, all, "?meter=api_calls&period=previous", 0, 0},
		{"month-by-day-one-meter/no-cache-at-2000rps", uncached, all, "?meter=api_calls&period=previous", 2000, 0},
		{"month-by-day-one-meter/no-cache-at-5000rps", uncached, all, "?meter=api_calls&period=previous", 5000, 0},
		{"month-by-day-one-meter/cache", cached, all, "?meter=api_calls&period=previous", 0, 0},
		{"month-by-day-one-meter/cache-at-8000rps", cached, all, "?meter=api_calls&period=previous", 8000, 0},
		{"current-by-day-one-meter/cache-ingest-2000rps", cached, all, "?meter=api_calls", 0, 2000},
		{"month-by-hour-all-meters/cache", cached, all, "?period=previous&group_by=hour", 0, 0},
		{"month-by-hour-all-meters/no-cache-at-1000rps", uncached, all, "?period=previous&group_by=hour", 1000, 0},
		{"current-by-day-all-meters/cache", cached, all, "", 0, 0},
		{"current-by-day-all-meters/cache-counters-only", cached, countersOnly, "", 0, 0},
		{"current-by-day-all-meters/cache-with-gauges", cached, withKinds, "", 0, 0},
		{"current-by-day-all-meters/no-cache-counters-only-at-1000rps", uncached, countersOnly, "", 1000, 0},
		{"current-by-day-all-meters/no-cache-with-gauges-at-1000rps", uncached, withKinds, "", 1000, 0},
	} {
		b.Run(q.name, func(b *testing.B) {
			if q.writes > 0 {
				stop := benchWriter(b, pool, l, all, q.writes)
				defer stop()
			}
			benchClientsRun(b, q.url, q.customers, tokens, q.query, q.rate, registries[q.url])
		})
	}
}

func benchClientsRun(b *testing.B, base string, customers []string, tokens map[string]string, query string, rate float64, reg *prometheus.Registry) {
	client := &http.Client{Transport: &http.Transport{MaxIdleConns: 2 * benchClients, MaxIdleConnsPerHost: 2 * benchClients}}
	get := func(rng *rand.Rand) (time.Duration, error) {
		c := customers[rng.IntN(len(customers))]
		req := benchRequest(b, base, c, tokens[c], query)
		start := time.Now()
		res, err := client.Do(req)
		if err != nil {
			return 0, err
		}
		_, _ = io.Copy(io.Discard, res.Body)
		res.Body.Close()
		d := time.Since(start)
		if res.StatusCode != 200 {
			return d, fmt.Errorf("status %d", res.StatusCode)
		}
		return d, nil
	}
	// run drives the clients until n requests were sent (or, with n 0,
	// for d) and returns each client's latencies.
	run := func(n int64, d time.Duration) [][]time.Duration {
		var next atomic.Int64
		lat := make([][]time.Duration, benchClients)
		var wg sync.WaitGroup
		var failed atomic.Value
		interval := time.Duration(0) // per client, at a fixed load
		if rate > 0 {
			interval = time.Duration(float64(benchClients) / rate * float64(time.Second))
		}
		start := time.Now()
		more := func() bool {
			if n > 0 {
				return next.Add(1) <= n
			}
			return time.Since(start) < d
		}
		for i := range benchClients {
			wg.Add(1)
			go func() {
				defer wg.Done()
				rng := rand.New(rand.NewPCG(uint64(i), uint64(n)))
				due := start.Add(interval * time.Duration(i) / benchClients) // spread the clients' phases
				for more() {
					if interval > 0 {
						time.Sleep(time.Until(due))
					}
					d, err := get(rng)
					if err != nil {
						failed.Store(err)
						return
					}
					if interval > 0 {
						d = time.Since(due)
						due = due.Add(interval)
					}
					lat[i] = append(lat[i], d)
				}
			}()
		}
		wg.Wait()
		if err := failed.Load(); err != nil {
			b.Fatal(err)
		}
		return lat
	}
	// Warm up for 2s: connections, token and calendar caches. With the
	// usage cache, also until five requests per customer were sent, so the
	// cache is in its steady state (entries expiring and refilled) however
	// slow the machine is: after 2s alone a machine serving 6,000 req/s had
	// ~10% cold misses and a p99 of them.
	warm := len(slices.Concat(run(0, 2*time.Second)...))
	if reg != nil && warm < 5*len(customers) {
		run(int64(5*len(customers)-warm), 0)
	}
	hits := benchCacheHits(b, reg)
	b.ResetTimer()
	start := time.Now()
	lat := run(int64(b.N), 0)
	elapsed := time.Since(start)
	b.StopTimer()
	if reg != nil {
		b.ReportMetric(100*(benchCacheHits(b, reg)-hits)/float64(b.N), "hit-%")
	}
	all := slices.Concat(lat...)
	slices.Sort(all)
	pct := func(p float64) float64 {
		return float64(all[min(len(all)-1, int(p*float64(len(all))))].Microseconds()) / 1000
	}
	b.ReportMetric(pct(0.50), "p50-ms")
	b.ReportMetric(pct(0.99), "p99-ms")
	b.ReportMetric(pct(0.999), "p99.9-ms")
	b.ReportMetric(float64(len(all))/elapsed.Seconds(), "req/s")
}

func benchRequest(b *testing.B, base, customer, token, query string) *http.Request {
	req, err := http.NewRequest("GET", base+"/v1/customers/"+customer+"/usage"+query, nil)
	if err != nil {
		b.Fatal(err)
	}
	req.Header.Set("Authorization", "Bearer "+token)
	return req
}

// benchDailyRollups sums the hourly rollups into daily ones (the bench
// customers' calendars are in UTC), as the ledger would have, unless a
// customer's October already has them: a database loaded before the
// loader did this has none, and its by-day answers would be empty.
func benchDailyRollups(b *testing.B, pool *pgxpool.Pool) {
	ctx := context.Background()
	var done bool
	err := pool.QueryRow(ctx, `SELECT EXISTS (SELECT 1 FROM rollups_daily WHERE customer = 'cust-00000' AND period_start = '2026-10-01T00:00:00Z')`).Scan(&done)
	if err != nil {
		b.Fatal(err)
	}
	if done {
		return
	}
	b.Logf("filling rollups_daily from the hourly rollups...")
	_, err = pool.Exec(ctx, `
INSERT INTO rollups_daily (customer, period_start, meter, day, quantity)
SELECT customer, period_start, meter, (bucket AT TIME ZONE 'UTC')::date, sum(quantity)
FROM rollups GROUP BY 1, 2, 3, 4 ORDER BY 1, 2, 3, 4
ON CONFLICT (customer, period_start, meter, day) DO UPDATE SET quantity = EXCLUDED.quantity`)
	if err != nil {
		b.Fatal(err)
	}
	if _, err := pool.Exec(ctx, `VACUUM ANALYZE rollups_daily`); err != nil {
		b.Fatal(err)
	}
}

// benchCacheHits reads tally_api_usage_cache_total{result="hit"}.
func benchCacheHits(b *testing.B, reg *prometheus.Registry) float64 {
	if reg == nil {
		return 0
	}
	mfs, err := reg.Gather()
	if err != nil {
		b.Fatal(err)
	}
	for _, mf := range mfs {
		if mf.GetName() != "tally_api_usage_cache_total" {
			continue
		}
		for _, m := range mf.GetMetric() {
			for _, l := range m.GetLabel() {
				if l.GetName() == "result" && l.GetValue() == "hit" {
					return m.GetCounter().GetValue()
				}
			}
		}
	}
	return 0
}

// benchWriter books perSecond records for random customers into the
// current period, in ten transactions a second that also move the
// customers' partition positions, as ingest would: every write forgets
// its customers' cached answers. It returns a func that stops it.
func benchWriter(b *testing.B, pool *pgxpool.Pool, l *ledger.Ledger, customers []string, perSecond int) func() {
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	epoch := time.Now().UnixMilli() // new streams every run
	go func() {
		defer close(done)
		rng := rand.New(rand.NewPCG(uint64(epoch), 1))
		seqs := map[string]int64{}
		tick := time.NewTicker(100 * time.Millisecond)
		defer tick.Stop()
		for n := 0; ; n++ {
			select {
			case <-ctx.Done():
				return
			case <-tick.C:
			}
			recs := make([]ledger.Record, 0, perSecond/10)
			for range perSecond / 10 {
				c := customers[rng.IntN(len(customers))]
				seqs[c]++
				recs = append(recs, ledger.Record{OperationID: uuid.Must(uuid.NewV7()),
					Stream: ledger.StreamKey{Producer: "bench-writer", Epoch: epoch, Customer: c, Meter: "api_calls"},
					Seq:    seqs[c], Total: decimal.NewFromInt(seqs[c]), OccurredAt: benchNow.Add(-time.Minute)})
			}
			err := pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
				if _, err := l.Apply(ctx, tx, recs); err != nil {
					return err
				}
				_, err := tx.Exec(ctx, `UPDATE ingest_partitions SET applied_through = $1`, benchNow.Add(-2*time.Second))
				return err
			})
			if err != nil && ctx.Err() == nil {
				b.Errorf("bench writer: %v", err)
				return
			}
		}
	}()
	return func() { cancel(); <-done }
}

// benchTokens replaces the benchmark database's tokens with one per
// customer and returns customer → token.
func benchTokens(b *testing.B, pool *pgxpool.Pool) map[string]string {
	ctx := context.Background()
	if _, err := pool.Exec(ctx, `DELETE FROM api_tokens`); err != nil {
		b.Fatal(err)
	}
	out := map[string]string{}
	for i := range benchCustomers {
		c := fmt.Sprintf("cust-%05d", i)
		_, secret, err := tokens.Create(ctx, pool, c, "bench", benchNow)
		if err != nil {
			b.Fatal(err)
		}
		out[c] = secret
	}
	return out
}

func benchDatabase(b *testing.B) *pgxpool.Pool {
	ctx := context.Background()
	name := "tally_bench_api"
	admin, err := pgx.Connect(ctx, pgtest.AdminURL())
	if err != nil {
		b.Fatalf("benchmark needs Postgres: %v", err)
	}
	defer admin.Close(ctx)
	var exists bool
	if err := admin.QueryRow(ctx, `SELECT EXISTS (SELECT 1 FROM pg_database WHERE datname = $1)`, name).Scan(&exists); err != nil {
		b.Fatal(err)
	}
	if !exists {
		if _, err := admin.Exec(ctx, "CREATE DATABASE "+pgx.Identifier{name}.Sanitize()); err != nil {
			b.Fatal(err)
		}
	}
	// TALLY_BENCH_DATABASE_URL points the API at the same database another
	// way (e.g. over the Unix socket: host=/var/run/postgresql dbname=tally_bench_api).
	url := pgtest.WithDatabase(pgtest.AdminURL(), name)
	if v := os.Getenv("TALLY_BENCH_DATABASE_URL"); v != "" {
		url = v
	}
	pool, err := pgxpool.New(ctx, url)
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(pool.Close)
	if _, err := migrations.Up(ctx, pool, slog.New(slog.DiscardHandler)); err != nil {
		b.Fatal(err)
	}
	if _, err := pool.Exec(ctx, `CREATE TABLE IF NOT EXISTS bench_loaded (records bigint NOT NULL)`); err != nil {
		b.Fatal(err)
	}
	// Ingest has seen every customer: as_of comes from its own partition.
	if _, err := pool.Exec(ctx, `
INSERT INTO ingest_customers (customer, topic, partition, first_seen)
SELECT id, 'tally.meter-batches', abs(hashtext(id)) % 4, now() FROM customers
ON CONFLICT DO NOTHING`); err != nil {
		b.Fatal(err)
	}
	var loaded int64
	_ = pool.QueryRow(ctx, `SELECT coalesce(max(records), 0) FROM bench_loaded`).Scan(&loaded)
	if loaded == benchCustomers*2*benchRecords {
		benchDailyRollups(b, pool)
		return pool
	}
	b.Logf("loading %s: %d records (once per schema version)...", name, benchCustomers*2*benchRecords)
	start := time.Now()
	schedule, _ := json.Marshal(periods.NewSchedule(periods.DefaultCalendar()))
	for _, q := range []struct {
		sql  string
		args []any
	}{
		{`TRUNCATE customers, streams, records, stream_periods, rollups, ingest_partitions, bench_loaded`, nil},
		{`INSERT INTO customers (id, schedule) SELECT 'cust-' || lpad(c::text, 5, '0'), $1::jsonb FROM generate_series(0, $2 - 1) c`,
			[]any{schedule, benchCustomers}},
		{`INSERT INTO streams (producer, epoch, customer, meter, last_seq, last_total)
		  SELECT 'bench', 1, 'cust-' || lpad(c::text, 5, '0'), m, $1::int, 0
		  FROM generate_series(0, $2 - 1) c CROSS JOIN unnest(ARRAY['api_calls', 'storage_gb']) m ORDER BY 3, 4`,
			[]any{benchRecords, benchCustomers}},
		{`UPDATE streams SET last_total = last_seq * (1 + id % 5)`, nil},
		{`INSERT INTO ingest_partitions (topic, partition, next_offset, high_watermark, applied_through)
		  SELECT 'tally.meter-batches', p, 1000, 1000, $1::timestamptz - interval '2 seconds' FROM generate_series(0, 3) p`,
			[]any{benchNow}},
	} {
		if _, err := pool.Exec(ctx, q.sql, q.args...); err != nil {
			b.Fatalf("%s: %v", q.sql, err)
		}
	}
	// Records (and the matching rollups: one record per stream-hour) in
	// chunks of streams, in time order like real ingest would write them.
	const chunk = 2000
	for lo := int64(1); lo <= 2*benchCustomers; lo += chunk {
		_, err := pool.Exec(ctx, `
INSERT INTO records (stream_id, seq, operation_id, customer, meter, total, quantity, occurred_at,
                     final, late_fill, billed, period_start, bucket, ingested_at)
SELECT s.id, i, md5(s.customer || '/' || s.meter || '/' || i)::uuid, s.customer, s.meter,
       (1 + s.id % 5) * i, 1 + s.id % 5, t, false, false, 1 + s.id % 5,
       date_trunc('month', t, 'UTC'), date_trunc('hour', t, 'UTC'), t
FROM streams s
CROSS JOIN generate_series(1, $3::int) AS i
CROSS JOIN LATERAL (SELECT timestamptz '2026-09-10 00:00:00+00' + make_interval(hours => (i - 1) * 4 + (s.id % 4)::int) AS t) AS tt
WHERE s.id >= $1 AND s.id < $2
ORDER BY t, s.id`, lo, lo+chunk, benchRecords)
		if err != nil {
			b.Fatal(err)
		}
		_, err = pool.Exec(ctx, `
INSERT INTO rollups (customer, meter, period_start, bucket, quantity)
SELECT customer, meter, period_start, bucket, sum(billed)
FROM records WHERE stream_id >= $1 AND stream_id < $2
GROUP BY 1, 2, 3, 4 ORDER BY bucket, customer, meter`, lo, lo+chunk)
		if err != nil {
			b.Fatal(err)
		}
		b.Logf("  streams %d..%d loaded (%s)", lo, lo+chunk-1, time.Since(start).Round(time.Second))
	}
	benchDailyRollups(b, pool)
	// Where each stream's records of a period lie (as the ledger keeps it).
	if _, err := pool.Exec(ctx, `
INSERT INTO stream_periods SELECT customer, period_start, stream_id, min(seq), max(seq) FROM records GROUP BY 1, 2, 3`); err != nil {
		b.Fatal(err)
	}
	if _, err := pool.Exec(ctx, `VACUUM ANALYZE`); err != nil {
		b.Fatal(err)
	}
	if _, err := pool.Exec(ctx, `INSERT INTO bench_loaded VALUES ($1)`, benchCustomers*2*benchRecords); err != nil {
		b.Fatal(err)
	}
	b.Logf("loaded in %s", time.Since(start).Round(time.Second))
	return pool
}

// benchKinds declares seats (gauge) and mau (unique) and books, once, each
// of customers' readings and members in the current period before benchNow
// through the ledger, as ingest would.
func benchKinds(b *testing.B, pool *pgxpool.Pool, l *ledger.Ledger, customers []string) {
	ctx := context.Background()
	if _, err := pool.Exec(ctx, `CREATE TABLE IF NOT EXISTS bench_kinds_loaded (customers int NOT NULL)`); err != nil {
		b.Fatal(err)
	}
	var loaded int
	_ = pool.QueryRow(ctx, `SELECT coalesce(max(customers), 0) FROM bench_kinds_loaded`).Scan(&loaded)
	if loaded == len(customers) {
		return
	}
	b.Logf("booking gauges and unique members for %d customers (once)...", len(customers))
	start := time.Date(benchNow.Year(), benchNow.Month(), 1, 0, 0, 0, 0, time.UTC)
	err := pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
		for m, k := range map[string]ledger.MeterKind{"seats": ledger.Gauge, "mau": ledger.Unique} {
			if _, err := ledger.DeclareMeter(ctx, tx, ledger.Meter{Meter: m, Kind: k}, start); err != nil {
				return err
			}
		}
		return nil
	})
	if err != nil {
		b.Fatal(err)
	}
	for i, c := range customers {
		var recs []ledger.Record
		rec := func(meter string, seq int64, at time.Time) ledger.Record {
			return ledger.Record{OperationID: uuid.New(), Stream: ledger.StreamKey{Producer: "bench", Epoch: 1, Customer: c, Meter: meter},
				Seq: seq, OccurredAt: at}
		}
		for j := range benchReadings {
			r := rec("seats", int64(j+1), start.Add(time.Duration(j)*30*time.Minute))
			r.Shape, r.Level = ledger.Gauge, decimal.NewFromInt(int64(1+(i+j*7)%50))
			recs = append(recs, r)
		}
		for j := range benchMembers {
			r := rec("mau", int64(j+1), start.Add(time.Duration(j)*time.Hour))
			r.Shape, r.Member = ledger.Unique, fmt.Sprintf("user-%d", (i+j)%(2*benchMembers))
			recs = append(recs, r)
		}
		if err := pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
			_, err := l.Apply(ctx, tx, recs)
			return err
		}); err != nil {
			b.Fatalf("%s: %v", c, err)
		}
	}
	if _, err := pool.Exec(ctx, `INSERT INTO bench_kinds_loaded VALUES ($1)`, len(customers)); err != nil {
		b.Fatal(err)
	}
}
