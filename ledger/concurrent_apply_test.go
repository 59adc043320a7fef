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
// of any size, each record several times, out of order across the streams
// of four customers, counters, a unique meter and a gauge mixed in one
// batch. A transaction the database aborts for a deadlock or a
// serialization failure is applied again, as ingest does; any other error
// fails. Afterwards every record is applied once: each customer's billed
// usage and rollups are its counters' final totals, its members are
// counted once in the period and the day, and its gauge's max, latest and
// unit-seconds are those of its readings in seq order.
func TestTwoLedgersApplyingOverlappingBatchesAtOnce(t *testing.T) {
	f := newFixture(t)
	other, err := ledger.New(ledger.Config{Clock: func() time.Time { return f.now }})
	if err != nil {
		t.Fatal(err)
	}
	ledgers := []*ledger.Ledger{f.l, other}
	if err := f.declare("mau", ledger.Unique); err != nil {
		t.Fatal(err)
	}
	if err := f.declare("seats", ledger.Gauge); err != nil {
		t.Fatal(err)
	}
	// Per customer three counter streams, a unique meter's and a gauge's.
	customers := []string{"c0", "c1", "c2", "c3"}
	var streams []recBuilder
	for _, c := range customers {
		for p := range 3 {
			streams = append(streams, recBuilder{fmt.Sprintf("gw-%d", p), 1, c, []string{"api_calls", "bytes"}[p%2]})
		}
		streams = append(streams, recBuilder{"gw-u", 1, c, "mau"}, recBuilder{"gw-g", 1, c, "seats"})
	}
	const n = 100
	// A stream's records in seq order (a unique meter's: 30 members, each
	// seen several times).
	records := func(s recBuilder) []ledger.Record {
		var recs []ledger.Record
		for seq := int64(1); seq <= n; seq++ {
			at := nov.Add(time.Duration(seq) * time.Minute)
			switch s.meter {
			case "mau":
				recs = append(recs, s.member(seq, fmt.Sprintf("user-%d", seq%30), at))
			case "seats":
				recs = append(recs, s.level(seq, fmt.Sprint(seq%7), at))
			default:
				recs = append(recs, s.rec(seq, fmt.Sprint(seq), at))
			}
		}
		return recs
	}
	var all []ledger.Record
	for _, s := range streams {
		all = append(all, records(s)...)
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
		f.apply(records(s)...)
	}
	t.Logf("transactions applied again: %v", retries)
	// The gauge's aggregates are those of its readings in seq order, each
	// level held a minute, the last one until now.
	var unitSeconds int64
	for seq := int64(1); seq < n; seq++ {
		unitSeconds += seq % 7 * 60
	}
	unitSeconds += n % 7 * int64(f.now.Sub(nov.Add(n*time.Minute))/time.Second)
	for _, c := range customers {
		if g := f.gauge(c, "seats", "2026-11-01"); g.Max.String() != "6" || g.Latest.String() != fmt.Sprint(n%7) ||
			g.UnitSeconds.String() != fmt.Sprint(unitSeconds) {
			t.Errorf("%s: gauge max %s latest %s unit-seconds %s, want 6, %d, %d", c, g.Max, g.Latest, g.UnitSeconds, n%7, unitSeconds)
		}
		for sql, want := range map[string]string{
			`SELECT trim_scale(sum(quantity))::text FROM rollups WHERE customer = $1`:                                   fmt.Sprint(3 * n),
			`SELECT trim_scale(sum(billed))::text FROM records WHERE customer = $1`:                                     fmt.Sprint(3 * n),
			`SELECT string_agg(per_day || ':' || members, ' ' ORDER BY per_day) FROM unique_counts WHERE customer = $1`: "false:30 true:30",
			`SELECT count(*)::text FROM unique_readings WHERE customer = $1`:                                            fmt.Sprint(n),
			`SELECT count(*)::text FROM gauge_readings g JOIN gauge_streams s USING (stream_id) WHERE s.customer = $1`:  fmt.Sprint(n),
		} {
			if got := f.scalar(sql, c); got != want {
				t.Errorf("%s: %s = %s, want %s", c, sql, got, want)
			}
		}
	}
}
