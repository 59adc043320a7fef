package reconcile_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"

	"github.com/tally-ledger/tally/amount"
	"github.com/tally-ledger/tally/internal/pgtest"
	"github.com/tally-ledger/tally/ledger"
	"github.com/tally-ledger/tally/reconcile"
)

// BenchmarkReconcileGaugeCustomers reconciles a period of 1,000
// customers with a counter each, and with a gauge each besides
// (gauges=true), and reports the time per customer: what the gauge check
// adds to a customer.
//
//	go test ./reconcile -run '^$' -bench ReconcileGaugeCustomers -benchtime 3x
func BenchmarkReconcileGaugeCustomers(b *testing.B) {
	for _, kinds := range []bool{false, true} {
		b.Run(fmt.Sprintf("gauges=%v", kinds), func(b *testing.B) {
			e := newEnvB(b)
			if kinds {
				e.declareB("seats", ledger.Gauge)
			}
			n := 1000
			var recs []ledger.Record
			for i := range n {
				c := fmt.Sprintf("k%d", i)
				r := ledger.Record{OperationID: uuid.New(), Stream: ledger.StreamKey{Producer: "p", Epoch: 1, Customer: c, Meter: "calls"}, Seq: 1, Total: amount.MustParse("3"), OccurredAt: nov}
				recs = append(recs, r)
				if kinds {
					g := ledger.Record{OperationID: uuid.New(), Stream: ledger.StreamKey{Producer: "p", Epoch: 1, Customer: c, Meter: "seats"}, Seq: 1, OccurredAt: nov}
					g.Shape, g.Level = ledger.Gauge, amount.MustParse("4")
					recs = append(recs, g)
				}
				if len(recs) >= 400 {
					e.applyB(recs...)
					recs = nil
				}
			}
			e.applyB(recs...)
			b.ResetTimer()
			for range b.N {
				r, err := e.rc.Run(context.Background(), reconcile.Options{Period: "2026-11-01"})
				if err != nil || r.Status != reconcile.StatusClean {
					b.Fatalf("%v %v", err, r)
				}
			}
			b.ReportMetric(float64(b.Elapsed().Microseconds())/float64(b.N*n), "µs/customer")
		})
	}
}

// envB is env for a benchmark.
type envB struct {
	b  *testing.B
	e  *env
	rc *reconcile.Reconciler
}

func newEnvB(b *testing.B) *envB {
	e := &env{pool: pgtest.New(b), now: time.Date(2026, 11, 20, 12, 0, 0, 0, time.UTC)}
	clock := func() time.Time { return e.now }
	var err error
	if e.l, err = ledger.New(ledger.Config{Clock: clock}); err != nil {
		b.Fatal(err)
	}
	if e.rc, err = reconcile.New(reconcile.Config{Pool: e.pool, Clock: clock}); err != nil {
		b.Fatal(err)
	}
	return &envB{b: b, e: e, rc: e.rc}
}

func (x *envB) declareB(meter string, kind ledger.MeterKind) {
	if err := pgx.BeginFunc(context.Background(), x.e.pool, func(tx pgx.Tx) error {
		_, err := ledger.DeclareMeter(context.Background(), tx, ledger.Meter{Meter: meter, Kind: kind}, x.e.now)
		return err
	}); err != nil {
		x.b.Fatal(err)
	}
}

func (x *envB) applyB(recs ...ledger.Record) {
	if err := pgx.BeginFunc(context.Background(), x.e.pool, func(tx pgx.Tx) error {
		_, err := x.e.l.Apply(context.Background(), tx, recs)
		return err
	}); err != nil {
		x.b.Fatal(err)
	}
}
