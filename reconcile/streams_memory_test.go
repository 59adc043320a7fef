package reconcile_test

import (
	"context"
	"fmt"
	"testing"

	"github.com/tally-ledger/tally/ledger"
	"github.com/tally-ledger/tally/reconcile"
)

// TestStreamCheckHoldsNoStreamsInMemory: the stream check reads every
// stream of the run's customers, and a stream is never deleted: every
// epoch of every producer (a gateway closed at each deploy starts new
// streams) stays. What a run keeps in memory must not grow with them:
// here 60,000 streams of 300 customers, which as Go values took 21 MB;
// the run's live heap may grow by 6 MB at most (it grows by under 1 MB).
func TestStreamCheckHoldsNoStreamsInMemory(t *testing.T) {
	const customers, epochs = 300, 200
	e := newEnv(t)
	var recs []ledger.Record
	for c := range customers {
		for ep := int64(1); ep <= epochs; ep++ {
			r := rec("gw", ep, fmt.Sprintf("c%03d", c), 1, fmt.Sprintf("%d.5", ep), "", nov)
			r.Final = true // each epoch closed by its producer, none abandoned
			recs = append(recs, r)
		}
		if len(recs) >= 10_000 {
			e.apply(recs...)
			recs = recs[:0]
		}
	}
	e.apply(recs...)
	recs = nil

	for run := range 2 { // the first run sums every stream whole, the second from its check
		var r *reconcile.Run
		var err error
		before, grew, took := heapGrowth(func() { r, err = e.rc.Run(context.Background(), reconcile.Options{Period: "2026-11-01"}) })
		if err != nil || r.Status != reconcile.StatusClean || len(r.Findings) > 0 {
			t.Fatalf("run %d: %v %s %+v", run+1, err, r.Status, r.Findings)
		}
		var checked int
		if err := e.pool.QueryRow(context.Background(), `SELECT count(*) FROM stream_checks`).Scan(&checked); err != nil {
			t.Fatal(err)
		}
		if checked != customers*epochs {
			t.Fatalf("run %d: %d streams found adding up, want %d", run+1, checked, customers*epochs)
		}
		t.Logf("run %d: live heap %d MB before, grew by at most %.1f MB during it (%s)", run+1, before>>20, float64(grew)/(1<<20), took)
		if grew > 6<<20 {
			t.Fatalf("run %d: the run's live heap grew by %.1f MB for %d streams: it holds the streams in memory",
				run+1, float64(grew)/(1<<20), customers*epochs)
		}
	}
}
