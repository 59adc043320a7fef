package migrations_test

import (
	"context"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/shopspring/decimal"

	"github.com/tally-ledger/tally/ledger"
	"github.com/tally-ledger/tally/migrations"
)

// TestUniqueReadingsCountedIndex: on a ledger of unique readings written
// under migration 00035, migration 00036 swaps the member index for
// unique_readings_counted, and a Ledger that never saw the period (it
// reads the period's counted members through the new index) goes on
// counting each member and member day once. Down restores the index.
func TestUniqueReadingsCountedIndex(t *testing.T) {
	ctx := context.Background()
	pool := emptyPool(t)
	if err := migrations.UpTo(ctx, pool, 35); err != nil {
		t.Fatal(err)
	}
	now := time.Date(2026, 11, 20, 12, 0, 0, 0, time.UTC)
	day := time.Date(2026, 11, 10, 9, 0, 0, 0, time.UTC)
	seq := int64(0)
	sighting := func(member string, at time.Time) ledger.Record {
		seq++
		return ledger.Record{OperationID: uuid.New(), Seq: seq, OccurredAt: at, Total: decimal.Zero, Shape: ledger.Unique, Member: member,
			Stream: ledger.StreamKey{Producer: "gw", Epoch: 1, Customer: "acme", Meter: "mau"}}
	}
	apply := func(recs ...ledger.Record) {
		t.Helper()
		l, err := ledger.New(ledger.Config{Clock: func() time.Time { return now }}) // a Ledger that remembers nothing
		if err != nil {
			t.Fatal(err)
		}
		if err := pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
			_, err := l.Apply(ctx, tx, recs)
			return err
		}); err != nil {
			t.Fatal(err)
		}
	}
	if err := pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
		_, err := ledger.DeclareMeter(ctx, tx, ledger.Meter{Meter: "mau", Kind: ledger.Unique, Unit: "user"}, now)
		return err
	}); err != nil {
		t.Fatal(err)
	}
	apply(sighting("ann", day), sighting("bob", day.Add(time.Hour)), sighting("ann", day.Add(24*time.Hour)))

	if err := migrations.UpTo(ctx, pool, 36); err != nil {
		t.Fatal(err)
	}
	indexes := func() string {
		var s string
		if err := pool.QueryRow(ctx, `SELECT string_agg(indexname, ' ' ORDER BY indexname) FROM pg_indexes
			WHERE tablename = 'unique_readings' AND indexname LIKE 'unique_readings_%' AND indexname NOT LIKE '%pkey' AND indexname NOT LIKE '%key'`).Scan(&s); err != nil {
			t.Fatal(err)
		}
		return s
	}
	if got := indexes(); got != "unique_readings_counted" {
		t.Fatalf("indexes after 00036: %s", got)
	}
	// ann again on both her days, bob on a new day, carl new.
	apply(sighting("ann", day.Add(2*time.Hour)), sighting("ann", day.Add(25*time.Hour)), sighting("bob", day.Add(26*time.Hour)),
		sighting("carl", day.Add(27*time.Hour)))
	var counts string
	if err := pool.QueryRow(ctx, `SELECT string_agg(per_day || ':' || to_char(day AT TIME ZONE 'UTC', 'MM-DD') || ':' || members, ' '
		ORDER BY per_day, day) FROM unique_counts`).Scan(&counts); err != nil {
		t.Fatal(err)
	}
	if want := "false:11-01:3 true:11-10:2 true:11-11:3"; counts != want {
		t.Fatalf("counts (per_day:day:members) = %s, want %s", counts, want)
	}

	if err := migrations.DownTo(ctx, pool, 35); err != nil {
		t.Fatal(err)
	}
	if got := indexes(); got != "unique_readings_members" {
		t.Fatalf("indexes after 00036 down: %s", got)
	}
}
