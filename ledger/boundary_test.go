package ledger_test

import (
	"context"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"

	"github.com/tally-ledger/tally/amount"
	"github.com/tally-ledger/tally/ledger"
	"github.com/tally-ledger/tally/periods"
)

// closeForced closes the customer's period (forced) with the closer's own
// clock, which may be ahead of the ledger's.
func (f *fixture) closeForced(customer, period string, closerNow time.Time) periods.Statement {
	f.t.Helper()
	var st periods.Statement
	store := periods.Store{Clock: func() time.Time { return closerNow }}
	err := pgx.BeginFunc(context.Background(), f.pool, func(tx pgx.Tx) error {
		var err error
		st, err = store.Close(context.Background(), tx, periods.CloseRequest{
			Customer: customer, Period: period, Force: true, Reason: "test", Actor: "test"})
		return err
	})
	if err != nil {
		f.t.Fatalf("close %s %s: %v", customer, period, err)
	}
	return st
}

// billedIn is the rollups' total of a customer's period.
func (f *fixture) billedIn(customer, period string) string {
	f.t.Helper()
	return f.scalar(`SELECT coalesce(trim_scale(sum(quantity)), 0)::text FROM rollups
		WHERE customer = $1 AND period_start = $2::date::timestamptz`, customer, period)
}

// November is closed (forced, a second after its end, by a closer whose
// clock is ahead); the ledger's clock still reads November. Usage of
// November must not land in November's rollups, which no statement will
// ever show: it goes to December, the first period still open, as a
// prior-period adjustment.
func TestApplyNeverBooksIntoAClosedPeriod(t *testing.T) {
	f := newFixture(t)
	s := recBuilder{"gw-1", 1, "acme", "api_calls"}
	f.now = time.Date(2026, 11, 30, 23, 59, 59, 0, time.UTC)
	f.apply(s.rec(1, "10", f.now.Add(-time.Hour)))
	st := f.closeForced("acme", "2026-11-01", time.Date(2026, 12, 1, 0, 0, 1, 0, time.UTC))
	if len(st.Lines) != 1 || st.Lines[0].Billed.String() != "10" {
		t.Fatalf("frozen statement = %+v", st.Lines)
	}

	f.now = f.now.Add(900 * time.Millisecond) // 23:59:59.9: the ledger's clock is still in November
	out := f.apply(s.rec(2, "15", f.now))
	if got := kinds(out); got != "applied" || out[0].Period.Format(time.DateOnly) != "2026-12-01" {
		t.Fatalf("outcome = %s in period %s, want applied in 2026-12-01", got, out[0].Period.Format(time.DateOnly))
	}
	if got := f.billedIn("acme", "2026-11-01"); got != "10" {
		t.Fatalf("closed November's rollups = %s, want its frozen 10", got)
	}
	if got := f.billedIn("acme", "2026-12-01"); got != "5" {
		t.Fatalf("December's rollups = %s, want 5", got)
	}
	if got := f.scalar(`SELECT format('%s %s %s', to_char(period_start, 'YYYY-MM-DD'), to_char(prior_period, 'YYYY-MM-DD'),
		to_char(bucket AT TIME ZONE 'UTC', 'YYYY-MM-DD HH24:MI')) FROM records WHERE seq = 2`); got != "2026-12-01 2026-11-01 2026-12-01 00:00" {
		t.Fatalf("record booked as %s, want period 2026-12-01, prior 2026-11-01, in December's first hour", got)
	}
	// December's live statement shows it as a prior-period adjustment.
	dec, err := periods.Store{Clock: func() time.Time { return f.now }}.Statement(context.Background(), f.pool, "acme", "2026-12-01")
	if err != nil {
		t.Fatal(err)
	}
	if len(dec.Lines) != 1 || dec.Lines[0].PriorPeriodAdjustments.String() != "5" || dec.Lines[0].Billed.String() != "5" {
		t.Fatalf("December's statement = %+v", dec.Lines)
	}

	// December closed too (forced early): January is the first open period.
	f.closeForced("acme", "2026-12-01", time.Date(2027, 1, 1, 0, 0, 1, 0, time.UTC))
	out = f.apply(s.rec(3, "17", f.now))
	if got := out[0].Period.Format(time.DateOnly); got != "2027-01-01" {
		t.Fatalf("with November and December closed, usage went to %s, want 2027-01-01", got)
	}
	if nov, dec := f.billedIn("acme", "2026-11-01"), f.billedIn("acme", "2026-12-01"); nov != "10" || dec != "5" {
		t.Fatalf("closed periods' rollups changed: November %s, December %s", nov, dec)
	}
}

// The same for a manual adjustment, with and without occurred_at.
func TestAdjustNeverBooksIntoAClosedPeriod(t *testing.T) {
	f := newFixture(t)
	f.now = time.Date(2026, 11, 30, 23, 59, 59, 0, time.UTC)
	f.apply(recBuilder{"gw-1", 1, "acme", "api_calls"}.rec(1, "10", f.now))
	f.closeForced("acme", "2026-11-01", time.Date(2026, 12, 1, 0, 0, 1, 0, time.UTC))

	for _, occurred := range []time.Time{{}, time.Date(2026, 11, 15, 0, 0, 0, 0, time.UTC)} {
		res, err := f.adjust(ledger.Adjustment{
			OperationID: uuid.Must(uuid.NewV7()), Customer: "acme", Meter: "api_calls", OccurredAt: occurred,
			Quantity: amount.MustParse("-2"), Reason: "credit", Actor: "ops"})
		if err != nil {
			t.Fatal(err)
		}
		if res.Period.Format(time.DateOnly) != "2026-12-01" || res.PriorPeriod == nil || res.PriorPeriod.Format(time.DateOnly) != "2026-11-01" {
			t.Fatalf("occurred %v: booked in %s (prior %v), want 2026-12-01 referencing 2026-11-01", occurred, res.Period, res.PriorPeriod)
		}
	}
	if got := f.billedIn("acme", "2026-11-01"); got != "10" {
		t.Fatalf("closed November's rollups = %s, want its frozen 10", got)
	}
	if got := f.billedIn("acme", "2026-12-01"); got != "-4" {
		t.Fatalf("December's rollups = %s, want -4", got)
	}
}

// A gap's usage was billed in November; late fills whose quantities
// disagree with each other must not move more out of November than the gap
// billed there. Seq 6 says the gap 2..5 holds 100; seq 5 says it used 60
// (so seq 4's total is 50), then seq 3 arrives with total 60, quantity 50:
// only the 40 still unmoved may move, and the disagreement is a finding.
func TestLateFillsNeverMoveMoreThanTheGap(t *testing.T) {
	f := newFixture(t)
	s := recBuilder{"gw-1", 1, "acme", "api_calls"}
	oct := time.Date(2026, 10, 20, 0, 0, 0, 0, time.UTC)
	f.apply(s.recQ(1, "10", "10", oct), s.recQ(6, "110", "0", nov))
	if oct, nov := f.billedIn("acme", "2026-10-01"), f.billedIn("acme", "2026-11-01"); oct != "10" || nov != "100" {
		t.Fatalf("before the fills: October %s, November %s", oct, nov)
	}
	if got := kinds(f.apply(s.recQ(5, "110", "60", oct))); got != "late_fill" {
		t.Fatalf("seq 5: %s", got)
	}
	if got := kinds(f.apply(s.recQ(3, "60", "50", oct))); got != "late_fill" {
		t.Fatalf("seq 3: %s", got)
	}
	if oct, nov := f.billedIn("acme", "2026-10-01"), f.billedIn("acme", "2026-11-01"); oct != "110" || nov != "0" {
		t.Fatalf("after the fills: October %s, November %s; want 110 and 0 (never more moved than the gap's 100)", oct, nov)
	}
	if got := f.scalar(`SELECT coalesce(string_agg(format('%s seq %s %s', kind, seq, trim_scale(amount)), '; '), '') FROM findings`); got != "quantity_mismatch seq 3 10" {
		t.Fatalf("findings = %q, want the 10 that could not move", got)
	}
	// Whatever arrives for the rest moves nothing more: November keeps 0.
	f.apply(s.recQ(2, "10", "0", oct), s.recQ(4, "60", "0", oct))
	if oct, nov := f.billedIn("acme", "2026-10-01"), f.billedIn("acme", "2026-11-01"); oct != "110" || nov != "0" {
		t.Fatalf("after filling the rest: October %s, November %s", oct, nov)
	}
}

// A batch whose clock was read at 23:59:59.9 waits behind a close that
// commits at 00:00:01: it sees November closed once it has the customer
// lock, and books the usage in December.
func TestApplyWaitingBehindACloseSeesItClosed(t *testing.T) {
	f := newFixture(t)
	s := recBuilder{"gw-1", 1, "acme", "api_calls"}
	f.now = time.Date(2026, 11, 30, 23, 59, 59, 900_000_000, time.UTC)
	f.apply(s.rec(1, "10", f.now.Add(-time.Minute)))

	ctx := context.Background()
	closer, err := f.pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer closer.Rollback(ctx)
	store := periods.Store{Clock: func() time.Time { return time.Date(2026, 12, 1, 0, 0, 1, 0, time.UTC) }}
	if _, err := store.Close(ctx, closer, periods.CloseRequest{Customer: "acme", Period: "2026-11-01", Force: true, Reason: "test", Actor: "test"}); err != nil {
		t.Fatal(err)
	}
	// The close holds the customer lock until it commits.
	done := make(chan []ledger.Outcome, 1)
	go func() {
		var out []ledger.Outcome
		err := pgx.BeginFunc(ctx, f.pool, func(tx pgx.Tx) error {
			var err error
			out, err = f.l.Apply(ctx, tx, []ledger.Record{s.rec(2, "15", f.now)})
			return err
		})
		if err != nil {
			t.Error(err)
		}
		done <- out
	}()
	// Commit the close once the batch waits for the lock.
	deadline := time.Now().Add(time.Minute)
	for {
		var waiting bool
		if err := f.pool.QueryRow(ctx, `SELECT EXISTS (SELECT 1 FROM pg_locks WHERE locktype = 'advisory' AND NOT granted
			AND database = (SELECT oid FROM pg_database WHERE datname = current_database()))`).Scan(&waiting); err != nil {
			t.Fatal(err)
		}
		if waiting {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("the batch never waited for the close's lock")
		}
		time.Sleep(10 * time.Millisecond)
	}
	if err := closer.Commit(ctx); err != nil {
		t.Fatal(err)
	}
	out := <-done
	if len(out) != 1 || out[0].Period.Format(time.DateOnly) != "2026-12-01" {
		t.Fatalf("outcome %+v, want applied in 2026-12-01", out)
	}
	if got := f.billedIn("acme", "2026-11-01"); got != "10" {
		t.Fatalf("closed November's rollups = %s, want its frozen 10", got)
	}
}
