package reconcile_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"

	"github.com/tally-ledger/tally/amount"
	"github.com/tally-ledger/tally/ledger"
	"github.com/tally-ledger/tally/reconcile"
)

func (e *env) declare(meter string, kind ledger.MeterKind) {
	e.t.Helper()
	if err := pgx.BeginFunc(context.Background(), e.pool, func(tx pgx.Tx) error {
		_, err := ledger.DeclareMeter(context.Background(), tx, ledger.Meter{Meter: meter, Kind: kind}, e.now)
		return err
	}); err != nil {
		e.t.Fatal(err)
	}
}

func reading(producer, meter string, seq int64, at time.Time) ledger.Record {
	return ledger.Record{OperationID: uuid.New(), Stream: ledger.StreamKey{Producer: producer, Epoch: 1, Customer: "acme", Meter: meter},
		Seq: seq, OccurredAt: at}
}

func level(producer string, seq int64, v string, at time.Time) ledger.Record {
	r := reading(producer, "seats", seq, at)
	r.Shape, r.Level = ledger.Gauge, amount.MustParse(v)
	return r
}

func member(seq int64, m string, at time.Time) ledger.Record {
	r := reading("auth", "mau", seq, at)
	r.Shape, r.Member = ledger.Unique, m
	return r
}

// Reconciliation recomputes gauges from their readings and recounts
// unique members: a clean ledger is clean; a closed period's late
// readings are notices (the statement stays, the level-seconds moved
// later add up); a bucket or count that disagrees with the readings is a
// discrepancy.
func TestGaugesAndUniquesAreReconciled(t *testing.T) {
	e := newEnv(t)
	e.declare("seats", ledger.Gauge)
	e.declare("mau", ledger.Unique)
	oct := time.Date(2026, 10, 10, 0, 0, 0, 0, time.UTC)
	e.apply(level("a", 1, "4", oct), level("a", 3, "2", oct.Add(48*time.Hour)), member(1, "u1", oct), member(2, "u2", oct))
	r := e.run(reconcile.Options{Period: "2026-10-01", Close: true})
	if r.Status != reconcile.StatusClean || len(r.Closed) != 1 {
		t.Fatalf("october: %s closed %v %+v", r.Status, r.Closed, r.Findings)
	}
	// After the close: seq 2 (9 seats for a day) and a third user.
	e.apply(level("a", 2, "9", oct.Add(24*time.Hour)), member(3, "u3", oct.Add(time.Hour)))
	r = e.run(reconcile.Options{Period: "2026-10-01"})
	if got := findings(t, r, reconcile.KindGaugeMaxClosed); len(got) != 1 {
		t.Fatalf("max after close: %+v", r.Findings)
	}
	if got := findings(t, r, reconcile.KindUniqueClosed); len(got) != 1 {
		t.Fatalf("members after close: %+v", r.Findings)
	}
	// November: clean, then a bucket and a count that lie.
	e.apply(level("a", 4, "1", nov), member(4, "u1", nov))
	if r = e.run(reconcile.Options{Period: "2026-11-01"}); r.Status != reconcile.StatusClean {
		t.Fatalf("november: %s %+v", r.Status, r.Findings)
	}
	e.exec(`UPDATE gauge_days SET unit_seconds = unit_seconds + 1 WHERE day_start >= '2026-11-05'`)
	e.exec(`UPDATE unique_counts SET members = members + 1 WHERE period_start = '2026-11-01' AND NOT per_day`)
	r = e.run(reconcile.Options{Period: "2026-11-01"})
	var kinds []string
	for _, f := range r.Findings {
		if f.Severity == reconcile.Discrepancy {
			kinds = append(kinds, f.Kind)
		}
	}
	if len(kinds) != 2 || kinds[0] != reconcile.KindGaugeMismatch || kinds[1] != reconcile.KindUniqueMismatch {
		t.Fatalf("discrepancies %v: %+v", kinds, r.Findings)
	}
	// A reading counted in a period its occurred_at is not in: the count
	// stays, the recount does not see the member there.
	e.exec(`UPDATE gauge_days SET unit_seconds = unit_seconds - 1 WHERE day_start >= '2026-11-05'`)
	e.exec(`UPDATE unique_counts SET members = members - 1 WHERE period_start = '2026-11-01' AND NOT per_day`)
	if r = e.run(reconcile.Options{Period: "2026-11-01"}); len(findings(t, r, reconcile.KindUniqueMismatch)) != 0 {
		t.Fatalf("november, count mended: %+v", r.Findings)
	}
	e.exec(`UPDATE unique_readings SET occurred_at = occurred_at - interval '40 days' WHERE period_start = '2026-11-01'`)
	r = e.run(reconcile.Options{Period: "2026-11-01"})
	if got := findings(t, r, reconcile.KindUniqueMismatch); len(got) != 1 {
		t.Fatalf("a reading outside its period: %+v", r.Findings)
	}
}

// Reconciling a period reads the gauge readings that period needs (those
// in it, and each stream's last before it), not the meter's whole history:
// a gauge read every few minutes for years would otherwise make every
// customer's nightly check read, and hold in memory, millions of rows.
// Two streams (an epoch and the producer's next) hold 3,000 hourly
// readings before November and a handful in it.
func TestAPeriodsGaugeCheckReadsThatPeriod(t *testing.T) {
	e := newEnv(t)
	e.declare("seats", ledger.Gauge)
	start := time.Date(2026, 6, 1, 0, 0, 0, 0, time.UTC)
	var old []ledger.Record
	for i := range int64(3000) {
		old = append(old, level("a", i+1, fmt.Sprint(1+i%7), start.Add(time.Duration(i)*time.Hour)))
		if len(old) == 500 {
			e.apply(old...)
			old = nil
		}
	}
	e.apply(old...)
	// A newer epoch of the same producer starts in November, ending the
	// first one's level there; the first epoch's last reading carries in.
	next := level("a", 1, "5", nov)
	next.Stream.Epoch = 2
	e.apply(next, level("b", 1, "3", nov.Add(time.Hour)), level("b", 2, "4", nov.Add(48*time.Hour)))
	e.indexesOnly()
	var r *reconcile.Run
	read := e.readsOf("gauge_readings", func() { r = e.run(reconcile.Options{Period: "2026-11-01"}) })
	if r.Status != reconcile.StatusClean {
		t.Fatalf("november: %s %+v", r.Status, r.Findings)
	}
	t.Logf("reconciling November read %d gauge readings", read)
	if read == 0 || read > 50 {
		t.Fatalf("reconciling November read %d gauge readings, want the few it needs (at least one, at most 50)", read)
	}
}
