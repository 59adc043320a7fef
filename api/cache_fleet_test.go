package api_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/shopspring/decimal"

	"github.com/tally-ledger/tally/amount"
	"github.com/tally-ledger/tally/api"
	"github.com/tally-ledger/tally/ingest/wire"
	"github.com/tally-ledger/tally/ledger"
)

// listenerPIDs are the backends of the change listeners on f's database.
func (f *fixture) listenerPIDs() []uint32 {
	f.t.Helper()
	rows, err := f.pool.Query(context.Background(), `SELECT pid FROM pg_stat_activity
		WHERE application_name = 'tally-api-usage-watch' AND datname = current_database() ORDER BY pid`)
	if err != nil {
		f.t.Fatal(err)
	}
	pids, err := pgx.CollectRows(rows, pgx.RowTo[uint32])
	if err != nil {
		f.t.Fatal(err)
	}
	return pids
}

// TestCacheAcrossProcesses: two API processes on one database. Every kind
// of write that changes a usage answer, made through the other process
// (B) or behind both (ledger.Apply, SQL), reaches an answer process A had
// cached as soon as A has heard of the commit; also when A's listening
// connection is killed between the fill and the write (A may have missed
// the notification, and must forget everything it held). A token revoked
// through B stops working in A the same way.
func TestCacheAcrossProcesses(t *testing.T) {
	t.Parallel()
	short := func(c *api.Config) { c.TokenCacheTTL = time.Nanosecond }
	// base holds the database; B writes; each case reads through a fresh
	// process A (a listener killed again and again backs off for longer).
	base := newFixtureWith(t, short)
	b := base.peer(short, nil)
	ctx := context.Background()
	// newA starts a process A, and returns it with a function that ends
	// its listening connection (no other's).
	newA := func() (*fixture, func()) {
		t.Helper()
		before := map[uint32]bool{}
		for _, p := range base.listenerPIDs() {
			before[p] = true
		}
		a := base.peer(short, nil)
		var pid uint32
		for _, p := range base.listenerPIDs() {
			if !before[p] {
				pid = p
			}
		}
		if pid == 0 {
			t.Fatal("A's listener not found")
		}
		return a, func() {
			t.Helper()
			var ok bool
			if err := base.pool.QueryRow(ctx, `SELECT pg_terminate_backend($1)`, pid).Scan(&ok); err != nil || !ok {
				t.Fatalf("killing A's listener: %v %v", ok, err)
			}
		}
	}
	apply := func(recs ...ledger.Record) {
		t.Helper()
		if err := pgx.BeginFunc(ctx, base.pool, func(tx pgx.Tx) error {
			out, err := base.ledger.Apply(ctx, tx, recs)
			for _, o := range out {
				if err == nil && o.Kind != ledger.Applied {
					err = fmt.Errorf("outcome %v", o.Kind)
				}
			}
			return err
		}); err != nil {
			t.Fatal(err)
		}
	}
	ok := func(r response, what string) {
		t.Helper()
		if r.status/100 != 2 {
			t.Fatalf("%s: %d %s", what, r.status, r.body)
		}
	}
	ok(b.do("PUT", "/v1/meters/seats", adminToken, map[string]any{"kind": "gauge"}), "declare seats")
	ok(b.do("PUT", "/v1/meters/mau", adminToken, map[string]any{"kind": "unique"}), "declare mau")
	base.exec(`INSERT INTO ingest_partitions (topic, partition, next_offset, applied_through) VALUES
		('tally.meter-batches', 0, 10, '2026-11-20T11:00:00Z'), ('tally.meter-batches', 1, 10, '2026-11-20T11:30:00Z')`)

	counter := func(customer string, seq int64, total string) ledger.Record {
		return ledger.Record{OperationID: uuid.Must(uuid.NewV7()),
			Stream: ledger.StreamKey{Producer: "p", Epoch: 1, Customer: customer, Meter: "api_calls"},
			Seq:    seq, Total: amount.MustParse(total), OccurredAt: date("2026-11-20T10:00:00Z")}
	}
	type write struct {
		name  string
		setup func(c string) // before the fill
		url   string         // A's answer, of customer %[1]s
		field func(m map[string]any) any
		write func(c string)
		want  any
	}
	total := func(m map[string]any) any { return m["total"] }
	writes := []write{
		{name: "record", url: "/v1/customers/%s/usage?meter=api_calls", field: total,
			setup: func(c string) { apply(counter(c, 1, "5")) },
			write: func(c string) { apply(counter(c, 2, "12")) }, want: "12"},
		{name: "adjustment through B", url: "/v1/customers/%s/usage?meter=api_calls", field: total,
			setup: func(c string) { apply(counter(c, 1, "5")) },
			write: func(c string) {
				ok(b.do("POST", "/v1/adjustments", adminToken, map[string]any{"operation_id": uuid.NewString(), "customer": c,
					"meter": "api_calls", "quantity": "-2", "reason": "credit", "actor": "ops"}), "adjustment")
			}, want: "3"},
		{name: "close through B", url: "/v1/customers/%s/usage?meter=api_calls&period=2026-10-01",
			field: func(m map[string]any) any { return m["period"].(map[string]any)["state"] },
			setup: func(c string) {},
			write: func(c string) {
				ok(b.do("POST", "/v1/customers/"+c+"/periods/2026-10-01/close", adminToken,
					map[string]any{"force": true, "reason": "test", "actor": "ops"}), "close")
			}, want: "closed"},
		{name: "gauge reading", url: "/v1/customers/%s/usage?meter=seats",
			field: func(m map[string]any) any { return m["gauge"].(map[string]any)["latest"] },
			setup: func(c string) {},
			write: func(c string) {
				apply(ledger.Record{OperationID: uuid.Must(uuid.NewV7()), Stream: ledger.StreamKey{Producer: "p", Epoch: 1, Customer: c, Meter: "seats"},
					Seq: 1, OccurredAt: date("2026-11-20T10:00:00Z"), Shape: ledger.Gauge, Level: decimal.NewFromInt(4)})
			}, want: "4"},
		{name: "unique reading", url: "/v1/customers/%s/usage?meter=mau", field: total,
			setup: func(c string) {},
			write: func(c string) {
				apply(ledger.Record{OperationID: uuid.Must(uuid.NewV7()), Stream: ledger.StreamKey{Producer: "p", Epoch: 1, Customer: c, Meter: "mau"},
					Seq: 1, OccurredAt: date("2026-11-20T10:00:00Z"), Shape: ledger.Unique, Member: "u1"})
			}, want: "1"},
		{name: "meter declared through B", url: "/v1/customers/%[1]s/usage?meter=late_%[1]s",
			field: func(m map[string]any) any { return m["kind"] },
			setup: func(c string) {
				ok(b.do("PUT", "/v1/meters/late_"+c, adminToken, map[string]any{"kind": "counter"}), "declare late")
			},
			write: func(c string) {
				ok(b.do("PUT", "/v1/meters/late_"+c, adminToken, map[string]any{"kind": "unique"}), "redeclare late")
			}, want: "unique"},
		{name: "dead letter replayed through B", url: "/v1/customers/%s/usage?meter=api_calls", field: total,
			setup: func(c string) { apply(counter(c, 1, "5")) },
			write: func(c string) {
				msg, err := wire.Encode(wire.Batch{Schema: wire.Schema, BatchID: uuid.Must(uuid.NewV7()), Producer: "q", Epoch: 1,
					SentAt: date("2026-11-20T11:00:00Z"), Records: []wire.Record{{OperationID: uuid.Must(uuid.NewV7()), Customer: c,
						Meter: "api_calls", Seq: 1, Total: decimal.RequireFromString("40"), OccurredAt: date("2026-11-20T10:00:00Z")}}})
				if err != nil {
					t.Fatal(err)
				}
				id := uuid.Must(uuid.NewV7())
				if _, err := base.pool.Exec(ctx, `INSERT INTO dead_letters (id, topic, partition, "offset", reason, detail, key, raw, created_at)
					VALUES ($1, 'tally.meter-batches', 0, 7, 'clock_skew', 'later', $2, $3, '2026-11-20T11:00:00Z')`, id, c, msg); err != nil {
					t.Fatal(err)
				}
				ok(b.do("POST", "/v1/dead-letters/"+id.String()+"/replay", adminToken, nil), "replay")
			}, want: "45"},
		{name: "customer moved partitions", url: "/v1/customers/%s/usage?meter=api_calls",
			field: func(m map[string]any) any { return m["as_of"] },
			setup: func(c string) {
				if _, err := base.pool.Exec(ctx, `INSERT INTO ingest_customers (customer, topic, partition, first_seen) VALUES ($1, 'tally.meter-batches', 0, now())`, c); err != nil {
					t.Fatal(err)
				}
			},
			write: func(c string) {
				if _, err := base.pool.Exec(ctx, `UPDATE ingest_customers SET partition = 1 WHERE customer = $1`, c); err != nil {
					t.Fatal(err)
				}
			}, want: "2026-11-20T11:30:00Z"},
	}
	n := 0
	for _, w := range writes {
		for _, kill := range []bool{false, true} {
			n++
			c := fmt.Sprintf("c%02d", n)
			a, killA := newA()
			what := fmt.Sprintf("%s (A's listener killed: %v)", w.name, kill)
			ok(b.do("PUT", "/v1/customers/"+c, adminToken, map[string]any{"cadence": "monthly", "anchor_day": 1, "zone": "UTC"}), "create "+c)
			w.setup(c)
			a.sync()
			url := fmt.Sprintf(w.url, c)
			before := w.field(a.do("GET", url, adminToken, nil).json(t))
			h0, _ := a.cacheCounts()
			if got := w.field(a.do("GET", url, adminToken, nil).json(t)); got != before {
				t.Fatalf("%s: %v, then %v", what, before, got)
			}
			if h, _ := a.cacheCounts(); h != h0+1 {
				t.Fatalf("%s: A's answer was not cached", what)
			}
			if before == w.want {
				t.Fatalf("%s: %v before the write", what, before)
			}
			if kill {
				killA()
			}
			w.write(c)
			a.sync() // A has heard every commit so far (after reconnecting)
			if got := w.field(a.do("GET", url, adminToken, nil).json(t)); got != w.want {
				t.Errorf("%s: A answers %v, want %v", what, got, w.want)
			}
		}
	}

	// Tokens: cached by A, revoked through B.
	for _, kill := range []bool{false, true} {
		a, killA := newA()
		tok := a.token("c01")
		for range 2 {
			ok(a.do("GET", "/v1/customers/c01", tok, nil), "token")
		}
		if kill {
			killA()
		}
		toks := b.do("GET", "/v1/tokens?customer=c01", adminToken, nil).json(t)["items"].([]any)
		for _, it := range toks {
			m := it.(map[string]any)
			if m["revoked_at"] == nil {
				ok(b.do("POST", "/v1/tokens/"+m["id"].(string)+"/revoke", adminToken, nil), "revoke")
			}
		}
		a.sync()
		if r := a.do("GET", "/v1/customers/c01", tok, nil); r.status != 401 {
			t.Errorf("a token revoked through B (A's listener killed: %v): A answers %d", kill, r.status)
		}
	}
}

// TestHandFixesOfKindsForget: a gauge's or unique meter's answer is read
// from gauge_days, gauge_points, gauge_adjustments and unique_counts; a
// hand-made fix in psql (a DELETE, a TRUNCATE, an adjustment inserted)
// changes it like a reading does, and a cached answer must not outlive
// it. The answer of a process without a cache is the reference.
func TestHandFixesOfKindsForget(t *testing.T) {
	t.Parallel()
	a := newFixture(t)
	fresh := a.peer(func(c *api.Config) { c.UsageCacheTTL = -1 }, nil)
	ctx := context.Background()
	a.setNow(date("2026-12-10T12:00:00Z"))
	for _, m := range []struct{ meter, kind string }{{"seats", "gauge"}, {"mau", "unique"}} {
		if r := a.do("PUT", "/v1/meters/"+m.meter, adminToken, map[string]any{"kind": m.kind}); r.status != 200 {
			t.Fatalf("declare %s: %d %s", m.meter, r.status, r.body)
		}
	}
	if r := a.do("PUT", "/v1/customers/acme", adminToken, map[string]any{"cadence": "monthly", "anchor_day": 1, "zone": "UTC"}); r.status != 201 {
		t.Fatalf("create acme: %d %s", r.status, r.body)
	}
	stream := func(meter string) ledger.StreamKey {
		return ledger.StreamKey{Producer: "p", Epoch: 1, Customer: "acme", Meter: meter}
	}
	if err := pgx.BeginFunc(ctx, a.pool, func(tx pgx.Tx) error {
		_, err := a.ledger.Apply(ctx, tx, []ledger.Record{
			{OperationID: uuid.Must(uuid.NewV7()), Stream: stream("seats"), Seq: 1, OccurredAt: date("2026-12-02T00:00:00Z"), Shape: ledger.Gauge, Level: decimal.NewFromInt(3)},
			{OperationID: uuid.Must(uuid.NewV7()), Stream: stream("seats"), Seq: 2, OccurredAt: date("2026-12-05T00:00:00Z"), Shape: ledger.Gauge, Level: decimal.NewFromInt(5)},
			{OperationID: uuid.Must(uuid.NewV7()), Stream: stream("mau"), Seq: 1, OccurredAt: date("2026-12-02T00:00:00Z"), Shape: ledger.Unique, Member: "u1"},
			{OperationID: uuid.Must(uuid.NewV7()), Stream: stream("mau"), Seq: 2, OccurredAt: date("2026-12-03T00:00:00Z"), Shape: ledger.Unique, Member: "u2"},
		})
		return err
	}); err != nil {
		t.Fatal(err)
	}
	a.sync()
	const url = "/v1/customers/acme/usage"
	for _, fix := range []string{
		`INSERT INTO gauge_adjustments (id, customer, meter, period_start, prior_period, unit_seconds, operation_id, created_at)
			VALUES (gen_random_uuid(), 'acme', 'seats', '2026-12-01T00:00:00Z', '2026-11-01T00:00:00Z', 3600, gen_random_uuid(), now())`,
		`UPDATE gauge_adjustments SET unit_seconds = 7200`,
		`DELETE FROM gauge_adjustments`,
		`DELETE FROM gauge_days WHERE day_start >= '2026-12-05T00:00:00Z'`,
		`DELETE FROM unique_counts WHERE per_day`,
		`TRUNCATE unique_counts`,
		`TRUNCATE gauge_days`,
	} {
		want := string(fresh.do("GET", url, adminToken, nil).body)
		a.do("GET", url, adminToken, nil)
		h0, _ := a.cacheCounts()
		if got := string(a.do("GET", url, adminToken, nil).body); got != want {
			t.Fatalf("before %s:\ncached %s\nfresh  %s", fix, got, want)
		}
		if h, _ := a.cacheCounts(); h != h0+1 {
			t.Fatalf("before %s: not cached", fix)
		}
		a.exec(fix) // and waits until A has heard of the commit
		want = string(fresh.do("GET", url, adminToken, nil).body)
		if got := string(a.do("GET", url, adminToken, nil).body); got != want {
			t.Errorf("after %s:\ncached %s\nfresh  %s", fix, got, want)
		}
	}
}
