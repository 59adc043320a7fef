package periods_test

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/shopspring/decimal"
	"pgregory.net/rapid"

	"github.com/tally-ledger/tally/amount"
	"github.com/tally-ledger/tally/internal/pgtest"
	"github.com/tally-ledger/tally/ledger"
	"github.com/tally-ledger/tally/periods"
)

// world is a ledger and a period store on one database, sharing a clock.
type world struct {
	t     *testing.T
	pool  *pgxpool.Pool
	l     *ledger.Ledger
	store periods.Store
	mu    sync.Mutex
	now   time.Time
	seq   map[string]int64
	total map[string]decimal.Decimal
}

func newWorld(t *testing.T, now time.Time) *world {
	w := &world{t: t, pool: pgtest.New(t), now: now, seq: map[string]int64{}, total: map[string]decimal.Decimal{}}
	clock := func() time.Time { w.mu.Lock(); defer w.mu.Unlock(); return w.now }
	l, err := ledger.New(ledger.Config{Clock: clock})
	if err != nil {
		t.Fatal(err)
	}
	w.l, w.store = l, periods.Store{Clock: clock}
	return w
}

func (w *world) at(t time.Time) { w.mu.Lock(); w.now = t; w.mu.Unlock() }

// use reports q units of usage that occurred at t, as the next record of
// the customer's stream, and returns the outcome.
func (w *world) use(customer string, q string, occurred time.Time) ledger.Outcome {
	w.t.Helper()
	w.mu.Lock()
	w.seq[customer]++
	w.total[customer] = w.total[customer].Add(amount.MustParse(q))
	r := ledger.Record{
		OperationID: uuid.Must(uuid.NewV7()),
		Stream:      ledger.StreamKey{Producer: "gw", Epoch: 1, Customer: customer, Meter: "calls"},
		Seq:         w.seq[customer], Total: w.total[customer], OccurredAt: occurred,
		Quantity: decimal.NewNullDecimal(amount.MustParse(q)),
	}
	w.mu.Unlock()
	return w.apply(r)[0]
}

// apply applies recs to the ledger in one transaction, as ingest would.
func (w *world) apply(recs ...ledger.Record) []ledger.Outcome {
	w.t.Helper()
	var out []ledger.Outcome
	err := pgx.BeginFunc(context.Background(), w.pool, func(tx pgx.Tx) error {
		var err error
		out, err = w.l.Apply(context.Background(), tx, recs)
		return err
	})
	if err != nil {
		w.t.Fatalf("apply: %v", err)
	}
	return out
}

// declareGauges declares meters gauges.
func (w *world) declareGauges(meters ...string) {
	w.t.Helper()
	if err := pgx.BeginFunc(context.Background(), w.pool, func(tx pgx.Tx) error {
		for _, m := range meters {
			if _, err := ledger.DeclareMeter(context.Background(), tx, ledger.Meter{Meter: m, Kind: ledger.Gauge}, w.now); err != nil {
				return err
			}
		}
		return nil
	}); err != nil {
		w.t.Fatal(err)
	}
}

// closeAhead closes with a store whose clock is ahead of the ledger's.
func (w *world) closeAhead(customer, period string, ahead time.Duration) (periods.Statement, error) {
	store := w.store
	store.Clock = func() time.Time { w.mu.Lock(); defer w.mu.Unlock(); return w.now.Add(ahead) }
	var st periods.Statement
	err := pgx.BeginFunc(context.Background(), w.pool, func(tx pgx.Tx) error {
		var err error
		st, err = store.Close(context.Background(), tx, periods.CloseRequest{
			Customer: customer, Period: period, Force: true, Reason: "test close", Actor: "tester"})
		return err
	})
	return st, err
}

func (w *world) close(customer, period string) (periods.Statement, error) {
	var st periods.Statement
	err := pgx.BeginFunc(context.Background(), w.pool, func(tx pgx.Tx) error {
		var err error
		st, err = w.store.Close(context.Background(), tx, periods.CloseRequest{
			Customer: customer, Period: period, Force: true, Reason: "test close", Actor: "tester"})
		return err
	})
	return st, err
}

func (w *world) statement(customer, period string) periods.Statement {
	w.t.Helper()
	st, err := w.store.Statement(context.Background(), w.pool, customer, period)
	if err != nil {
		w.t.Fatalf("statement %s %s: %v", customer, period, err)
	}
	return st
}

func billed(st periods.Statement) string {
	s := ""
	for _, l := range st.Lines {
		s += fmt.Sprintf("%s=%s(usage %s, prior %s, adj %s) ", l.Meter, l.Billed, l.Usage, l.PriorPeriodAdjustments, l.Adjustments)
	}
	return s
}

func TestMonthWithLateUsage(t *testing.T) {
	for _, zone := range []string{"UTC", "America/New_York"} {
		t.Run(zone, func(t *testing.T) {
			loc, _ := time.LoadLocation(zone)
			day := func(m time.Month, d, h int) time.Time { return time.Date(2026, m, d, h, 0, 0, 0, loc) }
			w := newWorld(t, day(10, 1, 1))
			if zone != "UTC" {
				w.use("acme", "0", day(10, 1, 1)) // creates the customer; then move it to New York
				w.exec(`UPDATE customers SET schedule = $1 WHERE id = 'acme'`,
					fmt.Sprintf(`[{"effective_from":"0001-01-01T00:00:00Z","calendar":{"cadence":"monthly","anchor_day":1,"anchor_time":"00:00","zone":%q}}]`, zone))
			}
			// Early in October, and across the DST change (New York: November 1).
			w.use("acme", "10", day(10, 2, 9))
			w.at(day(10, 31, 23))
			w.use("acme", "5", day(10, 31, 23))
			// November 1, 01:30 local: October is in grace; usage from October still lands in it.
			w.at(day(11, 1, 1).Add(30 * time.Minute))
			if o := w.use("acme", "2", day(10, 31, 22)); o.Period.In(loc).Month() != time.October {
				t.Fatalf("grace usage went to %s", o.Period)
			}
			w.use("acme", "7", day(11, 1, 1))
			if st := w.statement("acme", "2026-10-01"); st.State != periods.Grace || billed(st) != "calls=17(usage 17, prior 0, adj 0) " {
				t.Fatalf("october in grace: %s %s", st.State, billed(st))
			}
			if _, err := w.close("acme", "2026-11-01"); !errors.Is(err, periods.ErrPeriodOpen) {
				t.Fatalf("closing the open period: %v", err)
			}
			// Close October; later October usage becomes a prior-period adjustment in November.
			w.at(day(11, 3, 0))
			st, err := w.close("acme", "2026-10-01")
			if err != nil || !st.Final || billed(st) != "calls=17(usage 17, prior 0, adj 0) " {
				t.Fatalf("close: %v %s", err, billed(st))
			}
			o := w.use("acme", "4", day(10, 30, 12))
			if o.Period.In(loc).Month() != time.November {
				t.Fatalf("after close, October usage went to %s", o.Period)
			}
			again, err := w.close("acme", "2026-10-01")
			if err != nil || billed(again) != billed(st) || !again.ClosedAt.Equal(*st.ClosedAt) {
				t.Fatalf("second close changed the statement: %v %s", err, billed(again))
			}
			nov := w.statement("acme", "current")
			if billed(nov) != "calls=11(usage 7, prior 4, adj 0) " || len(nov.Absorbed) != 1 || nov.Absorbed[0].Amount.String() != "4" {
				t.Fatalf("november: %s %+v", billed(nov), nov.Absorbed)
			}
			// The period boundary is local midnight, 04:00 UTC in October (EDT).
			if zone != "UTC" && st.End.UTC().Hour() != 4 {
				t.Fatalf("october ends at %s", st.End.UTC())
			}
		})
	}
}

func (w *world) exec(sql string, args ...any) {
	w.t.Helper()
	if _, err := w.pool.Exec(context.Background(), sql, args...); err != nil {
		w.t.Fatal(err)
	}
}

// TestCloseRacesUsage: usage arriving while a close runs is billed exactly
// once, either in the closing period or as a prior-period adjustment.
func TestCloseRacesUsage(t *testing.T) {
	oct := func(d int) time.Time { return time.Date(2026, 10, d, 12, 0, 0, 0, time.UTC) }
	w := newWorld(t, oct(30))
	w.use("acme", "1", oct(2))
	w.at(time.Date(2026, 11, 2, 0, 0, 0, 0, time.UTC))

	var wg sync.WaitGroup
	var st periods.Statement
	var closeErr error
	wg.Add(2)
	go func() {
		defer wg.Done()
		for i := 0; i < 40; i++ {
			w.use("acme", "1", oct(31))
		}
	}()
	go func() {
		defer wg.Done()
		time.Sleep(5 * time.Millisecond)
		st, closeErr = w.close("acme", "2026-10-01")
	}()
	wg.Wait()
	if closeErr != nil {
		t.Fatal(closeErr)
	}
	inOct := st.Lines[0].Billed
	nov := w.statement("acme", "current")
	var prior decimal.Decimal
	if len(nov.Lines) > 0 {
		prior = nov.Lines[0].PriorPeriodAdjustments
	}
	if !inOct.Add(prior).Equal(decimal.NewFromInt(41)) {
		t.Fatalf("october statement %s + november prior-period %s != 41 units used", inOct, prior)
	}
	frozen := w.statement("acme", "2026-10-01")
	if !frozen.Lines[0].Billed.Equal(inOct) {
		t.Fatalf("closed statement changed from %s to %s", inOct, frozen.Lines[0].Billed)
	}
	t.Logf("october billed %s, november absorbed %s", inOct, prior)
}

func TestCloseNeedsReasonOrReconciliation(t *testing.T) {
	w := newWorld(t, time.Date(2026, 11, 5, 0, 0, 0, 0, time.UTC))
	w.use("acme", "1", time.Date(2026, 10, 5, 0, 0, 0, 0, time.UTC))
	err := pgx.BeginFunc(context.Background(), w.pool, func(tx pgx.Tx) error {
		_, err := w.store.Close(context.Background(), tx, periods.CloseRequest{Customer: "acme", Period: "previous"})
		return err
	})
	if !errors.Is(err, periods.ErrNotReconciled) {
		t.Fatalf("unforced close without reconciliation: %v", err)
	}
	err = pgx.BeginFunc(context.Background(), w.pool, func(tx pgx.Tx) error {
		_, err := w.store.Close(context.Background(), tx, periods.CloseRequest{Customer: "acme", Period: "previous", Force: true})
		return err
	})
	if err == nil || err.Error() != "a forced close needs a reason and an actor" {
		t.Fatalf("forced close without reason: %v", err)
	}
}

// TestPropertyEveryUnitInOneStatement: usage occurring at random times,
// arriving late by random delays, with periods closed at random moments by
// a closer whose clock may run ahead of the ledger's (so it may close the
// period the ledger's clock is still in): the statements of all periods add
// up to exactly the usage, and a closed statement never changes.
func TestPropertyEveryUnitInOneStatement(t *testing.T) {
	w := newWorld(t, time.Date(2026, 8, 1, 0, 0, 0, 0, time.UTC))
	n := 0
	rapid.Check(t, func(rt *rapid.T) {
		n++
		customer := fmt.Sprintf("c%d", n)
		start := time.Date(2026, 8, 1, 0, 0, 0, 0, time.UTC)
		w.at(start)
		used := decimal.Zero
		frozen := map[string]string{}
		steps := rapid.IntRange(1, 12).Draw(rt, "steps")
		for i := 0; i < steps; i++ {
			w.at(w.now.Add(time.Duration(rapid.IntRange(1, 10*24).Draw(rt, "advance")) * time.Hour))
			if rapid.IntRange(0, 3).Draw(rt, "close") == 0 {
				ahead := time.Duration(rapid.IntRange(0, 10*24).Draw(rt, "closer ahead")) * time.Hour
				if st, err := w.closeAhead(customer, "previous", ahead); err == nil {
					frozen[st.Period] = billed(st)
				} else if !errors.Is(err, periods.ErrUnknownCustomer) {
					rt.Fatalf("close: %v", err)
				}
			}
			q := decimal.NewFromInt(int64(rapid.IntRange(1, 1000).Draw(rt, "q")))
			late := time.Duration(rapid.IntRange(0, 40*24).Draw(rt, "late")) * time.Hour
			w.use(customer, q.String(), w.now.Add(-late))
			used = used.Add(q)
		}
		list, err := w.store.List(context.Background(), w.pool, customer)
		if err != nil {
			rt.Fatal(err)
		}
		sum := decimal.Zero
		for _, p := range list {
			st := w.statement(customer, p.Name)
			for _, l := range st.Lines {
				sum = sum.Add(l.Billed)
			}
			if f, ok := frozen[p.Name]; ok && billed(st) != f {
				rt.Fatalf("closed statement %s changed: %s -> %s", p.Name, f, billed(st))
			}
		}
		if !sum.Equal(used) {
			rt.Fatalf("statements add up to %s, usage was %s", sum, used)
		}
	})
}

// TestLiveStatementReadsRollups: the statement of an open period (which a
// customer token may ask for in a loop) is read from rollups; of the raw
// usage records it reads only the prior-period adjustments, which are rare.
func TestLiveStatementReadsRollups(t *testing.T) {
	w := newWorld(t, time.Date(2026, 11, 20, 12, 0, 0, 0, time.UTC))
	for i := range 30 {
		w.use("acme", "1.5", time.Date(2026, 11, 1+i%19, 10, 0, 0, 0, time.UTC))
	}
	w.exec(`INSERT INTO period_closes (customer, period_start, period_end, closed_at, statement, forced, reason, actor)
		VALUES ('acme', '2026-10-01T00:00:00Z', '2026-11-01T00:00:00Z', now(), '{}', true, 'test', 'test')`)
	w.use("acme", "4", time.Date(2026, 10, 30, 0, 0, 0, 0, time.UTC)) // a prior-period adjustment
	err := pgx.BeginFunc(context.Background(), w.pool, func(tx pgx.Tx) error {
		_, err := w.l.Adjust(context.Background(), tx, ledger.Adjustment{OperationID: uuid.Must(uuid.NewV7()), Customer: "acme",
			Meter: "calls", Quantity: amount.MustParse("-2"), Reason: "credit", Actor: "ops"})
		return err
	})
	if err != nil {
		t.Fatal(err)
	}

	var st periods.Statement
	var read int64
	err = pgx.BeginFunc(context.Background(), w.pool, func(tx pgx.Tx) error {
		// Indexes where they exist, as on a table of millions of rows.
		if _, err := tx.Exec(context.Background(), `SET LOCAL enable_seqscan = off`); err != nil {
			return err
		}
		var err error
		if st, err = w.store.Statement(context.Background(), tx, "acme", "current"); err != nil {
			return err
		}
		return tx.QueryRow(context.Background(), `SELECT seq_tup_read + coalesce(idx_tup_fetch, 0)
			FROM pg_stat_xact_user_tables WHERE relname = 'records'`).Scan(&read)
	})
	if err != nil {
		t.Fatal(err)
	}
	if got := billed(st); got != "calls=47(usage 45, prior 4, adj -2) " || len(st.Absorbed) != 1 || st.Absorbed[0].Amount.String() != "4" {
		t.Fatalf("live statement: %s %+v", got, st.Absorbed)
	}
	// Lines and the absorbed periods each read the one prior-period record.
	if read > 2 {
		t.Fatalf("the live statement read %d rows of records (the period has 31); want at most its prior-period ones, twice", read)
	}
}

// TestListHasTheCurrentPeriodWhenUsageIsBookedAhead: usage stamped up to
// the ledger's clock skew ahead lands in the next period before it starts;
// the list still has the current period, between that one and the older
// ones, as it has it when the current period is empty.
func TestListHasTheCurrentPeriodWhenUsageIsBookedAhead(t *testing.T) {
	w := newWorld(t, time.Date(2026, 11, 30, 23, 58, 0, 0, time.UTC))
	w.use("acme", "2", time.Date(2026, 10, 20, 0, 0, 0, 0, time.UTC))
	if out := w.use("acme", "3", time.Date(2026, 12, 1, 0, 1, 0, 0, time.UTC)); out.Kind != ledger.Applied {
		t.Fatalf("usage 3 minutes ahead: %+v", out)
	}
	list, err := w.store.List(context.Background(), w.pool, "acme")
	if err != nil {
		t.Fatal(err)
	}
	var got []string
	for _, p := range list {
		got = append(got, fmt.Sprintf("%s %s %v", p.Name, p.State, p.Billed))
	}
	want := []string{"2026-12-01 open map[calls:3]", "2026-11-01 open map[]", "2026-10-01 awaiting_close map[calls:2]"}
	if fmt.Sprint(got) != fmt.Sprint(want) {
		t.Fatalf("periods\n\t%v\nwant\n\t%v", got, want)
	}
}

// TestListHasThePeriodsAGaugeLevelIsHeldIn: a gauge's level holds until
// its next reading, so the periods after its last reading bill
// level-seconds (and may absorb a late reading's prior-period
// adjustment) without a reading, or a row of their own, in them. They
// are periods with usage, listed like any other; the statement of each
// bills what the list shows.
func TestListHasThePeriodsAGaugeLevelIsHeldIn(t *testing.T) {
	sep := func(d int) time.Time { return time.Date(2026, 9, d, 0, 0, 0, 0, time.UTC) }
	w := newWorld(t, sep(20))
	w.store.Kinds = ledger.StatementKinds
	ctx := context.Background()
	w.declareGauges("seats")
	w.apply(gaugeLevel(1, "5", sep(5)), gaugeLevel(3, "7", sep(20))) // seq 2 comes after September's close
	w.at(time.Date(2026, 10, 3, 0, 0, 0, 0, time.UTC))
	if _, err := w.close("acme", "2026-09-01"); err != nil {
		t.Fatal(err)
	}
	w.at(time.Date(2026, 10, 20, 0, 0, 0, 0, time.UTC))
	// Seq 2 changes closed September: billed in October as a prior-period adjustment.
	w.apply(gaugeLevel(2, "100", sep(10)))
	w.at(time.Date(2026, 12, 1, 12, 0, 0, 0, time.UTC)) // November is in grace
	list, err := w.store.List(ctx, w.pool, "acme")
	if err != nil {
		t.Fatal(err)
	}
	var got []string
	for _, p := range list {
		got = append(got, fmt.Sprintf("%s %s", p.Name, p.State))
		st := w.statement("acme", p.Name)
		if len(st.Gauges) != 1 || st.Gauges[0].UnitSeconds.IsZero() {
			t.Errorf("period %s is listed and bills no level-seconds: %+v", p.Name, st.Gauges)
		}
	}
	want := []string{"2026-12-01 open", "2026-11-01 grace", "2026-10-01 awaiting_close", "2026-09-01 closed"}
	if fmt.Sprint(got) != fmt.Sprint(want) {
		t.Fatalf("periods\n\t%v\nwant\n\t%v", got, want)
	}
	if st := w.statement("acme", "2026-10-01"); st.Gauges[0].PriorPeriodUnitSeconds.String() != "82080000" { // (100-5) × 10 days
		t.Fatalf("october: %+v", st.Gauges)
	}
}

// TestListEndsWithTheLastGaugeLevelBilled: a final reading ends its
// stream's level (docs/design.md §16: a final record's level is 0), and a
// reading of 0 sets the level to 0, so the periods after them bill no
// level-seconds: they are not listed (the current one always is), until
// a gauge carries a level again. A period that absorbed a late reading's
// prior-period adjustment is listed even with no level carried into it.
func TestListEndsWithTheLastGaugeLevelBilled(t *testing.T) {
	day := func(y int, m time.Month, d int) time.Time { return time.Date(y, m, d, 0, 0, 0, 0, time.UTC) }
	w := newWorld(t, day(2026, 6, 20))
	w.store.Kinds = ledger.StatementKinds
	ctx := context.Background()
	w.declareGauges("seats", "disks")
	disks := func(seq int64, v string, at time.Time) ledger.Record {
		r := gaugeLevel(seq, v, at)
		r.Stream.Meter = "disks"
		return r
	}
	final := gaugeLevel(3, "0", day(2026, 6, 20))
	final.Final = true
	// seats: 5 from June 5 (7 from June 10: seq 2, late), ended June 20.
	// disks: 2 from June 8, 0 from July 15, 3 from October 10, 0 from December 10.
	w.apply(gaugeLevel(1, "5", day(2026, 6, 5)), final, disks(1, "2", day(2026, 6, 8)))
	w.at(day(2026, 7, 16))
	w.apply(disks(2, "0", day(2026, 7, 15)))
	w.at(day(2026, 8, 3))
	for _, p := range []string{"2026-06-01", "2026-07-01"} {
		if _, err := w.close("acme", p); err != nil {
			t.Fatal(err)
		}
	}
	w.at(day(2026, 8, 20))
	w.apply(gaugeLevel(2, "7", day(2026, 6, 10))) // changes closed June: billed in August
	w.at(day(2026, 10, 11))
	w.apply(disks(3, "3", day(2026, 10, 10)))
	w.at(day(2026, 12, 11))
	w.apply(disks(4, "0", day(2026, 12, 10)))
	w.at(time.Date(2027, 3, 1, 12, 0, 0, 0, time.UTC))
	list, err := w.store.List(ctx, w.pool, "acme")
	if err != nil {
		t.Fatal(err)
	}
	var got []string
	for _, p := range list {
		got = append(got, fmt.Sprintf("%s %s", p.Name, p.State))
	}
	want := []string{"2027-03-01 open", "2026-12-01 awaiting_close", "2026-11-01 awaiting_close", "2026-10-01 awaiting_close",
		"2026-08-01 awaiting_close", "2026-07-01 closed", "2026-06-01 closed"}
	if fmt.Sprint(got) != fmt.Sprint(want) {
		t.Fatalf("periods\n\t%v\nwant\n\t%v", got, want)
	}
	// What is left out bills nothing.
	for _, name := range []string{"2026-09-01", "2027-01-01", "2027-02-01"} {
		for _, g := range w.statement("acme", name).Gauges {
			if !g.UnitSeconds.IsZero() || !g.PriorPeriodUnitSeconds.IsZero() {
				t.Errorf("period %s is not listed and bills %+v", name, g)
			}
		}
	}
	if st := w.statement("acme", "2026-08-01"); len(st.Absorbed) != 1 || st.Absorbed[0].Amount.String() != "1728000" { // 2 × 10 days
		t.Errorf("august absorbed %+v of june's change, want 1728000 seat-seconds", st.Absorbed)
	}
}

// TestStatementSaysWhereAGaugeAdjustmentCameFrom: a late gauge reading
// that changes a closed period's level-seconds is billed in the first
// open period, and that period's statement says from which period it
// came (prior_periods_absorbed, in the gauge's unit-seconds), as it does
// for a counter's late usage.
func TestStatementSaysWhereAGaugeAdjustmentCameFrom(t *testing.T) {
	sep := func(d int) time.Time { return time.Date(2026, 9, d, 0, 0, 0, 0, time.UTC) }
	w := newWorld(t, sep(20))
	w.store.Kinds = ledger.StatementKinds
	w.declareGauges("seats")
	w.apply(gaugeLevel(1, "5", sep(5)), gaugeLevel(3, "7", sep(20)))
	w.at(time.Date(2026, 10, 3, 0, 0, 0, 0, time.UTC))
	if _, err := w.close("acme", "2026-09-01"); err != nil {
		t.Fatal(err)
	}
	w.at(time.Date(2026, 10, 20, 0, 0, 0, 0, time.UTC))
	w.apply(gaugeLevel(2, "100", sep(10))) // between September's readings
	st := w.statement("acme", "2026-10-01")
	want := []periods.Absorbed{{Period: sep(1), Meter: "seats", Amount: decimal.RequireFromString("82080000")}} // (100-5) × 10 days
	if len(st.Gauges) != 1 || !st.Gauges[0].PriorPeriodUnitSeconds.Equal(want[0].Amount) ||
		len(st.Absorbed) != 1 || !st.Absorbed[0].Period.Equal(want[0].Period) || st.Absorbed[0].Meter != want[0].Meter ||
		!st.Absorbed[0].Amount.Equal(want[0].Amount) {
		t.Fatalf("october's gauges %+v, prior_periods_absorbed %+v; want %+v", st.Gauges, st.Absorbed, want)
	}
}

// gaugeLevel is acme's reading of gauge seats at seq.
func gaugeLevel(seq int64, v string, at time.Time) ledger.Record {
	return ledger.Record{OperationID: uuid.Must(uuid.NewV7()), Stream: ledger.StreamKey{Producer: "gw", Epoch: 1, Customer: "acme", Meter: "seats"},
		Seq: seq, OccurredAt: at, Shape: ledger.Gauge, Level: amount.MustParse(v)}
}
