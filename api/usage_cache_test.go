package api_test

import (
	"context"
	"encoding/json"
	"fmt"
	"math/rand/v2"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/shopspring/decimal"

	"github.com/tally-ledger/tally/amount"
	"github.com/tally-ledger/tally/api"
	"github.com/tally-ledger/tally/ledger"
	"github.com/tally-ledger/tally/tokens"
)

// cacheCounts reads tally_api_usage_cache_total{result="hit"} and "miss".
func (f *fixture) cacheCounts() (hits, misses int) {
	f.t.Helper()
	m := f.do("GET", "/metrics", adminToken, nil)
	for _, line := range strings.Split(string(m.body), "\n") {
		for result, n := range map[string]*int{"hit": &hits, "miss": &misses} {
			if rest, ok := strings.CutPrefix(line, `tally_api_usage_cache_total{result="`+result+`"} `); ok {
				fmt.Sscan(rest, n)
			}
		}
	}
	return hits, misses
}

// TestUsageCache: an answer is served from the cache until a commit
// changes it; a moved ingest position advances a cached answer's as_of
// without a read; a write behind the API's back is seen as soon as its
// notification is; losing the listening connection empties the cache.
func TestUsageCache(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	seedAcme(f)
	f.exec(`INSERT INTO ingest_customers (customer, topic, partition, first_seen) VALUES ('acme', 'tally.meter-batches', 0, now())`)
	f.exec(`INSERT INTO ingest_partitions (topic, partition, next_offset, applied_through) VALUES
		('tally.meter-batches', 0, 10, '2026-11-20T11:59:50Z'), ('tally.meter-batches', 1, 10, '2026-11-20T11:59:40Z')`)
	get := func(want map[string]any) {
		t.Helper()
		got := f.do("GET", "/v1/customers/acme/usage?meter=api_calls", adminToken, nil).json(t)
		for k, v := range want {
			if got[k] != v {
				t.Fatalf("%s = %v, want %v; answer %v", k, got[k], v, got)
			}
		}
	}
	counts := func(wantHits, wantMisses int) {
		t.Helper()
		if h, m := f.cacheCounts(); h != wantHits || m != wantMisses {
			t.Fatalf("cache hits %d misses %d, want %d and %d", h, m, wantHits, wantMisses)
		}
	}
	get(map[string]any{"total": "18.5", "as_of": "2026-11-20T11:59:50Z", "lag_seconds": 10.0})
	get(map[string]any{"total": "18.5", "as_of": "2026-11-20T11:59:50Z", "lag_seconds": 10.0})
	counts(1, 1)

	// Ingest moves acme's partition (and another): the cached answer is
	// still true, as of the new position.
	f.exec(`UPDATE ingest_partitions SET applied_through = applied_through + interval '5 seconds'`)
	get(map[string]any{"total": "18.5", "as_of": "2026-11-20T11:59:55Z", "lag_seconds": 5.0})
	counts(2, 1)

	// Usage lands behind the API's back: read afresh once notified.
	f.usage("acme", "api_calls", date("2026-11-20T11:00:00Z"), "1")
	get(map[string]any{"total": "19.5", "as_of": "2026-11-20T11:59:55Z"})
	get(map[string]any{"total": "19.5"})
	counts(3, 2)
	// Another customer's usage forgets nothing of acme's.
	f.usage("globex", "api_calls", date("2026-11-20T11:00:00Z"), "1")
	get(map[string]any{"total": "19.5"})
	counts(4, 2)

	// A close is a change too (the period state).
	f.exec(`INSERT INTO period_closes (customer, period_start, period_end, closed_at, statement, forced, reason, actor)
		VALUES ('acme', '2026-11-01T04:00:00Z', '2026-12-01T05:00:00Z', now(), '{}', true, 'test', 'test')`)
	get(map[string]any{"total": "19.5"})
	counts(4, 3)

	// A customer ingest has not seen takes the oldest position: globex's
	// cached answer advances only when every partition has moved past it.
	globex := func(asOf string) {
		t.Helper()
		got := f.do("GET", "/v1/customers/globex/usage?meter=api_calls", adminToken, nil).json(t)
		if got["as_of"] != asOf || got["total"] != "8" {
			t.Fatalf("globex: %v, want as_of %s", got, asOf)
		}
	}
	globex("2026-11-20T11:59:45Z")
	f.exec(`UPDATE ingest_partitions SET applied_through = '2026-11-20T11:59:58Z' WHERE partition = 0`)
	globex("2026-11-20T11:59:45Z")
	f.exec(`UPDATE ingest_partitions SET applied_through = '2026-11-20T11:59:57Z' WHERE partition = 1`)
	globex("2026-11-20T11:59:57Z")
	counts(6, 4)

	// Quiet spells (the listener pings its connection every 100ms in
	// tests) leave the cache up and its answers in place.
	time.Sleep(350 * time.Millisecond)
	get(map[string]any{"total": "19.5"})
	counts(7, 4)
	if strings.Contains(f.logs.String(), "usage cache off") {
		t.Fatalf("the listener reconnected while quiet:\n%s", f.logs.String())
	}

	// The listener's connection is cut: the cache is emptied, and usage
	// written meanwhile is read once it listens again. (November is
	// closed, so usage of it is billed in December, the first open period.)
	december := func(want string) {
		t.Helper()
		if got := f.do("GET", "/v1/customers/acme/usage?meter=api_calls&period=2026-12-01", adminToken, nil).json(t); got["total"] != want {
			t.Fatalf("December's total = %v, want %s; answer %v", got["total"], want, got)
		}
	}
	december("0")
	december("0") // cached
	f.exec(`SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE application_name = 'tally-api-usage-watch' AND datname = current_database()`)
	f.usage("acme", "api_calls", date("2026-11-20T11:30:00Z"), "2") // its sync waits for the new connection
	december("2")
	get(map[string]any{"total": "19.5"})
	if !strings.Contains(f.logs.String(), "usage cache off") {
		t.Fatalf("no log of the lost listener:\n%s", f.logs.String())
	}
	if m := f.do("GET", "/metrics", adminToken, nil); !strings.Contains(string(m.body), "tally_api_usage_cache_up 1") {
		t.Fatalf("metrics: the cache is not back up:\n%s", m.body)
	}
}

// TestUsageCacheCoherentUnderWrites races readers against a writer that,
// like ingest, books usage and moves the partition's position in one
// transaction (in either order: ingest moves it first), without telling
// the API. The listener pauses after each position, so an answer whose
// as_of moved before its customer was forgotten would be seen. Every answer must hold all usage
// committed through its as_of (never claim more than it holds), and once
// the writer stops and the API has heard everything, every cached answer
// must equal the database.
func TestUsageCacheCoherentUnderWrites(t *testing.T) {
	t.Parallel()
	f := newFixtureAPI(t, nil, func(a *api.API) { api.SlowPositions(a, time.Millisecond) })
	ctx := context.Background()
	const customers = 12
	name := func(i int) string { return fmt.Sprintf("c%02d", i) }
	for i := range customers {
		if r := f.do("PUT", "/v1/customers/"+name(i), adminToken, map[string]any{"cadence": "monthly", "anchor_day": 1, "zone": "UTC"}); r.status != 201 {
			t.Fatalf("create %s: %d %s", name(i), r.status, r.body)
		}
		f.exec(`INSERT INTO ingest_customers (customer, topic, partition, first_seen) VALUES ($1, 'tally.meter-batches', 0, now())`, name(i))
	}
	f.exec(`INSERT INTO ingest_partitions (topic, partition, next_offset, applied_through) VALUES ('tally.meter-batches', 0, 0, '2026-11-20T00:00:00Z')`)

	// history[c] is customer c's total after each write, with the
	// position the write's transaction set.
	type point struct {
		at    time.Time
		total decimal.Decimal
	}
	var mu sync.Mutex
	history := map[string][]point{}
	stop := make(chan struct{})
	var wg sync.WaitGroup
	wg.Add(1)
	go func() { // the writer
		defer wg.Done()
		rng := rand.New(rand.NewPCG(1, 2))
		totals := map[string]decimal.Decimal{}
		seqs := map[string]int64{}
		at := date("2026-11-20T00:00:00Z")
		for n := 0; ; n++ {
			select {
			case <-stop:
				return
			default:
			}
			c := name(rng.IntN(customers))
			qty := amount.MustParse(fmt.Sprint(1 + rng.IntN(9)))
			seqs[c]++
			at = at.Add(time.Second)
			rec := ledger.Record{OperationID: uuid.Must(uuid.NewV7()),
				Stream: ledger.StreamKey{Producer: "w", Epoch: 1, Customer: c, Meter: "api_calls"},
				Seq:    seqs[c], Total: totals[c].Add(qty), OccurredAt: date("2026-11-10T12:00:00Z")}
			positionFirst := rng.IntN(2) == 0
			move := func(tx pgx.Tx) error {
				_, err := tx.Exec(ctx, `UPDATE ingest_partitions SET applied_through = $1 WHERE partition = 0`, at)
				return err
			}
			err := pgx.BeginFunc(ctx, f.pool, func(tx pgx.Tx) error {
				if positionFirst {
					if err := move(tx); err != nil {
						return err
					}
				}
				out, err := f.ledger.Apply(ctx, tx, []ledger.Record{rec})
				if err == nil && out[0].Kind != ledger.Applied {
					err = fmt.Errorf("outcome %v", out[0].Kind)
				}
				if err != nil || positionFirst {
					return err
				}
				return move(tx)
			})
			if err != nil {
				t.Errorf("write %d: %v", n, err)
				return
			}
			totals[c] = rec.Total
			mu.Lock()
			history[c] = append(history[c], point{at, rec.Total})
			mu.Unlock()
		}
	}()

	// Readers check each answer against the history: all usage through
	// as_of is in it.
	var reads, checked int
	var rmu sync.Mutex
	for r := range 4 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			rng := rand.New(rand.NewPCG(uint64(r), 7))
			for {
				select {
				case <-stop:
					return
				default:
				}
				c := name(rng.IntN(customers))
				res := f.do("GET", "/v1/customers/"+c+"/usage?meter=api_calls", adminToken, nil)
				var got struct {
					Total string    `json:"total"`
					AsOf  time.Time `json:"as_of"`
				}
				if err := json.Unmarshal(res.body, &got); err != nil || res.status != 200 {
					t.Errorf("%s: %d %s", c, res.status, res.body)
					return
				}
				total := amount.MustParse(got.Total)
				mu.Lock()
				want := decimal.Zero
				for _, p := range history[c] {
					if !p.at.After(got.AsOf) {
						want = p.total
					}
				}
				mu.Unlock()
				if total.LessThan(want) {
					t.Errorf("%s: total %s as of %s, but %s was committed through then", c, total, got.AsOf.Format(time.RFC3339), want)
					return
				}
				rmu.Lock()
				reads++
				if want.IsPositive() {
					checked++
				}
				rmu.Unlock()
			}
		}()
	}
	time.Sleep(2 * time.Second)
	close(stop)
	wg.Wait()
	if t.Failed() {
		return
	}
	f.sync()
	for i := range customers {
		c := name(i)
		var want decimal.Decimal
		if h := history[c]; len(h) > 0 {
			want = h[len(h)-1].total
		}
		got := f.do("GET", "/v1/customers/"+c+"/usage?meter=api_calls", adminToken, nil).json(t)
		if got["total"] != want.String() {
			t.Errorf("%s: cached total %v after the writes, database %s", c, got["total"], want)
		}
	}
	hits, misses := f.cacheCounts()
	t.Logf("%d reads (%d with usage through as_of to check), %d hits, %d misses", reads, checked, hits, misses)
	if hits == 0 || misses == 0 {
		t.Fatalf("hits %d misses %d: the race was not exercised", hits, misses)
	}
}

// TestForgedNotifications: anyone with a database login can NOTIFY the
// cache's channel. A forged position must not advance a cached answer's
// as_of (positions are read from the table, a notification only says that
// something changed), and a forged answer to that read is ignored.
func TestForgedNotifications(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	seedAcme(f)
	f.exec(`INSERT INTO ingest_customers (customer, topic, partition, first_seen) VALUES ('acme', 'tally.meter-batches', 0, now())`)
	f.exec(`INSERT INTO ingest_partitions (topic, partition, next_offset, applied_through) VALUES ('tally.meter-batches', 0, 10, '2026-11-20T11:59:50Z')`)
	asOf := func() any {
		t.Helper()
		return f.do("GET", "/v1/customers/acme/usage?meter=api_calls", adminToken, nil).json(t)["as_of"]
	}
	if got := asOf(); got != "2026-11-20T11:59:50Z" {
		t.Fatalf("as_of %v", got)
	}
	for _, forged := range []string{
		`{"topic":"tally.meter-batches","partition":0,"applied_through":"2100-01-01T00:00:00Z","deleted":false}`,
		`{"topic":"tally.meter-batches","partition":0,"applied_through":null,"deleted":true}`,
		`{"positions_read":"x"}`,
	} {
		f.exec(`SELECT pg_notify('tally_api_cache', $1)`, forged)
		if got := asOf(); got != "2026-11-20T11:59:50Z" {
			t.Fatalf("after a forged %s: as_of %v, want the table's 2026-11-20T11:59:50Z", forged, got)
		}
	}
	// A real move still advances it.
	f.exec(`UPDATE ingest_partitions SET applied_through = '2026-11-20T11:59:55Z'`)
	if got := asOf(); got != "2026-11-20T11:59:55Z" {
		t.Fatalf("after a real move: as_of %v", got)
	}
	if h, _ := f.cacheCounts(); h < 4 {
		t.Fatalf("%d hits: the cached answer was not exercised", h)
	}
}

// TestTruncateForgets: TRUNCATE fires no row or statement trigger of
// INSERT, UPDATE or DELETE; the cache hears of it all the same. A token
// removed by TRUNCATE api_tokens stops working, however long
// TokenCacheTTL is, and usage removed by TRUNCATE is not served.
func TestTruncateForgets(t *testing.T) {
	t.Parallel()
	f := newFixtureWith(t, func(c *api.Config) { c.TokenCacheTTL = time.Hour })
	seedAcme(f)
	tok := f.token("acme")
	if r := f.do("GET", "/v1/customers/acme", tok, nil); r.status != 200 {
		t.Fatalf("before: %d", r.status)
	}
	f.exec(`TRUNCATE api_tokens`)
	if r := f.do("GET", "/v1/customers/acme", tok, nil); r.status != 401 {
		t.Fatalf("after TRUNCATE api_tokens: %d, want 401", r.status)
	}
	total := func() any {
		t.Helper()
		return f.do("GET", "/v1/customers/acme/usage?meter=api_calls", adminToken, nil).json(t)["total"]
	}
	if got := total(); got != "18.5" {
		t.Fatalf("total %v", got)
	}
	total()
	f.exec(`TRUNCATE rollups, rollups_daily`)
	if got := total(); got != "0" {
		t.Fatalf("after TRUNCATE rollups: total %v, want 0", got)
	}
}

// metric reads one sample of /metrics.
func (f *fixture) metric(name string) float64 {
	f.t.Helper()
	m := f.do("GET", "/metrics", adminToken, nil)
	for _, line := range strings.Split(string(m.body), "\n") {
		if rest, ok := strings.CutPrefix(line, name+" "); ok {
			var v float64
			fmt.Sscan(rest, &v)
			return v
		}
	}
	f.t.Fatalf("no metric %s", name)
	return 0
}

// TestStuckListener: the API's change listener hangs while connected (a
// bug: it stops reading notifications). Postgres would keep every
// notification for it until the queue is full and every notifying commit
// — ingest's — fails. The API notices that the listener is behind: within
// its lease it stops trusting it (no cached answer, no token trusted past
// TokenCacheTTL), and past its limit it closes the listener's connection,
// so Postgres forgets it. Once the listener runs again, it reconnects.
func TestStuckListener(t *testing.T) {
	t.Parallel()
	var stuck atomic.Bool
	f := newFixtureAPI(t, func(c *api.Config) { c.TokenCacheTTL = time.Nanosecond }, func(a *api.API) {
		api.ListenerTimings(a, 50*time.Millisecond, 2*time.Second, 5*time.Second)
		api.HoldListener(a, func() {
			for stuck.Load() {
				time.Sleep(5 * time.Millisecond)
			}
		})
	})
	t.Cleanup(func() { stuck.Store(false) }) // before the fixture stops Run
	ctx := context.Background()
	seedAcme(f)
	tok := f.token("acme")
	total := func() any {
		t.Helper()
		return f.do("GET", "/v1/customers/acme/usage?meter=api_calls", tok, nil).json(t)["total"]
	}
	if got := total(); got != "18.5" {
		t.Fatalf("usage %v, want 18.5", got)
	}
	hits, _ := f.cacheCounts()
	if got := total(); got != "18.5" {
		t.Fatalf("usage read again %v, want 18.5", got)
	}
	if h, _ := f.cacheCounts(); h != hits+1 {
		t.Fatalf("the second read before the listener hangs was not served from the cache (hits %d, then %d)", hits, h)
	}
	listeners := func() int {
		var n int
		if err := f.pool.QueryRow(ctx, `SELECT count(*) FROM pg_stat_activity WHERE application_name = 'tally-api-usage-watch' AND datname = current_database()`).Scan(&n); err != nil {
			t.Fatal(err)
		}
		return n
	}
	for deadline := time.Now().Add(30 * time.Second); listeners() != 1; time.Sleep(10 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("%d listening connections", listeners())
		}
	}

	stuck.Store(true)
	hung := time.Now()
	// Behind the API's back, unheard: usage booked and the token revoked.
	rec := ledger.Record{OperationID: uuid.Must(uuid.NewV7()),
		Stream: ledger.StreamKey{Producer: "test", Epoch: 1, Customer: "acme", Meter: "api_calls"},
		Seq:    100, Total: amount.MustParse("1000"), OccurredAt: date("2026-11-20T11:00:00Z")}
	if err := pgx.BeginFunc(ctx, f.pool, func(tx pgx.Tx) error {
		_, err := f.ledger.Apply(ctx, tx, []ledger.Record{rec})
		return err
	}); err != nil {
		t.Fatal(err)
	}
	var stale int
	var fresh any
	for {
		fresh = f.do("GET", "/v1/customers/acme/usage?meter=api_calls", adminToken, nil).json(t)["total"]
		if fresh != "18.5" {
			break
		}
		stale++
		if time.Since(hung) > 30*time.Second {
			t.Fatal("the cached answer was served 30s after the listener hung")
		}
		time.Sleep(10 * time.Millisecond)
	}
	t.Logf("the new usage was read %s after the listener hung (%d stale answers before; lease 2s)", time.Since(hung).Round(time.Millisecond), stale)
	toks, _ := tokens.List(ctx, f.pool, "acme")
	if _, err := tokens.Revoke(ctx, f.pool, toks[0].ID, f.clock()); err != nil {
		t.Fatal(err)
	}
	if r := f.do("GET", "/v1/customers/acme", tok, nil); r.status != 401 {
		t.Fatalf("a revoked token while the listener hangs: %d, want 401", r.status)
	}

	// Past the limit, the listener's connection is closed.
	for listeners() != 0 {
		if time.Since(hung) > 60*time.Second {
			t.Fatal("the hung listener's connection was still open after 60s")
		}
		time.Sleep(20 * time.Millisecond)
	}
	t.Logf("the hung listener's connection was closed %s after it hung (limit 5s)", time.Since(hung).Round(time.Millisecond))
	if api.UsageWatchUp(f.h) {
		t.Fatal("the cache is up with its listener dropped")
	}
	if got := f.metric("tally_api_usage_watch_dropped_total"); got < 1 {
		t.Fatalf("dropped_total %v", got)
	}
	if !strings.Contains(f.logs.String(), "the change listener is behind") {
		t.Fatalf("no log line:\n%s", f.logs.String())
	}

	// Running again: it reconnects, and the cache serves again.
	stuck.Store(false)
	for deadline := time.Now().Add(30 * time.Second); !api.UsageWatchUp(f.h); time.Sleep(10 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatal("the listener did not come back")
		}
	}
	f.sync()
	h0, _ := f.cacheCounts()
	f.do("GET", "/v1/customers/acme/usage?meter=api_calls", adminToken, nil)
	if got := f.do("GET", "/v1/customers/acme/usage?meter=api_calls", adminToken, nil).json(t)["total"]; got != fresh {
		t.Fatalf("total %v after the listener came back", got)
	}
	if h, _ := f.cacheCounts(); h <= h0 {
		t.Fatal("no hit after the listener came back")
	}
	if got := f.metric("tally_postgres_notify_queue_usage"); got < 0 || got > 1 {
		t.Fatalf("queue usage %v", got)
	}
}

// TestNotifyQueueFilling: past tally.notify_queue_limit the triggers stop
// notifying (so that a full queue never fails ingest's commits); the API
// stops using its caches from half that limit on, and uses them again only
// after the queue has drained, emptied first.
func TestNotifyQueueFilling(t *testing.T) {
	t.Parallel()
	f := newFixtureAPI(t, nil, func(a *api.API) {
		api.ListenerTimings(a, 50*time.Millisecond, 3*time.Second, time.Minute)
	})
	ctx := context.Background()
	seedAcme(f)
	hits := func() int { h, _ := f.cacheCounts(); return h }
	get := func() { f.do("GET", "/v1/customers/acme/usage?meter=api_calls", adminToken, nil) }
	get()
	get()
	if hits() != 1 {
		t.Fatal("no hit")
	}
	setLimit := func(sql string) {
		t.Helper()
		var db string
		if err := f.pool.QueryRow(ctx, `SELECT current_database()`).Scan(&db); err != nil {
			t.Fatal(err)
		}
		if _, err := f.pool.Exec(ctx, fmt.Sprintf(sql, pgx.Identifier{db}.Sanitize())); err != nil {
			t.Fatal(err)
		}
		f.pool.Reset() // sessions read the setting when they start
	}
	// A limit of 0: the queue is "full" at any usage.
	setLimit(`ALTER DATABASE %s SET tally.notify_queue_limit = 0`)
	for deadline := time.Now().Add(30 * time.Second); !strings.Contains(f.logs.String(), "notification queue is filling"); time.Sleep(10 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatal("the API did not notice the queue filling")
		}
	}
	h := hits()
	get()
	get()
	if hits() != h {
		t.Fatal("a cached answer was served while notifications may be skipped")
	}
	// Drained: after a lease, the cache is used again.
	setLimit(`ALTER DATABASE %s RESET tally.notify_queue_limit`)
	for deadline := time.Now().Add(30 * time.Second); !strings.Contains(f.logs.String(), "notification queue has drained"); time.Sleep(10 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatal("the API did not notice the queue drained")
		}
	}
	get()
	get()
	if hits() != h+1 {
		t.Fatalf("hits %d, want %d once the queue drained", hits(), h+1)
	}
}

// TestSkippedNotificationsCommittedLate: a transaction that wrote while
// the notification queue was filling sent no notifications, and commits
// after the queue has drained (a long ingest batch, a psql session). The
// API must not serve an answer, nor trust a token, that the commit made
// stale: its cache stays off until every transaction that may have
// skipped its notifications has ended.
func TestSkippedNotificationsCommittedLate(t *testing.T) {
	t.Parallel()
	f := newFixtureAPI(t, func(c *api.Config) { c.TokenCacheTTL = time.Nanosecond }, func(a *api.API) {
		api.ListenerTimings(a, 50*time.Millisecond, time.Second, time.Minute)
	})
	ctx := context.Background()
	seedAcme(f)
	tok := f.token("acme")
	total := func() any {
		t.Helper()
		return f.do("GET", "/v1/customers/acme/usage?meter=api_calls", adminToken, nil).json(t)["total"]
	}
	setLimit := func(sql string) {
		t.Helper()
		var db string
		if err := f.pool.QueryRow(ctx, `SELECT current_database()`).Scan(&db); err != nil {
			t.Fatal(err)
		}
		if _, err := f.pool.Exec(ctx, fmt.Sprintf(sql, pgx.Identifier{db}.Sanitize())); err != nil {
			t.Fatal(err)
		}
		f.pool.Reset() // sessions read the setting when they start
	}
	waitLog := func(what string, msgs ...string) {
		t.Helper()
		for deadline := time.Now().Add(30 * time.Second); ; time.Sleep(10 * time.Millisecond) {
			for _, s := range msgs {
				if strings.Contains(f.logs.String(), s) {
					return
				}
			}
			if time.Now().After(deadline) {
				t.Fatalf("the API did not log that %s:\n%s", what, f.logs.String())
			}
		}
	}

	setLimit(`ALTER DATABASE %s SET tally.notify_queue_limit = 0`)
	waitLog("the queue is filling", "notification queue is filling")
	// A writer's transaction while the triggers skip: usage and a
	// revocation, neither notified.
	tx, err := f.pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer tx.Rollback(ctx)
	rec := ledger.Record{OperationID: uuid.Must(uuid.NewV7()),
		Stream: ledger.StreamKey{Producer: "late", Epoch: 1, Customer: "acme", Meter: "api_calls"},
		Seq:    1, Total: amount.MustParse("1000"), OccurredAt: date("2026-11-20T11:00:00Z")}
	if _, err := f.ledger.Apply(ctx, tx, []ledger.Record{rec}); err != nil {
		t.Fatal(err)
	}
	if _, err := tx.Exec(ctx, `UPDATE api_tokens SET revoked_at = now() WHERE customer = 'acme'`); err != nil {
		t.Fatal(err)
	}

	// The queue drains while the transaction is still open.
	setLimit(`ALTER DATABASE %s RESET tally.notify_queue_limit`)
	waitLog("the queue drained", "notification queue has drained", "waiting for the transactions")
	for range 2 {
		if got := total(); got != "18.5" {
			t.Fatalf("total %v before the commit, want 18.5", got)
		}
		if r := f.do("GET", "/v1/customers/acme", tok, nil); r.status != 200 {
			t.Fatalf("the token before the commit: %d", r.status)
		}
	}
	if strings.Contains(f.logs.String(), "notification queue has drained") {
		t.Fatal("the cache came back on while a transaction that skipped its notifications was open")
	}
	if err := tx.Commit(ctx); err != nil {
		t.Fatal(err)
	}
	f.sync()
	if got := total(); got != "1018.5" {
		t.Fatalf("total %v after the commit, want 1018.5", got)
	}
	if r := f.do("GET", "/v1/customers/acme", tok, nil); r.status != 401 {
		t.Fatalf("a token revoked by the commit: %d, want 401", r.status)
	}
	// And the cache comes back. It may have come back before the reads
	// above (they then filled it), so the first read here may already hit;
	// the second one must, with the committed answer.
	waitLog("the queue drained", "notification queue has drained")
	hits := func() int { h, _ := f.cacheCounts(); return h }
	total()
	h := hits()
	if got := total(); got != "1018.5" {
		t.Fatalf("total %v from the cache, want 1018.5", got)
	}
	if hits() != h+1 {
		t.Fatalf("hits %d, want %d once the transactions ended", hits(), h+1)
	}
}

// TestNotifyQueueLimitOfAnotherRole: tally.notify_queue_limit may be set
// per database or role (docs/api.md); a writer whose role has a lower
// limit than the API's skips its notifications while the API, reading its
// own, still trusts its cache. The API goes by the lowest limit set for
// any role in its database.
func TestNotifyQueueLimitOfAnotherRole(t *testing.T) {
	t.Parallel()
	f := newFixtureAPI(t, nil, func(a *api.API) {
		api.ListenerTimings(a, 50*time.Millisecond, 3*time.Second, time.Minute)
	})
	ctx := context.Background()
	seedAcme(f)
	total := func() any {
		t.Helper()
		return f.do("GET", "/v1/customers/acme/usage?meter=api_calls", adminToken, nil).json(t)["total"]
	}
	total()
	if got := total(); got != "18.5" {
		t.Fatalf("total %v", got)
	}
	var db string
	if err := f.pool.QueryRow(ctx, `SELECT current_database()`).Scan(&db); err != nil {
		t.Fatal(err)
	}
	role := "tally_writer_" + strings.ReplaceAll(uuid.NewString(), "-", "")[:12]
	for _, sql := range []string{
		`CREATE ROLE %[1]s LOGIN`,
		`GRANT ALL ON ALL TABLES IN SCHEMA public TO %[1]s`,
		`GRANT ALL ON ALL SEQUENCES IN SCHEMA public TO %[1]s`,
		`ALTER ROLE %[1]s IN DATABASE %[2]s SET tally.notify_queue_limit = 0`,
	} {
		if _, err := f.pool.Exec(ctx, fmt.Sprintf(sql, pgx.Identifier{role}.Sanitize(), pgx.Identifier{db}.Sanitize())); err != nil {
			t.Fatalf("%s: %v", sql, err)
		}
	}
	t.Cleanup(func() {
		for _, sql := range []string{`DROP OWNED BY %s`, `DROP ROLE %s`} {
			if _, err := f.pool.Exec(ctx, fmt.Sprintf(sql, pgx.Identifier{role}.Sanitize())); err != nil {
				t.Errorf("%s: %v", sql, err)
			}
		}
	})
	// The API notices that notifications may be skipped.
	for deadline := time.Now().Add(30 * time.Second); !strings.Contains(f.logs.String(), "notification queue is filling"); time.Sleep(10 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatal("the API did not notice that a role's limit makes the triggers skip")
		}
	}
	// The writer's usage, unnotified, is read.
	cfg := f.pool.Config().ConnConfig.Copy()
	cfg.User = role
	conn, err := pgx.ConnectConfig(ctx, cfg)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(ctx)
	rec := ledger.Record{OperationID: uuid.Must(uuid.NewV7()),
		Stream: ledger.StreamKey{Producer: "writer", Epoch: 1, Customer: "acme", Meter: "api_calls"},
		Seq:    1, Total: amount.MustParse("1000"), OccurredAt: date("2026-11-20T11:00:00Z")}
	if err := pgx.BeginFunc(ctx, conn, func(tx pgx.Tx) error {
		_, err := f.ledger.Apply(ctx, tx, []ledger.Record{rec})
		return err
	}); err != nil {
		t.Fatal(err)
	}
	f.sync()
	if got := total(); got != "1018.5" {
		t.Fatalf("total %v after the writer's commit, want 1018.5", got)
	}
}
