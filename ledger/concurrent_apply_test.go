package ledger_test

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/tally-ledger/tally/ledger"
)

// Two Ledgers (two ingest members, as around a rebalance) and several
// transactions each apply the same records at once: shuffled, in batches
// of any size, each record several times, out of order across the streams of
// four customers. A transaction the database aborts for a deadlock or a
// serialization failure is applied again, as ingest does; any other error
// fails. Afterwards every record is applied once: each customer's billed
// usage and rollups are the streams' final totals.
func TestTwoLedgersApplyingOverlappingBatchesAtOnce(t *testing.T) {
	f := newFixture(t)
	other, err := ledger.New(ledger.Config{Clock: func() time.Time { return f.now }})
	if err != nil {
		t.Fatal(err)
	}
	ledgers := []*ledger.Ledger{f.l, other}
	var streams []recBuilder
	for c := range 4 {
		for p := range 3 {
			streams = append(streams, recBuilder{fmt.Sprintf("gw-%d", p), 1, fmt.Sprintf("c%d", c), []string{"api_calls", "bytes"}[p%2]})
		}
	}
	const n = 100
	var all []ledger.Record
	for _, s := range streams {
		for seq := int64(1); seq <= n; seq++ {
			all = append(all, s.rec(seq, fmt.Sprint(seq), nov))
		}
	}
	ctx := context.Background()
	var mu sync.Mutex
	retries := map[string]int{}
	var wg sync.WaitGroup
	for g := range 8 {
		wg.Go(func() {
			r := rand.New(rand.NewPCG(uint64(g), 3))
			recs := slices.Clone(all)
			r.Shuffle(len(recs), func(i, j int) { recs[i], recs[j] = recs[j], recs[i] })
			recs = recs[:len(recs)*2/3]
			for len(recs) > 0 {
				k := min(len(recs), 1+r.IntN(100))
				batch := recs[:k]
				recs = recs[k:]
				for attempt := 0; ; attempt++ {
					err := pgx.BeginFunc(ctx, f.pool, func(tx pgx.Tx) error {
						_, err := ledgers[g%2].Apply(ctx, tx, batch)
						return err
					})
					if err == nil {
						break
					}
					var pe *pgconn.PgError
					if errors.As(err, &pe) && (pe.Code == "40P01" || pe.Code == "40001") && attempt < 20 {
						mu.Lock()
						retries[pe.Code]++
						mu.Unlock()
						continue
					}
					t.Errorf("apply: %v", err)
					return
				}
			}
		})
	}
	wg.Wait()
	// Everything once more (each goroutine sent two thirds), so every seq
	// is in.
	for _, s := range streams {
		var recs []ledger.Record
		for seq := int64(1); seq <= n; seq++ {
			recs = append(recs, s.rec(seq, fmt.Sprint(seq), nov))
		}
		f.apply(recs...)
	}
	t.Logf("transactions applied again: %v", retries)
	for c := range 4 {
		if got := f.scalar(`SELECT trim_scale(sum(quantity))::text FROM rollups WHERE customer = $1`, fmt.Sprintf("c%d", c)); got != fmt.Sprint(3*n) {
			t.Errorf("c%d rollups %s, want %d", c, got, 3*n)
		}
		if got := f.scalar(`SELECT trim_scale(sum(billed))::text FROM records WHERE customer = $1`, fmt.Sprintf("c%d", c)); got != fmt.Sprint(3*n) {
			t.Errorf("c%d billed %s, want %d", c, got, 3*n)
		}
	}
}
