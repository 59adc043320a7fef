package reconcile_test

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/tally-ledger/tally/ledger"
	"github.com/tally-ledger/tally/periods"
	"github.com/tally-ledger/tally/reconcile"
)

func (e *env) close(customer, period string) (periods.Statement, error) {
	var st periods.Statement
	store := periods.Store{Clock: func() time.Time { return e.now }, Gate: reconcile.Gate}
	err := pgx.BeginFunc(context.Background(), e.pool, func(tx pgx.Tx) error {
		var err error
		st, err = store.Close(context.Background(), tx, periods.CloseRequest{Customer: customer, Period: period})
		return err
	})
	return st, err
}

// TestGateRefusesWhatArrivedAfterTheRun: a clean run is a ticket to close
// only while nothing it checked has changed. Each case makes the period
// dirty after the clean run without changing its billed totals; the close
// must be refused. The control case closes.
func TestGateRefusesWhatArrivedAfterTheRun(t *testing.T) {
	oct := time.Date(2026, 10, 10, 0, 0, 0, 0, time.UTC)
	cases := []struct {
		name   string
		after  func(e *env)
		refuse string // "" when the close must succeed
	}{
		{"nothing", func(e *env) {}, ""},
		{"conflict", func(e *env) {
			if o := e.apply(rec("gw", 1, "acme", 2, "99", "", oct)); o[0].Kind != ledger.Conflict {
				t.Fatalf("setup: %v", o[0].Kind)
			}
		}, "conflict"},
		{"dead letter", func(e *env) {
			e.exec(`INSERT INTO dead_letters (id, topic, partition, "offset", reason, detail, key, raw, created_at)
				VALUES ('019a3c8e-7a40-7000-8000-0000000000d2', 'tally.meter-batches', 0, 7, 'bad_json', 'x', 'acme', '{', $1)`, oct)
		}, "dead letter"},
		{"gap", func(e *env) {
			e.apply(rec("gw", 1, "acme", 4, "11", "0", oct)) // seq 3 missing, nothing billed
		}, "gap"},
		{"ledger finding", func(e *env) {
			e.exec(`INSERT INTO findings (id, kind, customer, meter, period_start, amount, detail, created_at)
				VALUES (gen_random_uuid(), 'quantity_mismatch', 'acme', 'calls', '2026-10-01T00:00:00Z', 1, 'x', now())`)
		}, "finding"},
		{"tampered stream", func(e *env) {
			e.exec(`UPDATE streams SET last_total = 99 WHERE customer = 'acme'`)
		}, "streams"},
		{"zero usage", func(e *env) {
			e.apply(rec("gw", 2, "acme", 1, "0", "0", oct))
		}, "usage"},
		{"gauge reading", func(e *env) {
			e.declare("seats", ledger.Gauge)
			e.apply(level("a", 1, "0", oct)) // a level of 0 changes no aggregate
		}, "gauge or unique readings"},
		{"unique member", func(e *env) {
			e.declare("mau", ledger.Unique)
			e.apply(member(1, "u1", oct))
		}, "gauge or unique readings"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			e := newEnv(t)
			e.apply(rec("gw", 1, "acme", 1, "10", "10", oct), rec("gw", 1, "acme", 2, "11", "1", oct))
			e.now = time.Date(2026, 11, 1, 12, 0, 0, 0, time.UTC) // October is in grace
			if r := e.run(reconcile.Options{Period: "2026-10-01"}); r.Status != reconcile.StatusClean {
				t.Fatalf("run: %s %+v", r.Status, r.Findings)
			}
			c.after(e)
			e.now = time.Date(2026, 11, 3, 0, 0, 0, 0, time.UTC)
			st, err := e.close("acme", "2026-10-01")
			if c.refuse == "" {
				if err != nil || !st.Final || st.Lines[0].Billed.String() != "11" {
					t.Fatalf("close: %v %+v", err, st)
				}
				return
			}
			if !errors.Is(err, periods.ErrNotReconciled) || !strings.Contains(err.Error(), c.refuse) {
				t.Fatalf("close after a new %s: %v", c.name, err)
			}
		})
	}
}

// TestCloseInGraceNeedsForce: a close before the grace has ended is
// refused unless forced, and a forced one records reason and actor.
func TestCloseInGraceNeedsForce(t *testing.T) {
	e := newEnv(t)
	oct := time.Date(2026, 10, 10, 0, 0, 0, 0, time.UTC)
	e.apply(rec("gw", 1, "acme", 1, "10", "10", oct))
	e.now = time.Date(2026, 11, 1, 12, 0, 0, 0, time.UTC) // October is in grace
	if r := e.run(reconcile.Options{Period: "2026-10-01"}); r.Status != reconcile.StatusClean {
		t.Fatalf("run: %s", r.Status)
	}
	if _, err := e.close("acme", "2026-10-01"); !errors.Is(err, periods.ErrInGrace) {
		t.Fatalf("close in grace: %v", err)
	}
	store := periods.Store{Clock: func() time.Time { return e.now }, Gate: reconcile.Gate}
	var st periods.Statement
	err := pgx.BeginFunc(context.Background(), e.pool, func(tx pgx.Tx) error {
		var err error
		st, err = store.Close(context.Background(), tx, periods.CloseRequest{Customer: "acme", Period: "2026-10-01",
			Force: true, Reason: "invoice run moved up", Actor: "alice"})
		return err
	})
	if err != nil || !st.Forced || st.Reason != "invoice run moved up" || st.Actor != "alice" {
		t.Fatalf("forced close in grace: %v %+v", err, st)
	}
}

// TestNightlyClosesEmptyPeriods: a customer anchored on the 15th with usage
// in August and October has every ended period closed by the nightly run,
// September (no usage) included; September usage that arrives later is a
// prior-period adjustment, never a new statement for September.
func TestNightlyClosesEmptyPeriods(t *testing.T) {
	e := newEnv(t)
	e.exec(`INSERT INTO customers (id, schedule) VALUES ('mid', '[{"effective_from":"0001-01-01T00:00:00Z","calendar":{"cadence":"monthly","anchor_day":15,"anchor_time":"00:00","zone":"UTC"}}]')`)
	e.now = time.Date(2026, 8, 20, 0, 0, 0, 0, time.UTC)
	e.apply(rec("gw", 1, "mid", 1, "10", "10", e.now))
	e.now = time.Date(2026, 10, 20, 0, 0, 0, 0, time.UTC)
	e.apply(rec("gw", 1, "mid", 2, "15", "5", e.now))
	e.now = time.Date(2026, 11, 20, 0, 0, 0, 0, time.UTC)
	if _, err := e.rc.Nightly(context.Background()); err != nil {
		t.Fatal(err)
	}
	store := periods.Store{Clock: func() time.Time { return e.now }}
	for p, want := range map[string]string{"2026-08-15": "10", "2026-09-15": "", "2026-10-15": "5"} {
		st, err := store.Statement(context.Background(), e.pool, "mid", p)
		if err != nil || !st.Final {
			t.Fatalf("%s: not closed: %v %+v", p, err, st)
		}
		got := ""
		for _, l := range st.Lines {
			got += l.Billed.String()
		}
		if got != want {
			t.Errorf("%s billed %q, want %q", p, got, want)
		}
	}
	// Late September usage: a prior-period adjustment in the current period.
	o := e.apply(rec("gw", 1, "mid", 3, "18", "3", time.Date(2026, 9, 20, 0, 0, 0, 0, time.UTC)))
	if !o[0].Period.Equal(time.Date(2026, 11, 15, 0, 0, 0, 0, time.UTC)) {
		t.Fatalf("late September usage booked in %s", o[0].Period)
	}
	st, _ := store.Statement(context.Background(), e.pool, "mid", "2026-09-15")
	if len(st.Lines) != 0 {
		t.Fatalf("September's statement changed: %+v", st)
	}
}

// TestRunLockIsOnTheResolvedPeriod: "previous" and the date it resolves
// to are the same period; two runs of it never overlap.
func TestRunLockIsOnTheResolvedPeriod(t *testing.T) {
	e := newEnv(t)
	e.apply(rec("gw", 1, "acme", 1, "10", "10", time.Date(2026, 10, 10, 0, 0, 0, 0, time.UTC)))
	ctx := context.Background()
	// Hold the lock a run of 2026-10-01 takes, from another session.
	conn, err := e.pool.Acquire(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Release()
	if _, err := conn.Exec(ctx, `SELECT pg_advisory_lock(71541, hashtext('2026-10-01'))`); err != nil {
		t.Fatal(err)
	}
	defer conn.Exec(ctx, `SELECT pg_advisory_unlock(71541, hashtext('2026-10-01'))`)
	if _, err := e.rc.Run(ctx, reconcile.Options{Period: "previous"}); !errors.Is(err, reconcile.ErrBusy) {
		t.Fatalf("run of previous while 2026-10-01 runs: %v", err)
	}
}

// TestGateSeesTheGaugeReadingsThatBearOnThePeriod: the close gate reads a
// gauge's readings as reconciliation does (the period's, and each stream's
// last before it and first), not its whole history. A late reading that
// can change October is seen: one stamped before October 1 that is now
// the last there (the level October carries in), one in October, and the
// first of a newer epoch in October (it ends the older epoch's level). One
// stamped before October 1 that a later reading already superseded cannot
// change October, and the close goes ahead.
func TestGateSeesTheGaugeReadingsThatBearOnThePeriod(t *testing.T) {
	sep := time.Date(2026, 9, 1, 0, 0, 0, 0, time.UTC)
	oct := time.Date(2026, 10, 10, 0, 0, 0, 0, time.UTC)
	epoch2 := func(seq int64, v string, at time.Time) ledger.Record {
		r := level("a", seq, v, at)
		r.Stream.Epoch = 2
		return r
	}
	cases := []struct {
		name   string
		late   ledger.Record
		refuse bool
	}{
		{"a new last reading before the period", level("a", 4, "7", sep.Add(25*24*time.Hour)), true},
		{"a reading in the period", level("a", 6, "7", oct.Add(48*time.Hour)), true},
		{"a newer epoch's first reading in the period", epoch2(1, "1", oct.Add(24*time.Hour)), true},
		{"a superseded reading before the period", level("a", 2, "7", sep.Add(5*24*time.Hour)), false},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			e := newEnv(t)
			e.declare("seats", ledger.Gauge)
			// Seqs 2 and 4 are missing at the run: seq 3 (September 10) is
			// the level October carries in, seq 5 its change on the 10th.
			e.apply(level("a", 1, "4", sep), level("a", 3, "5", sep.Add(9*24*time.Hour)), level("a", 5, "6", oct))
			e.now = time.Date(2026, 11, 1, 12, 0, 0, 0, time.UTC) // October is in grace
			if r := e.run(reconcile.Options{Period: "2026-10-01"}); r.Status != reconcile.StatusClean {
				t.Fatalf("run: %s %+v", r.Status, r.Findings)
			}
			if o := e.apply(c.late); o[0].Kind != ledger.Applied && o[0].Kind != ledger.LateFill {
				t.Fatalf("late reading: %v %s", o[0].Kind, o[0].Detail)
			}
			e.now = time.Date(2026, 11, 3, 0, 0, 0, 0, time.UTC)
			_, err := e.close("acme", "2026-10-01")
			if !c.refuse {
				if err != nil {
					t.Fatalf("close: %v", err)
				}
				return
			}
			if !errors.Is(err, periods.ErrNotReconciled) || !strings.Contains(err.Error(), "gauge or unique readings") {
				t.Fatalf("close after %s: %v", c.name, err)
			}
		})
	}
}

// TestGateAsksForANewRunAfterTheGaugeCountChanged: a run stored before the
// gate counted gauge readings as it does now (every reading before the
// period's end, "3:0") cannot be compared with the count of today: the
// close asks for a new run, saying why, and closes after it.
func TestGateAsksForANewRunAfterTheGaugeCountChanged(t *testing.T) {
	e := newEnv(t)
	e.declare("seats", ledger.Gauge)
	sep := time.Date(2026, 9, 1, 0, 0, 0, 0, time.UTC)
	e.apply(level("a", 1, "4", sep), level("a", 2, "5", sep.Add(9*24*time.Hour)), level("a", 3, "6", time.Date(2026, 10, 10, 0, 0, 0, 0, time.UTC)))
	e.now = time.Date(2026, 11, 1, 12, 0, 0, 0, time.UTC)
	if r := e.run(reconcile.Options{Period: "2026-10-01"}); r.Status != reconcile.StatusClean {
		t.Fatalf("run: %s %+v", r.Status, r.Findings)
	}
	e.exec(`UPDATE reconciliation_verdicts SET fingerprint = jsonb_set(fingerprint::jsonb, '{kinds}', '"3:0"')`)
	e.now = time.Date(2026, 11, 3, 0, 0, 0, 0, time.UTC)
	if _, err := e.close("acme", "2026-10-01"); !errors.Is(err, periods.ErrNotReconciled) || !strings.Contains(err.Error(), "gauge readings are counted differently since the run") {
		t.Fatalf("close on a run of the build before: %v", err)
	}
	if r := e.run(reconcile.Options{Period: "2026-10-01"}); r.Status != reconcile.StatusClean {
		t.Fatalf("new run: %s %+v", r.Status, r.Findings)
	}
	if _, err := e.close("acme", "2026-10-01"); err != nil {
		t.Fatalf("close after a new run: %v", err)
	}
}

// TestGateRefusesAGaugeAdjustmentBilledSinceTheRun: a late gauge reading
// of a closed period bills the level-seconds it changed there in the
// first period not closed (prior_period_unit_seconds). When it arrives
// after that period's clean run, without touching the period's own
// level, the run did not see what the close would freeze: reconcile
// again. The next run lets it close, with the adjustment on the statement.
func TestGateRefusesAGaugeAdjustmentBilledSinceTheRun(t *testing.T) {
	e := newEnv(t)
	e.declare("seats", ledger.Gauge)
	sep := func(d int) time.Time { return time.Date(2026, 9, d, 0, 0, 0, 0, time.UTC) }
	e.now = sep(20)
	e.apply(level("a", 1, "5", sep(5)), level("a", 3, "7", sep(20))) // seq 2 not arrived yet
	e.now = time.Date(2026, 10, 10, 0, 0, 0, 0, time.UTC)
	e.apply(level("a", 4, "8", e.now))
	store := periods.Store{Clock: func() time.Time { return e.now }, Gate: reconcile.Gate, Kinds: ledger.StatementKinds}
	closeP := func(req periods.CloseRequest) (periods.Statement, error) {
		var st periods.Statement
		err := pgx.BeginFunc(context.Background(), e.pool, func(tx pgx.Tx) error {
			var err error
			st, err = store.Close(context.Background(), tx, req)
			return err
		})
		return st, err
	}
	if _, err := closeP(periods.CloseRequest{Customer: "acme", Period: "2026-09-01", Force: true, Reason: "test", Actor: "tester"}); err != nil {
		t.Fatal(err)
	}
	e.now = time.Date(2026, 11, 1, 12, 0, 0, 0, time.UTC) // October is in grace
	if r := e.run(reconcile.Options{Period: "2026-10-01"}); r.Status != reconcile.StatusClean {
		t.Fatalf("run: %s %+v", r.Status, r.Findings)
	}
	// Seq 2 lies between September's readings: October's level is as it was.
	e.apply(level("a", 2, "100", sep(10)))
	e.now = time.Date(2026, 11, 3, 0, 0, 0, 0, time.UTC)
	st, err := closeP(periods.CloseRequest{Customer: "acme", Period: "2026-10-01"})
	if !errors.Is(err, periods.ErrNotReconciled) || !strings.Contains(err.Error(), "gauge prior-period adjustments") {
		t.Fatalf("close after a prior-period gauge adjustment billed in October since its run: %v %+v", err, st.Gauges)
	}
	if r := e.run(reconcile.Options{Period: "2026-10-01"}); r.Status != reconcile.StatusClean {
		t.Fatalf("second run: %s %+v", r.Status, r.Findings)
	}
	st, err = closeP(periods.CloseRequest{Customer: "acme", Period: "2026-10-01"})
	if err != nil || len(st.Gauges) != 1 || st.Gauges[0].PriorPeriodUnitSeconds.String() != "82080000" { // (100-5) × 10 days
		t.Fatalf("close after the second run: %v %+v", err, st.Gauges)
	}
}
