package reconcile_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/tally-ledger/tally/ledger"
	"github.com/tally-ledger/tally/reconcile"
)

// TestGaugeCheckHoldsNoReadingsInMemory: the gauge check recomputes a
// period's level-seconds from the readings of each stream in it, which
// grow with the period and how often a gauge is read (every 10 seconds is
// 260,000 readings a month per stream). What a run keeps in memory must
// not grow with them: here 100,000 readings of two producers in one
// period, which as Go values took 26 MB; the run's live heap may grow
// by 6 MB at most (it grows by under 1 MB).
func TestGaugeCheckHoldsNoReadingsInMemory(t *testing.T) {
	const perProducer = 50_000
	e := newEnv(t)
	e.declare("seats", ledger.Gauge)
	for _, producer := range []string{"a", "b"} {
		var rs []ledger.Record
		for i := range int64(perProducer) {
			rs = append(rs, level(producer, i+1, fmt.Sprint(1+i%9), nov.Add(time.Duration(i)*10*time.Second)))
			if len(rs) == 5000 {
				e.apply(rs...)
				rs = rs[:0]
			}
		}
		e.apply(rs...)
	}

	var r *reconcile.Run
	var err error
	before, grew, took := heapGrowth(func() { r, err = e.rc.Run(context.Background(), reconcile.Options{Period: "2026-11-01"}) })
	if err != nil || r.Status != reconcile.StatusClean || len(r.Findings) > 0 {
		t.Fatalf("run: %v %s %+v", err, r.Status, r.Findings)
	}
	t.Logf("live heap %d MB before the run, grew by at most %.1f MB during it (%s)", before>>20, float64(grew)/(1<<20), took)
	if grew > 6<<20 {
		t.Fatalf("the run's live heap grew by %.1f MB for %d gauge readings: it holds the readings in memory",
			float64(grew)/(1<<20), 2*perProducer)
	}
}
