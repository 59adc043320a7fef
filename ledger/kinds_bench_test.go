package ledger_test

import (
	"context"
	"fmt"
	"strconv"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/shopspring/decimal"

	"github.com/tally-ledger/tally/ledger"
	"github.com/tally-ledger/tally/periods"
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

// BenchmarkReadKinds measures a customer's uncached gauge read
// (ledger.ReadKinds, what a usage answer and a statement read) beside a
// counter's (its daily rollups, what the usage answer reads for a
// counter), over one monthly period: a gauge and a counter with a reading
// every minute for 29.5 days (42,480 each), a gauge with 72 readings over
// the period's first 36 hours, and the long gauge read while its last
// readings are stamped ahead of now (within ledger.MaxClockSkew, as a
// producer whose clock runs ahead leaves them). The read's cost must not
// grow with the number of readings or the period's length (docs/design.md
// §16). Setup takes about half a minute; compare ns/op.
//
//	go test ./ledger -run '^$' -bench ReadKinds -benchtime 2000x
func BenchmarkReadKinds(b *testing.B) {
	ctx := context.Background()
	f := newFixture(b)
	start := time.Date(2026, 11, 1, 0, 0, 0, 0, time.UTC)
	now := start.Add(29*24*time.Hour + 12*time.Hour)
	f.now = now
	if err := f.declare("seats", ledger.Gauge); err != nil {
		b.Fatal(err)
	}
	long, short := recBuilder{"gw", 1, "long", "seats"}, recBuilder{"gw", 1, "short", "seats"}
	calls := recBuilder{"gw", 1, "long", "api_calls"}
	const ahead = 3 // the long gauge's readings stamped after now
	var recs []ledger.Record
	flush := func() {
		f.apply(recs...)
		recs = recs[:0]
	}
	n := int64(now.Sub(start)/time.Minute) + ahead
	for i := int64(0); i < n; i++ {
		at := start.Add(time.Duration(i) * time.Minute)
		recs = append(recs, long.level(i+1, strconv.FormatInt(1+(i*7919)%100, 10), at))
		if !at.After(now) {
			recs = append(recs, calls.recQ(i+1, strconv.FormatInt(3*(i+1), 10), "3", at))
		}
		if len(recs) >= 2000 {
			flush()
		}
	}
	for i := int64(0); i < 72; i++ {
		recs = append(recs, short.level(i+1, strconv.FormatInt(1+i%50, 10), start.Add(time.Duration(i)*30*time.Minute)))
	}
	flush()
	sch, err := periods.Store{}.Schedule(ctx, f.pool, "long")
	if err != nil {
		b.Fatal(err)
	}
	p, err := sch.Resolve("current", now)
	if err != nil {
		b.Fatal(err)
	}
	f.exec(`VACUUM ANALYZE`)
	gauge := func(customer string, at time.Time) func(b *testing.B) {
		return func(b *testing.B) {
			for b.Loop() {
				k, err := ledger.ReadKinds(ctx, f.pool, customer, "", p, at)
				if err != nil {
					b.Fatal(err)
				}
				if g := k.Gauges(at); len(g) != 1 || g[0].Max.Sign() <= 0 {
					b.Fatalf("%s: %+v", customer, g)
				}
			}
		}
	}
	b.Run("counter/42480-records-30-days", func(b *testing.B) {
		for b.Loop() {
			rows, err := f.pool.Query(ctx, `SELECT day, quantity::text FROM rollups_daily
WHERE customer = $1 AND period_start = $2 AND meter = $3 ORDER BY day`, "long", p.Start, "api_calls")
			if err != nil {
				b.Fatal(err)
			}
			var day time.Time
			var q string
			days, err := pgx.ForEachRow(rows, []any{&day, &q}, func() error { return nil })
			if err != nil || days.RowsAffected() != 30 {
				b.Fatalf("%v, %d days", err, days.RowsAffected())
			}
		}
	})
	b.Run("gauge/72-readings-2-days", gauge("short", now))
	b.Run("gauge/42480-readings-30-days", gauge("long", now.Add(ahead*time.Minute)))
	b.Run("gauge/42480-readings-30-days-last-ahead-of-now", gauge("long", now))
}
