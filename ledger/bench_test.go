package ledger_test

import (
	"context"
	"fmt"
	"math/rand/v2"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgtype"
	"github.com/shopspring/decimal"

	"github.com/tally-ledger/tally/ledger"
)

// BenchmarkApply measures Apply on micro-batches of unique records and of
// 30% duplicates, and, in the same run, a plain COPY of the same rows into a
// table shaped like records (same columns, same indexes) as the baseline.
// Each op is one micro-batch committed in its own transaction; records/s is
// the figure to compare.
//
//	go test ./ledger -run '^$' -bench Apply -benchtime 20x
func BenchmarkApply(b *testing.B) {
	for _, size := range []int{1000, 10000} {
		b.Run(fmt.Sprintf("copy/%d", size), func(b *testing.B) { benchCopy(b, size) })
		b.Run(fmt.Sprintf("unique/%d", size), func(b *testing.B) { benchApply(b, size, 0) })
		b.Run(fmt.Sprintf("dup30/%d", size), func(b *testing.B) { benchApply(b, size, 0.3) })
	}
}

// workload produces micro-batches over 200 streams (100 customers × 2
// meters), each advancing every stream in order, like one Kafka partition.
type workload struct {
	streams []recBuilder
	seq     []int64
	total   []decimal.Decimal
	sent    []ledger.Record
	rng     *rand.Rand
	at      time.Time
}

func newWorkload() *workload {
	w := &workload{rng: rand.New(rand.NewPCG(1, 2)), at: time.Date(2026, 11, 10, 0, 0, 0, 0, time.UTC)}
	for c := 0; c < 100; c++ {
		for _, m := range []string{"api_calls", "bytes"} {
			w.streams = append(w.streams, recBuilder{"gw-1", 1, fmt.Sprintf("cust-%03d", c), m})
		}
	}
	w.seq = make([]int64, len(w.streams))
	w.total = make([]decimal.Decimal, len(w.streams))
	return w
}

func (w *workload) batch(n int, dupShare float64) []ledger.Record {
	out := make([]ledger.Record, 0, n)
	for len(out) < n {
		if len(w.sent) > 0 && w.rng.Float64() < dupShare {
			out = append(out, w.sent[w.rng.IntN(len(w.sent))])
			continue
		}
		i := w.rng.IntN(len(w.streams))
		q := decimal.New(w.rng.Int64N(1_000_000), -3)
		w.seq[i]++
		w.total[i] = w.total[i].Add(q)
		w.at = w.at.Add(time.Millisecond)
		r := w.streams[i].recQ(w.seq[i], w.total[i].String(), q.String(), w.at)
		out = append(out, r)
	}
	w.sent = append(w.sent[:0], out...) // duplicates come from the previous batch, like a redelivery
	return out
}

func benchApply(b *testing.B, size int, dupShare float64) {
	f := newFixture(b)
	f.now = time.Date(2026, 11, 20, 0, 0, 0, 0, time.UTC)
	w := newWorkload()
	f.apply(w.batch(size, 0)...) // streams and customers exist, like a warm ledger
	batches := make([][]ledger.Record, b.N)
	for i := range batches {
		batches[i] = w.batch(size, dupShare)
	}
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		f.apply(batches[i]...)
	}
	b.ReportMetric(float64(size*b.N)/b.Elapsed().Seconds(), "records/s")
}

func benchCopy(b *testing.B, size int) {
	f := newFixture(b)
	ctx := context.Background()
	f.exec(`CREATE TABLE records_copy (LIKE records INCLUDING ALL)`)
	w := newWorkload()
	ids := map[ledger.StreamKey]int64{}
	for i, s := range w.streams {
		ids[ledger.StreamKey{Producer: s.producer, Epoch: s.epoch, Customer: s.customer, Meter: s.meter}] = int64(i + 1)
	}
	rows := make([][][]any, b.N)
	for i := range rows {
		for _, r := range w.batch(size, 0) {
			rows[i] = append(rows[i], []any{ids[r.Stream], r.Seq, pgtype.UUID{Bytes: r.OperationID, Valid: true}, r.Stream.Customer, r.Stream.Meter,
				numeric(r.Total), numeric(r.Quantity.Decimal), r.OccurredAt, false, false, numeric(r.Quantity.Decimal),
				r.OccurredAt, r.OccurredAt.Truncate(time.Hour), nil, f.now})
		}
	}
	cols := []string{"stream_id", "seq", "operation_id", "customer", "meter", "total", "quantity", "occurred_at",
		"final", "late_fill", "billed", "period_start", "bucket", "prior_period", "ingested_at"}
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		err := pgx.BeginFunc(ctx, f.pool, func(tx pgx.Tx) error {
			_, err := tx.CopyFrom(ctx, pgx.Identifier{"records_copy"}, cols, pgx.CopyFromRows(rows[i]))
			return err
		})
		if err != nil {
			b.Fatal(err)
		}
	}
	b.ReportMetric(float64(size*b.N)/b.Elapsed().Seconds(), "records/s")
}

func numeric(d decimal.Decimal) pgtype.Numeric {
	return pgtype.Numeric{Int: d.Coefficient(), Exp: d.Exponent(), Valid: true}
}
