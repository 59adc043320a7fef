package migrations_test

import (
	"cmp"
	"context"
	"fmt"
	"slices"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/shopspring/decimal"

	"github.com/tally-ledger/tally/ledger"
	"github.com/tally-ledger/tally/migrations"
)

// TestGaugeReadingsFoundByStream: on a ledger of gauge readings written
// under migration 00036, migration 00037 drops the readings' index by
// customer, meter and time and indexes gauge_streams by customer and
// meter instead; reconciliation's reads (every reading of a customer's
// gauge, the gauges a customer has readings of) find the same readings
// before and after, and the ones applied afterwards too. Down restores
// the index.
func TestGaugeReadingsFoundByStream(t *testing.T) {
	ctx := context.Background()
	pool := poolAt(t, 36)
	now := time.Date(2026, 11, 20, 12, 0, 0, 0, time.UTC)
	at := time.Date(2026, 11, 10, 9, 0, 0, 0, time.UTC)
	seqs := map[ledger.StreamKey]int64{}
	reading := func(producer, customer, meter string, level int64, minute int) ledger.Record {
		k := ledger.StreamKey{Producer: producer, Epoch: 1, Customer: customer, Meter: meter}
		seqs[k]++
		return ledger.Record{OperationID: uuid.New(), Seq: seqs[k], OccurredAt: at.Add(time.Duration(minute) * time.Minute),
			Total: decimal.Zero, Shape: ledger.Gauge, Level: decimal.New(level, 0), Stream: k}
	}
	tx := func(f func(pgx.Tx) error) {
		t.Helper()
		if err := pgx.BeginFunc(ctx, pool, f); err != nil {
			t.Fatal(err)
		}
	}
	l, err := ledger.New(ledger.Config{Clock: func() time.Time { return now }})
	if err != nil {
		t.Fatal(err)
	}
	apply := func(recs ...ledger.Record) {
		t.Helper()
		tx(func(tx pgx.Tx) error { _, err := l.Apply(ctx, tx, recs); return err })
	}
	for _, m := range []string{"seats", "storage_gb"} {
		tx(func(tx pgx.Tx) error {
			_, err := ledger.DeclareMeter(ctx, tx, ledger.Meter{Meter: m, Kind: ledger.Gauge, Unit: "unit"}, now)
			return err
		})
	}
	apply(reading("gw-1", "acme", "seats", 3, 0), reading("gw-2", "acme", "seats", 2, 5), reading("gw-1", "acme", "seats", 5, 10),
		reading("gw-1", "acme", "storage_gb", 40, 0), reading("gw-1", "zeta", "seats", 7, 0))

	// What reconciliation reads, as text: the readings of acme's seats
	// and of zeta's, and the gauges each customer has readings of.
	read := func() string {
		t.Helper()
		var s string
		for _, c := range []string{"acme", "zeta"} {
			rs, err := ledger.GaugeReadings(ctx, pool, c, "seats")
			if err != nil {
				t.Fatal(err)
			}
			ms, err := ledger.GaugeMetersOf(ctx, pool, c)
			if err != nil {
				t.Fatal(err)
			}
			s += fmt.Sprintf("%s %v:", c, ms)
			for _, r := range ledgerSorted(rs) {
				s += fmt.Sprintf(" %s/%d/%d=%s@%s", r.Producer, r.Epoch, r.Seq, r.Level, r.OccurredAt.Format("15:04"))
			}
			s += "\n"
		}
		return s
	}
	before := read()
	if want := "acme [seats storage_gb]: gw-1/1/1=3@09:00 gw-1/1/2=5@09:10 gw-2/1/1=2@09:05\nzeta [seats]: gw-1/1/1=7@09:00\n"; before != want {
		t.Fatalf("before 00037:\n%s\nwant\n%s", before, want)
	}
	// expect checks, after step, the gauge tables' indexes (other than
	// keys) and what reconciliation reads.
	expect := func(step, wantIndexes, wantRead string) {
		t.Helper()
		var got string
		if err := pool.QueryRow(ctx, `SELECT string_agg(indexname, ' ' ORDER BY indexname) FROM pg_indexes
			WHERE tablename IN ('gauge_readings', 'gauge_streams') AND indexname NOT LIKE '%pkey' AND indexname NOT LIKE '%key'`).Scan(&got); err != nil {
			t.Fatal(err)
		}
		if got != wantIndexes {
			t.Fatalf("indexes %s: %s, want %s", step, got, wantIndexes)
		}
		if got := read(); got != wantRead {
			t.Fatalf("read %s:\n%s\nwant\n%s", step, got, wantRead)
		}
	}
	if err := migrations.UpTo(ctx, pool, 37); err != nil {
		t.Fatal(err)
	}
	expect("after 00037", "gauge_streams_customer", before)
	apply(reading("gw-3", "acme", "seats", 1, 20), reading("gw-2", "acme", "seats", 0, 30))
	want := "acme [seats storage_gb]: gw-1/1/1=3@09:00 gw-1/1/2=5@09:10 gw-2/1/1=2@09:05 gw-2/1/2=0@09:30 gw-3/1/1=1@09:20\nzeta [seats]: gw-1/1/1=7@09:00\n"
	expect("after new readings", "gauge_streams_customer", want)
	if err := migrations.DownTo(ctx, pool, 36); err != nil {
		t.Fatal(err)
	}
	expect("after 00037 down", "gauge_readings_customer", want)
}

// ledgerSorted orders readings by producer, epoch and seq.
func ledgerSorted(rs []ledger.GaugeReading) []ledger.GaugeReading {
	slices.SortFunc(rs, func(a, b ledger.GaugeReading) int {
		return cmp.Or(cmp.Compare(a.Producer, b.Producer), cmp.Compare(a.Epoch, b.Epoch), cmp.Compare(a.Seq, b.Seq))
	})
	return rs
}
