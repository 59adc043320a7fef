package migrations_test

import (
	"context"
	"log/slog"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/shopspring/decimal"

	"github.com/tally-ledger/tally/ledger"
	"github.com/tally-ledger/tally/migrations"
)

// TestUniqueReadingsCountedIndex: on a ledger of unique readings taken
// down to migration 00035, migration 00036 swaps the member index for
// unique_readings_counted, and, migrated up to the latest, a Ledger that
// never saw the period (it reads the period's counted members through the
// index) goes on counting each member and member day once. Down restores
// the index.
func TestUniqueReadingsCountedIndex(t *testing.T) {
	ctx := context.Background()
	f, latest := migratedMAU(t, 35, 36)
	pool, day, sighting := f.pool, f.day, f.sighting
	apply := func(recs ...ledger.Record) { t.Helper(); f.apply(0, recs...) } // each batch through a new Ledger
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
	if err := migrations.UpTo(ctx, pool, latest); err != nil {
		t.Fatal(err)
	}
	// ann again on both her days, bob on a new day, carl new.
	apply(sighting("ann", day.Add(2*time.Hour)), sighting("ann", day.Add(25*time.Hour)), sighting("bob", day.Add(26*time.Hour)),
		sighting("carl", day.Add(27*time.Hour)))
	if got, want := f.counts(), "false:11-01:3 true:11-10:2 true:11-11:3"; got != want {
		t.Fatalf("counts (per_day:day:members) = %s, want %s", got, want)
	}

	if err := migrations.DownTo(ctx, pool, 35); err != nil {
		t.Fatal(err)
	}
	if got := indexes(); got != "unique_readings_members" {
		t.Fatalf("indexes after 00036 down: %s", got)
	}
}

// TestUniqueMemberHashIndex: on a ledger of unique readings taken down to
// migration 00037, migration 00038 rebuilds unique_readings_counted on the
// hash of the member alone and drops the stored member_key column;
// migrated up to the latest, Ledgers that never saw the period go on
// counting each member and member day once, whether they look members up
// one by one (nothing remembered) or read the period whole. Down restores
// the column and the index.
func TestUniqueMemberHashIndex(t *testing.T) {
	ctx := context.Background()
	f, latest := migratedMAU(t, 37, 38)
	pool, day, sighting, apply := f.pool, f.day, f.sighting, f.apply
	schema := func() string {
		var s string
		if err := pool.QueryRow(ctx, `SELECT indexdef || ' / member_key: ' || EXISTS (SELECT FROM information_schema.columns
			WHERE table_name = 'unique_readings' AND column_name = 'member_key')
			FROM pg_indexes WHERE indexname = 'unique_readings_counted'`).Scan(&s); err != nil {
			t.Fatal(err)
		}
		return s
	}
	if got, want := schema(), "CREATE INDEX unique_readings_counted ON public.unique_readings USING btree (hashtextextended(((customer || '/'::text) || meter), (0)::bigint), period_start, hashtextextended(member, (0)::bigint)) WHERE counted / member_key: false"; got != want {
		t.Fatalf("after 00038: %s\nwant %s", got, want)
	}
	if err := migrations.UpTo(ctx, pool, latest); err != nil {
		t.Fatal(err)
	}
	// Looked up one by one: ann again on both her days, bob on a new day.
	apply(-1, sighting("ann", day.Add(2*time.Hour)), sighting("ann", day.Add(25*time.Hour)), sighting("bob", day.Add(26*time.Hour)))
	if got, want := f.counts(), "false:11-01:2 true:11-10:2 true:11-11:2"; got != want {
		t.Fatalf("counts (per_day:day:members) looked up = %s, want %s", got, want)
	}
	// Read whole: bob and ann again, carl new.
	apply(0, sighting("bob", day.Add(27*time.Hour)), sighting("ann", day.Add(3*time.Hour)), sighting("carl", day.Add(28*time.Hour)))
	if got, want := f.counts(), "false:11-01:3 true:11-10:2 true:11-11:3"; got != want {
		t.Fatalf("counts (per_day:day:members) read whole = %s, want %s", got, want)
	}

	if err := migrations.DownTo(ctx, pool, 37); err != nil {
		t.Fatal(err)
	}
	if got, want := schema(), "CREATE INDEX unique_readings_counted ON public.unique_readings USING btree (hashtextextended(((customer || '/'::text) || meter), (0)::bigint), period_start, member_key) WHERE counted / member_key: true"; got != want {
		t.Fatalf("after 00038 down: %s\nwant %s", got, want)
	}
	var wrong int
	if err := pool.QueryRow(ctx, `SELECT count(*) FROM unique_readings
		WHERE member_key <> hashtextextended(customer || '/' || meter || '/' || member, 0)`).Scan(&wrong); err != nil {
		t.Fatal(err)
	}
	if wrong != 0 {
		t.Fatalf("%d readings with a wrong member_key after 00038 down", wrong)
	}
}

// TestUniqueIndexLargePeriods: on a ledger of unique readings taken down
// to migration 00038 (every counted reading in the member index), 00039
// marks every existing period and reading indexed and narrows the index
// to indexed readings; a Ledger that remembers nothing goes on looking
// the old period's members up in the index and counting each once, and a
// new period is written without index entries until it holds
// Config.UniqueIndexAfter readings. Down indexes every counted reading
// again.
func TestUniqueIndexLargePeriods(t *testing.T) {
	ctx := context.Background()
	f, latest := migratedMAU(t, 38, 39)
	pool, day, sighting, apply := f.pool, f.day, f.sighting, f.apply
	state := func() string {
		var s string
		if err := pool.QueryRow(ctx, `SELECT (SELECT indexdef FROM pg_indexes WHERE indexname = 'unique_readings_counted') || ' / ' ||
			coalesce((SELECT string_agg(to_char(period_start AT TIME ZONE 'UTC', 'MM') || ':' || indexed, ' ' ORDER BY period_start)
			          FROM unique_counts WHERE NOT per_day), '') || ' / ' ||
			(SELECT count(*) FILTER (WHERE counted AND indexed) || ' of ' || count(*) FILTER (WHERE counted) FROM unique_readings)`).Scan(&s); err != nil {
			t.Fatal(err)
		}
		return s
	}
	const index = "CREATE INDEX unique_readings_counted ON public.unique_readings USING btree (hashtextextended(((customer || '/'::text) || meter), (0)::bigint), period_start, hashtextextended(member, (0)::bigint))"
	if got, want := state(), index+" WHERE (counted AND indexed) / 11:true / 3 of 3"; got != want {
		t.Fatalf("after 00039: %s\nwant %s", got, want)
	}
	if err := migrations.UpTo(ctx, pool, latest); err != nil {
		t.Fatal(err)
	}
	// Looked up in the index, by a Ledger indexing only large periods:
	// ann again on both her days, bob on a new day.
	f.indexAfter = 0
	apply(-1, sighting("ann", day.Add(2*time.Hour)), sighting("ann", day.Add(25*time.Hour)), sighting("bob", day.Add(26*time.Hour)))
	if got, want := f.counts(), "false:11-01:2 true:11-10:2 true:11-11:2"; got != want {
		t.Fatalf("counts (per_day:day:members) = %s, want %s", got, want)
	}
	// December is a new period: not indexed.
	f.now = day.AddDate(0, 1, 1)
	apply(-1, sighting("ann", day.AddDate(0, 1, 0)), sighting("dan", day.AddDate(0, 1, 0)))
	if got, want := state(), index+" WHERE (counted AND indexed) / 11:true 12:false / 4 of 6"; got != want {
		t.Fatalf("after December: %s\nwant %s", got, want)
	}

	if err := migrations.DownTo(ctx, pool, 38); err != nil {
		t.Fatal(err)
	}
	var def string
	if err := pool.QueryRow(ctx, `SELECT indexdef FROM pg_indexes WHERE indexname = 'unique_readings_counted'`).Scan(&def); err != nil {
		t.Fatal(err)
	}
	if want := index + " WHERE counted"; def != want {
		t.Fatalf("after 00039 down: %s\nwant %s", def, want)
	}
}

// migratedMAU returns a mau fixture on a new database holding acme's
// first sightings (ann, bob, and ann again the next day), written at the
// latest version and taken down to version before, then migrated up to
// version after: a ledger written by the schema before a migration, as
// that migration finds it. It also returns the latest version.
func migratedMAU(t *testing.T, before, after int64) (*mau, int64) {
	t.Helper()
	ctx := context.Background()
	pool := emptyPool(t)
	latest, err := migrations.Up(ctx, pool, slog.New(slog.DiscardHandler))
	if err != nil {
		t.Fatal(err)
	}
	f := newMAU(t, pool)
	f.apply(0, f.sighting("ann", f.day), f.sighting("bob", f.day.Add(time.Hour)), f.sighting("ann", f.day.Add(24*time.Hour)))
	if err := migrations.DownTo(ctx, pool, before); err != nil {
		t.Fatal(err)
	}
	if err := migrations.UpTo(ctx, pool, after); err != nil {
		t.Fatal(err)
	}
	return f, latest
}

// mau applies sightings of acme's unique meter "mau", declared on a ledger
// at whatever version the test migrated it to, each batch through a new
// Ledger (remembering nothing of earlier batches).
type mau struct {
	t          *testing.T
	pool       *pgxpool.Pool
	now        time.Time
	day        time.Time
	seq        int64
	indexAfter int // ledger.Config.UniqueIndexAfter: from the first reading, unless a test says otherwise
}

func newMAU(t *testing.T, pool *pgxpool.Pool) *mau {
	f := &mau{t: t, pool: pool, indexAfter: -1, now: time.Date(2026, 11, 20, 12, 0, 0, 0, time.UTC), day: time.Date(2026, 11, 10, 9, 0, 0, 0, time.UTC)}
	if err := pgx.BeginFunc(context.Background(), pool, func(tx pgx.Tx) error {
		_, err := ledger.DeclareMeter(context.Background(), tx, ledger.Meter{Meter: "mau", Kind: ledger.Unique, Unit: "user"}, f.now)
		return err
	}); err != nil {
		t.Fatal(err)
	}
	return f
}

func (f *mau) sighting(member string, at time.Time) ledger.Record {
	f.seq++
	return ledger.Record{OperationID: uuid.New(), Seq: f.seq, OccurredAt: at, Total: decimal.Zero, Shape: ledger.Unique, Member: member,
		Stream: ledger.StreamKey{Producer: "gw", Epoch: 1, Customer: "acme", Meter: "mau"}}
}

// counts is unique_counts as per_day:day:members, in order.
func (f *mau) counts() string {
	f.t.Helper()
	var s string
	if err := f.pool.QueryRow(context.Background(), `SELECT string_agg(per_day || ':' || to_char(day AT TIME ZONE 'UTC', 'MM-DD') || ':' || members, ' '
		ORDER BY per_day, day) FROM unique_counts`).Scan(&s); err != nil {
		f.t.Fatal(err)
	}
	return s
}

// apply applies recs in one transaction through a new Ledger remembering
// at most memberDays member days (ledger.Config.UniqueMemberDays) and
// indexing periods after f.indexAfter readings.
func (f *mau) apply(memberDays int, recs ...ledger.Record) {
	f.t.Helper()
	l, err := ledger.New(ledger.Config{Clock: func() time.Time { return f.now }, UniqueMemberDays: memberDays, UniqueIndexAfter: f.indexAfter})
	if err != nil {
		f.t.Fatal(err)
	}
	if err := pgx.BeginFunc(context.Background(), f.pool, func(tx pgx.Tx) error {
		_, err := l.Apply(context.Background(), tx, recs)
		return err
	}); err != nil {
		f.t.Fatal(err)
	}
}
