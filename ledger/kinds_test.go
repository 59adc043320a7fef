package ledger_test

import (
	"context"
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/tally-ledger/tally/amount"
	"github.com/tally-ledger/tally/ledger"
	"github.com/tally-ledger/tally/periods"
)

func (f *fixture) declare(meter string, kind ledger.MeterKind) error {
	f.t.Helper()
	return pgx.BeginFunc(context.Background(), f.pool, func(tx pgx.Tx) error {
		_, err := ledger.DeclareMeter(context.Background(), tx, ledger.Meter{Meter: meter, Kind: kind, Unit: "seat"}, f.now)
		return err
	})
}

func (b recBuilder) level(seq int64, level string, at time.Time) ledger.Record {
	r := b.rec(seq, "0", at)
	r.Total, r.Shape, r.Level = amount.MustParse("0"), ledger.Gauge, amount.MustParse(level)
	return r
}

func (b recBuilder) member(seq int64, member string, at time.Time) ledger.Record {
	r := b.rec(seq, "0", at)
	r.Shape, r.Member = ledger.Unique, member
	return r
}

func (f *fixture) gauge(customer, meter, period string) ledger.GaugeUsage {
	f.t.Helper()
	ctx := context.Background()
	sch, err := periods.Store{}.Schedule(ctx, f.pool, customer)
	if err != nil {
		f.t.Fatal(err)
	}
	p, err := sch.Resolve(period, f.now)
	if err != nil {
		f.t.Fatal(err)
	}
	u, err := ledger.ReadGauge(ctx, f.pool, customer, meter, p, f.now)
	if err != nil {
		f.t.Fatal(err)
	}
	return u
}

// A meter's kind is fixed once it has usage; unit and description are not.
func TestDeclareMeterKindFixedOnceUsed(t *testing.T) {
	f := newFixture(t)
	if err := f.declare("seats", ledger.Counter); err != nil {
		t.Fatal(err)
	}
	if err := f.declare("seats", ledger.Gauge); err != nil {
		t.Fatalf("no usage yet: the kind may change: %v", err)
	}
	b := recBuilder{"p", 1, "acme", "seats"}
	if got := kinds(f.apply(b.level(1, "3", f.now.Add(-time.Hour)))); got != "applied" {
		t.Fatalf("outcome %s", got)
	}
	err := f.declare("seats", ledger.Unique)
	var inUse ledger.KindInUseError
	if !errors.As(err, &inUse) || inUse.Kind != ledger.Gauge || inUse.Proposed != ledger.Unique {
		t.Fatalf("changing a used gauge into a unique: %v, want KindInUseError", err)
	}
	if err := f.declare("seats", ledger.Gauge); err != nil {
		t.Fatalf("same kind, new unit: %v", err)
	}
	// A used counter cannot become a gauge either.
	c := recBuilder{"p", 1, "acme", "calls"}
	f.apply(c.rec(1, "5", f.now.Add(-time.Hour)))
	if err := f.declare("calls", ledger.Gauge); !errors.As(err, &inUse) || inUse.Kind != ledger.Counter {
		t.Fatalf("changing a used counter: %v", err)
	}
	if err := f.declare("Bad meter", ledger.Gauge); err == nil {
		t.Fatal("a bad meter id was accepted")
	}
}

// A record whose shape is not its meter's kind is rejected with its own
// reason; the batch's other records still apply.
func TestKindMismatchIsRejected(t *testing.T) {
	f := newFixture(t)
	if err := f.declare("seats", ledger.Gauge); err != nil {
		t.Fatal(err)
	}
	if err := f.declare("mau", ledger.Unique); err != nil {
		t.Fatal(err)
	}
	at := f.now.Add(-time.Hour)
	out := f.apply(
		recBuilder{"p", 1, "acme", "seats"}.rec(1, "5", at),
		recBuilder{"p", 1, "acme", "seats"}.level(1, "5", at),
		recBuilder{"p", 1, "acme", "calls"}.level(1, "5", at),
		recBuilder{"p", 1, "acme", "mau"}.level(1, "5", at),
		recBuilder{"p", 1, "acme", "mau"}.member(1, "u1", at),
		recBuilder{"p", 1, "acme", "calls"}.rec(1, "5", at),
	)
	want := "rejected(meter_kind_mismatch) applied rejected(meter_kind_mismatch) rejected(meter_kind_mismatch) applied applied"
	if got := kinds(out); got != want {
		t.Fatalf("outcomes\n got %s\nwant %s", got, want)
	}
}

// Seats: two streams, a level across a period boundary, a late reading, a
// final, and a newer epoch.
func TestGaugeAggregatesExample(t *testing.T) {
	f := newFixture(t)
	f.now = time.Date(2026, 12, 2, 0, 0, 0, 0, time.UTC)
	if err := f.declare("seats", ledger.Gauge); err != nil {
		t.Fatal(err)
	}
	a := recBuilder{"gw-a", 1, "acme", "seats"}
	b := recBuilder{"gw-b", 1, "acme", "seats"}
	nov30 := time.Date(2026, 11, 30, 0, 0, 0, 0, time.UTC)
	got := kinds(f.apply(
		a.level(1, "10", nov30),                                    // 10 from Nov 30 00:00
		b.level(1, "5", nov30.Add(12*time.Hour)),                   // +5 from 12:00
		a.level(3, "4", nov30.Add(36*time.Hour)),                   // a: 4 from Dec 1 12:00 (seq 2 missing)
		recWrap(b.level(2, "0", nov30.Add(30*time.Hour))).finalR(), // b ends Dec 1 06:00
	))
	if got != "applied applied applied applied" {
		t.Fatalf("outcomes %s", got)
	}
	nov := f.gauge("acme", "seats", "2026-11-01")
	// Nov 30: 10 for 12h, 15 for 12h.
	if nov.Max.String() != "15" || nov.Latest.String() != "15" || nov.UnitSeconds.String() != "1080000" {
		t.Fatalf("november %+v", nov)
	}
	// Seq 2 arrives late: a was 20 from Nov 30 18:00 to Dec 1 12:00.
	if got := kinds(f.apply(a.level(2, "20", nov30.Add(18*time.Hour)))); got != "late_fill" {
		t.Fatalf("late reading: %s", got)
	}
	nov = f.gauge("acme", "seats", "2026-11-01")
	// 10×12h + 15×6h + 25×6h = 432000+324000+540000
	if nov.Max.String() != "25" || nov.Latest.String() != "25" || nov.UnitSeconds.String() != "1296000" {
		t.Fatalf("november after the late reading %+v", nov)
	}
	dec := f.gauge("acme", "seats", "2026-12-01")
	// Dec 1: 25 for 6h, 20 for 6h (b final), 4 for 12h, until now (Dec 2 00:00).
	if dec.Max.String() != "25" || dec.Latest.String() != "4" || dec.UnitSeconds.String() != "1144800" || dec.Average.String() != "13.25" {
		t.Fatalf("december %+v", dec)
	}
	// A new epoch of gw-a ends epoch 1's level at its first reading.
	a2 := recBuilder{"gw-a", 2, "acme", "seats"}
	f.apply(a2.level(1, "1", nov30.Add(42*time.Hour))) // Dec 1 18:00
	dec = f.gauge("acme", "seats", "2026-12-01")
	// ... 4 for 6h then 1 for 6h.
	if dec.Latest.String() != "1" || dec.UnitSeconds.String() != "1080000" {
		t.Fatalf("december after a new epoch %+v", dec)
	}
}

func (r recWrap) finalR() ledger.Record { r.Final = true; return ledger.Record(r) }

type recWrap ledger.Record

// A new gauge or unique record reusing a recorded operation id of another
// stream is a conflict, found though new records' ids are not looked up
// first (the attempt is undone and the batch applied again).
func TestKindsOperationIDReusedAcrossStreams(t *testing.T) {
	f := newFixture(t)
	if err := f.declare("seats", ledger.Gauge); err != nil {
		t.Fatal(err)
	}
	if err := f.declare("mau", ledger.Unique); err != nil {
		t.Fatal(err)
	}
	at := f.now.Add(-time.Hour)
	g1, u1 := recBuilder{"p", 1, "acme", "seats"}.level(1, "3", at), recBuilder{"p", 1, "acme", "mau"}.member(1, "u1", at)
	f.apply(g1, u1)
	g2, u2 := recBuilder{"q", 1, "acme", "seats"}.level(1, "4", at), recBuilder{"q", 1, "acme", "mau"}.member(1, "u2", at)
	g2.OperationID, u2.OperationID = g1.OperationID, u1.OperationID
	g3 := recBuilder{"r", 1, "acme", "seats"}.level(1, "5", at)
	if got := kinds(f.apply(g2, u2, g3)); got != "conflict(operation_id_reused) conflict(operation_id_reused) applied" {
		t.Fatalf("outcomes %s", got)
	}
	if u := f.gauge("acme", "seats", "current"); u.Latest.String() != "8" {
		t.Fatalf("level %s, want 3 + 5", u.Latest)
	}
}

// A batch of totals only takes the counter path, which reads the kinds in
// its first round trip; a total for a gauge undoes that attempt and the
// batch is dispatched record by record, leaving no trace of the attempt.
func TestTotalsBatchNamingAGauge(t *testing.T) {
	f := newFixture(t)
	if err := f.declare("seats", ledger.Gauge); err != nil {
		t.Fatal(err)
	}
	at := f.now.Add(-time.Hour)
	out := f.apply(recBuilder{"p", 1, "acme", "calls"}.rec(1, "5", at), recBuilder{"p", 1, "acme", "seats"}.rec(1, "5", at),
		recBuilder{"p", 1, "acme", "calls"}.rec(2, "7", at))
	if got := kinds(out); got != "applied rejected(meter_kind_mismatch) applied" {
		t.Fatalf("outcomes %s", got)
	}
	if n := f.scalar(`SELECT count(*)::text FROM streams WHERE meter = 'seats'`); n != "0" {
		t.Fatalf("%s streams of seats", n)
	}
	if n := f.scalar(`SELECT sum(billed)::text FROM records`); n != "7" {
		t.Fatalf("billed %s", n)
	}
}

// Batches of levels only, or members only, naming a meter of another kind
// are given back by their path and dispatched: only the mismatched
// records are rejected.
func TestOneShapeBatchNamingAnotherKind(t *testing.T) {
	f := newFixture(t)
	if err := f.declare("seats", ledger.Gauge); err != nil {
		t.Fatal(err)
	}
	if err := f.declare("mau", ledger.Unique); err != nil {
		t.Fatal(err)
	}
	at := f.now.Add(-time.Hour)
	if got := kinds(f.apply(recBuilder{"p", 1, "acme", "seats"}.level(1, "2", at), recBuilder{"p", 1, "acme", "calls"}.level(1, "2", at),
		recBuilder{"p", 1, "acme", "mau"}.level(1, "2", at))); got != "applied rejected(meter_kind_mismatch) rejected(meter_kind_mismatch)" {
		t.Fatalf("levels: %s", got)
	}
	if got := kinds(f.apply(recBuilder{"p", 1, "acme", "mau"}.member(1, "u", at), recBuilder{"p", 1, "acme", "seats"}.member(2, "u", at))); got != "applied rejected(meter_kind_mismatch)" {
		t.Fatalf("members: %s", got)
	}
	if n := f.scalar(`SELECT count(*)::text FROM streams WHERE meter = 'calls'`); n != "0" {
		t.Fatalf("%s streams of calls", n)
	}
}

// An operation id is one usage report whatever its meter's kind: reused by
// a record of another kind — in a later batch, in the same batch, in
// either direction, at or past its stream's last seq — it is a conflict,
// the first write stands, and nothing is billed or counted twice.
func TestOperationIDReusedAcrossKinds(t *testing.T) {
	f := newFixture(t)
	if err := f.declare("seats", ledger.Gauge); err != nil {
		t.Fatal(err)
	}
	if err := f.declare("mau", ledger.Unique); err != nil {
		t.Fatal(err)
	}
	at := f.now.Add(-time.Hour)
	calls, seats, mau := recBuilder{"p", 1, "acme", "calls"}, recBuilder{"p", 1, "acme", "seats"}, recBuilder{"p", 1, "acme", "mau"}
	c1, g1, u1 := calls.rec(1, "10", at), seats.level(1, "3", at), mau.member(1, "u1", at)
	if got := kinds(f.apply(c1, g1, u1)); got != "applied applied applied" {
		t.Fatalf("first batch: %s", got)
	}
	// Later batches: each kind reuses the other two kinds' ids, past its
	// stream's last seq (new records, whose own-kind ids are not looked up).
	reuse := func(r ledger.Record, op ledger.Record) ledger.Record { r.OperationID = op.OperationID; return r }
	for _, tc := range []struct {
		name string
		recs []ledger.Record
	}{
		{"counter reuses a gauge's and a unique's", []ledger.Record{reuse(calls.rec(2, "20", at), g1), reuse(calls.rec(3, "30", at), u1)}},
		{"gauge reuses a counter's and a unique's", []ledger.Record{reuse(seats.level(2, "9", at), c1), reuse(seats.level(3, "9", at), u1)}},
		{"unique reuses a counter's and a gauge's", []ledger.Record{reuse(mau.member(2, "u2", at), c1), reuse(mau.member(3, "u3", at), g1)}},
	} {
		if got := kinds(f.apply(tc.recs...)); got != "conflict(operation_id_reused) conflict(operation_id_reused)" {
			t.Errorf("%s: %s", tc.name, got)
		}
	}
	// One batch of mixed kinds: the gauge reading reuses the new counter
	// record's id, the unique record the new gauge reading's.
	c4 := calls.rec(4, "40", at)
	g4 := reuse(seats.level(4, "7", at), c4)
	g5 := seats.level(5, "7", at)
	u5 := reuse(mau.member(5, "u5", at), g5)
	if got := kinds(f.apply(c4, g4, g5, u5)); got != "applied conflict(operation_id_reused) applied conflict(operation_id_reused)" {
		t.Errorf("one mixed batch: %s", got)
	}
	// The gauge reading comes first in the batch, though counters are
	// applied first: the reading claims the id.
	g6 := seats.level(6, "7", at)
	if got := kinds(f.apply(g6, reuse(calls.rec(5, "50", at), g6))); got != "applied conflict(operation_id_reused)" {
		t.Errorf("a gauge, then a counter reusing its id, in one batch: %s", got)
	}
	if n := f.scalar(`SELECT sum(quantity)::text FROM rollups WHERE meter = 'calls'`); n != "40" {
		t.Errorf("calls billed %s, want 40 (10 then 30 more at seq 4)", n)
	}
	if u := f.gauge("acme", "seats", "current"); u.Latest.String() != "7" || u.Max.String() != "7" {
		t.Errorf("seats latest %s max %s, want 7 and 7", u.Latest, u.Max)
	}
	if n := f.scalar(`SELECT count(*)::text FROM unique_readings`); n != "1" {
		t.Errorf("%s unique readings, want u1's alone", n)
	}
	if n := f.scalar(`SELECT count(*)::text FROM conflicts WHERE reason = 'operation_id_reused' AND existing_operation_id IS NOT NULL`); n != "9" {
		t.Errorf("%s conflicts naming the operation they collided with, want 9", n)
	}
}

// A Ledger that has applied only counters while no other kind existed
// does not send a counter batch's operation ids to the other kinds'
// readings; once another process declares a gauge and records a reading,
// the first Ledger's next counter batch still finds the reading's id
// taken: the check is made in every transaction, the Ledger's memory is
// only a hint.
func TestCounterBatchSeesAKindDeclaredElsewhere(t *testing.T) {
	f := newFixture(t)
	at := f.now.Add(-time.Hour)
	calls, seats := recBuilder{"p", 1, "acme", "calls"}, recBuilder{"p", 1, "acme", "seats"}
	for seq := int64(1); seq <= 3; seq++ {
		if got := kinds(f.apply(calls.rec(seq, fmt.Sprint(10*seq), at))); got != "applied" {
			t.Fatalf("counter seq %d: %s", seq, got)
		}
	}
	other, err := ledger.New(ledger.Config{Clock: func() time.Time { return f.now }})
	if err != nil {
		t.Fatal(err)
	}
	if err := f.declare("seats", ledger.Gauge); err != nil {
		t.Fatal(err)
	}
	g1 := seats.level(1, "3", at)
	if err := pgx.BeginFunc(context.Background(), f.pool, func(tx pgx.Tx) error {
		out, err := other.Apply(context.Background(), tx, []ledger.Record{g1})
		if err == nil && kinds(out) != "applied" {
			err = fmt.Errorf("gauge reading: %s", kinds(out))
		}
		return err
	}); err != nil {
		t.Fatal(err)
	}
	c4 := calls.rec(4, "40", at)
	c4.OperationID = g1.OperationID
	if got := kinds(f.apply(c4, calls.rec(5, "50", at))); got != "conflict(operation_id_reused) applied" {
		t.Fatalf("a counter reusing the reading's id: %s", got)
	}
	if n := f.scalar(`SELECT sum(quantity)::text FROM rollups WHERE meter = 'calls'`); n != "50" {
		t.Errorf("calls billed %s, want 50", n)
	}
}

// TestConcurrentSightingsCountOnce: two transactions see the same new
// member on two streams of one customer at once. The second waits for the
// first (locks.UniqueMembers); once the first commits, the second finds
// the member's counted reading and counts nothing: the period and the day
// count the member once. Without the wait neither would see the other's
// reading, and both would count it.
func TestConcurrentSightingsCountOnce(t *testing.T) {
	f := newFixture(t)
	ctx := context.Background()
	if err := f.declare("mau", ledger.Unique); err != nil {
		t.Fatal(err)
	}
	// The customer and the streams exist already: creating them is not
	// what the second transaction waits for.
	s1 := recBuilder{"gw-1", 1, "acme", "mau"}
	s2 := recBuilder{"gw-2", 1, "acme", "mau"}
	f.apply(s1.member(1, "bob", nov), s2.member(1, "bob", nov))

	tx1, err := f.pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = tx1.Rollback(ctx) }()
	if out, err := f.l.Apply(ctx, tx1, []ledger.Record{s1.member(2, "ann", nov.Add(time.Hour))}); err != nil || kinds(out) != "applied" {
		t.Fatalf("first: %v %v", kinds(out), err)
	}
	done := make(chan error, 1)
	go func() {
		done <- pgx.BeginFunc(ctx, f.pool, func(tx pgx.Tx) error {
			out, err := f.l.Apply(ctx, tx, []ledger.Record{s2.member(2, "ann", nov.Add(2*time.Hour))})
			if err == nil && kinds(out) != "applied" {
				err = fmt.Errorf("second: %s", kinds(out))
			}
			return err
		})
	}()
	f.awaitLockWait()
	if err := tx1.Commit(ctx); err != nil {
		t.Fatal(err)
	}
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	if got := f.scalar(`SELECT string_agg(per_day || ':' || members, ' ' ORDER BY per_day) FROM unique_counts`); got != "false:2 true:2" {
		t.Fatalf("counts (per_day:members) = %s, want bob and ann once in the period and the day", got)
	}
	if got := f.scalar(`SELECT count(*) FILTER (WHERE counted)::text FROM unique_readings`); got != "2" {
		t.Fatalf("counted readings = %s, want 2", got)
	}
}

// TestGaugeReadAtThePeriodStart: read as of the instant a period starts,
// a gauge's max is the level carried in (it was 0 while latest was that
// level), and a reading stamped at that instant is not yet counted, as a
// reading stamped at any read's instant is not.
func TestGaugeReadAtThePeriodStart(t *testing.T) {
	f := newFixture(t)
	if err := f.declare("seats", ledger.Gauge); err != nil {
		t.Fatal(err)
	}
	s := recBuilder{"gw-1", 1, "acme", "seats"}
	dec := time.Date(2026, 12, 1, 0, 0, 0, 0, time.UTC)
	f.now = dec.Add(time.Hour)
	f.apply(s.level(1, "4", dec.Add(-48*time.Hour)), s.level(2, "7", dec))
	f.now = dec
	g := f.gauge("acme", "seats", "2026-12-01")
	if got := g.Max.String() + " " + g.Latest.String() + " " + g.UnitSeconds.String(); got != "4 4 0" {
		t.Fatalf("as of the period's start: max latest unit_seconds = %s, want 4 4 0", got)
	}
	f.now = dec.Add(time.Hour)
	g = f.gauge("acme", "seats", "2026-12-01")
	if got := g.Max.String() + " " + g.Latest.String() + " " + g.UnitSeconds.String(); got != "7 7 25200" {
		t.Fatalf("an hour in: max latest unit_seconds = %s, want 7 7 25200", got)
	}
}
