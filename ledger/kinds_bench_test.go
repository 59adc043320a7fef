package ledger_test

import (
	"fmt"
	"testing"
	"time"

	"github.com/shopspring/decimal"

	"github.com/tally-ledger/tally/ledger"
)

// BenchmarkApplyKinds measures Apply on micro-batches of counter, gauge and
// unique records in one run, over the same 200 streams advancing in order
// (docs/design.md §16's target: gauge and unique ingest at least 0.8 ×
// counter ingest). Compare records/s.
//
//	go test ./ledger -run '^$' -bench ApplyKinds -benchtime 20x
func BenchmarkApplyKinds(b *testing.B) {
	for _, size := range []int{1000} {
		for _, kind := range []ledger.MeterKind{ledger.Counter, ledger.Gauge, ledger.Unique} {
			b.Run(fmt.Sprintf("%s/%d", kind, size), func(b *testing.B) { benchApplyKind(b, size, kind) })
		}
	}
}

func benchApplyKind(b *testing.B, size int, kind ledger.MeterKind) {
	f := newFixture(b)
	f.now = time.Date(2026, 11, 20, 0, 0, 0, 0, time.UTC)
	w := newWorkload()
	for _, m := range []string{"api_calls", "bytes"} {
		if err := f.declare(m, kind); err != nil {
			b.Fatal(err)
		}
	}
	shape := func(rs []ledger.Record) []ledger.Record {
		for i := range rs {
			r := &rs[i]
			switch kind {
			case ledger.Gauge:
				r.Shape, r.Level = ledger.Gauge, decimal.New(w.rng.Int64N(1000), 0)
			case ledger.Unique:
				r.Shape, r.Member = ledger.Unique, fmt.Sprintf("user-%d", w.rng.IntN(5000))
			}
		}
		return rs
	}
	f.apply(shape(w.batch(size, 0))...)
	batches := make([][]ledger.Record, b.N)
	for i := range batches {
		batches[i] = shape(w.batch(size, 0))
	}
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		f.apply(batches[i]...)
	}
	b.ReportMetric(float64(size*b.N)/b.Elapsed().Seconds(), "records/s")
}
