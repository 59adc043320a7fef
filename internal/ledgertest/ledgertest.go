// Package ledgertest books usage through the real ledger in tests, as
// ingest would, and sets or follows the ingest position (the as_of that
// usage answers and quota decisions are complete through).
//
// Every record goes through ledger.Apply in a transaction of its own and
// must be applied: a test never writes ledger rows by hand, so what it reads
// back is what ingest would have produced.
package ledgertest

import (
	"context"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/shopspring/decimal"

	"github.com/tally-ledger/tally/ledger"
	"github.com/tally-ledger/tally/periods"
)

// Streams books usage on one stream per customer and meter (producer
// "test", epoch 1): each Use is that stream's next record, its running
// total grown by the quantity. Safe for concurrent use.
type Streams struct {
	pool *pgxpool.Pool
	led  *ledger.Ledger

	mu     sync.Mutex
	seqs   map[string]int64
	totals map[string]decimal.Decimal
}

// New books through led into pool's database.
func New(pool *pgxpool.Pool, led *ledger.Ledger) *Streams {
	return &Streams{pool: pool, led: led, seqs: map[string]int64{}, totals: map[string]decimal.Decimal{}}
}

// Use applies qty of customer's meter, occurred at at, to the ledger; any
// outcome but Applied fails t.
func (s *Streams) Use(t testing.TB, customer, meter string, at time.Time, qty decimal.Decimal) {
	t.Helper()
	s.mu.Lock()
	k := customer + "/" + meter
	s.seqs[k]++
	s.totals[k] = s.totals[k].Add(qty)
	rec := ledger.Record{
		OperationID: uuid.Must(uuid.NewV7()),
		Stream:      ledger.StreamKey{Producer: "test", Epoch: 1, Customer: customer, Meter: meter},
		Seq:         s.seqs[k], Total: s.totals[k], OccurredAt: at,
	}
	s.mu.Unlock()
	ctx := context.Background()
	err := pgx.BeginFunc(ctx, s.pool, func(tx pgx.Tx) error {
		out, err := s.led.Apply(ctx, tx, []ledger.Record{rec})
		if err == nil && out[0].Kind != ledger.Applied {
			err = fmt.Errorf("outcome %v: %s", out[0].Kind, out[0].Detail)
		}
		return err
	})
	if err != nil {
		t.Fatalf("apply usage of %s: %v", k, err)
	}
}

// ToNoon is how far back the last 12:00 UTC at or before now is (0 or
// less): a test that runs Tally's clock shifted by it is twelve hours or
// more from the end of any UTC day or month, whatever the hour it runs at.
func ToNoon(now time.Time) time.Duration {
	now = now.UTC()
	noon := time.Date(now.Year(), now.Month(), now.Day(), 12, 0, 0, 0, time.UTC)
	if noon.After(now) {
		noon = noon.AddDate(0, 0, -1)
	}
	return noon.Sub(now)
}

// Recent is an instant for usage that happened "now" in a test: a second
// before now, but not before now's UTC day began, so that it falls in the
// period now is in for any calendar of UTC days or months, even in a
// period's first second (a second before it is the previous period's).
func Recent(now time.Time) time.Time {
	at := now.Add(-time.Second)
	if day := now.Truncate(24 * time.Hour); at.Before(day) {
		return day
	}
	return at
}

// SteadyCalendar is a billing calendar for a customer of a test that runs
// on the machine's clock (time.Now): daily, its boundary at the whole UTC
// hour twelve hours after now's. The period now is in began twelve hours
// or more before now and ends more than eleven hours after it, so usage
// booked at Recent(now), grants and decisions of the test all count in one
// period, whatever the hour or day the test runs at (a default calendar's
// month, or a UTC day, may end during it). Set it (periods.Store.SetCalendar)
// before anything refers to the customer: it then applies from the
// beginning.
func SteadyCalendar(now time.Time) periods.Calendar {
	return periods.Calendar{Cadence: periods.Daily, AnchorTime: now.UTC().Add(12 * time.Hour).Format("15:00"), Zone: "UTC"}
}

// PastMonthEnd waits, when the UTC month ends within d of now, until
// it has ended (until now() is in the next month): a test whose budgets
// count in calendar months of UTC (a pool's, the global scope's), and
// which runs for less than d, then starts and ends in one month.
func PastMonthEnd(t testing.TB, now func() time.Time, d time.Duration) {
	t.Helper()
	at := now().UTC()
	end := time.Date(at.Year(), at.Month()+1, 1, 0, 0, 0, 0, time.UTC)
	if end.Sub(at) > d {
		return
	}
	t.Logf("waiting %s for the month to end at %s", end.Sub(at).Round(time.Millisecond), end.Format(time.RFC3339))
	for now().Before(end) {
		time.Sleep(end.Sub(now())/2 + time.Millisecond)
	}
}

// Position says ingest has applied everything of topic through at, on its
// partitions 0 to partitions-1.
func Position(t testing.TB, pool *pgxpool.Pool, topic string, partitions int, at time.Time) {
	t.Helper()
	_, err := pool.Exec(context.Background(), `
		INSERT INTO ingest_partitions (topic, partition, next_offset, high_watermark, applied_through)
		SELECT $1, p, 0, 0, $3 FROM generate_series(0, $2::int - 1) AS p
		ON CONFLICT (topic, partition) DO UPDATE SET applied_through = EXCLUDED.applied_through`, topic, partitions, at)
	if err != nil {
		t.Fatalf("ingest position: %v", err)
	}
}

// Follow keeps topic's ingest position at now() (a caught-up ingest),
// moving it every 20ms, until stop is called or the test ends.
func Follow(t testing.TB, pool *pgxpool.Pool, topic string, partitions int, now func() time.Time) (stop func()) {
	t.Helper()
	Position(t, pool, topic, partitions, now())
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() {
		defer close(done)
		for {
			select {
			case <-ctx.Done():
				return
			case <-time.After(20 * time.Millisecond):
			}
			_, _ = pool.Exec(ctx, `UPDATE ingest_partitions SET applied_through = $2 WHERE topic = $1`, topic, now())
		}
	}()
	var once sync.Once
	stop = func() { once.Do(func() { cancel(); <-done }) }
	t.Cleanup(stop)
	return stop
}
