package reconcile_test

import (
	"context"
	"fmt"
	"testing"

	"github.com/google/uuid"

	"github.com/tally-ledger/tally/amount"
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
			e := newEnv(b)
			if kinds {
				e.declare("seats", ledger.Gauge)
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
					e.apply(recs...)
					recs = nil
				}
			}
			e.apply(recs...)
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
