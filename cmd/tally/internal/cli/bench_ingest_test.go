package cli

import (
	"context"
	"errors"
	"fmt"
	"io"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"

	"github.com/tally-ledger/tally/ingest/wire"
	"github.com/tally-ledger/tally/internal/pgtest"
	"github.com/tally-ledger/tally/ledger"
)

// TestBenchIngestBreakdown: a small run of tally bench ingest with its WAL and statement
// breakdowns: both baselines and both ratios are printed, and the WAL of
// the physical baseline is its table and its one index, about one WAL
// record per row for the index (every row a B-tree entry); the CPU per
// record of ingest and of the physical baseline is compared.
func TestBenchIngestBreakdown(t *testing.T) {
	out, err := runTally(t, "bench", "ingest", "--records", "6000", "--per-message", "500", "--partitions", "2",
		"--rounds", "1", "--wal", "--statements", "--database-url", pgtest.AdminURL())
	if err != nil {
		t.Fatalf("bench: %v\n%s", err, out)
	}
	for _, want := range []string{"physical: raw records, one index", "COPY into a records-shaped table",
		"ingest unique / physical", "ingest unique / COPY", "WAL of ingest, unique records", "WAL of physical baseline",
		"records_operation_id_key", "records_pkey", "statements of ingest, unique records", `COPY "records"`} {
		if !strings.Contains(out, want) {
			t.Errorf("no %q in\n%s", want, out)
		}
	}
	if strings.Contains(out, "records_period") {
		t.Errorf("records_period is written per record again:\n%s", out)
	}
	// With Postgres on this host, the CPU per record of both, and their ratio.
	if strings.Contains(out, "CPU of physical baseline: Postgres") {
		m := regexp.MustCompile(`CPU per record: ingest ([0-9.]+) µs, physical baseline ([0-9.]+) µs = ([0-9.]+)`).FindStringSubmatch(out)
		if m == nil {
			t.Fatalf("no CPU per record of ingest against the physical baseline in\n%s", out)
		}
		for _, v := range m[1:] {
			if f, _ := strconv.ParseFloat(v, 64); f <= 0 {
				t.Errorf("CPU per record line %q: %s is not positive", m[0], v)
			}
		}
	}
	m := regexp.MustCompile(`bench_physical_operation +[0-9.]+ bytes/record .* ([0-9.]+) WAL records/record`).FindStringSubmatch(out)
	if m == nil {
		t.Fatalf("no WAL line for the physical baseline's index in\n%s", out)
	}
	if n, _ := strconv.ParseFloat(m[1], 64); n < 0.99 || n > 1.2 {
		t.Errorf("physical baseline's index: %v WAL records per row, want about 1", n)
	}
}

// TestBenchIngestKind: --kind unique ingests unique-meter readings beside
// the counter records, says which run is which (a counter run of records
// none of which repeats is "unique records"; the unique meter's run is
// named after its kind), writes the readings' own table and prints their
// rate against counter ingest.
func TestBenchIngestKind(t *testing.T) {
	// Through the latency proxy, as a database on another host.
	out, err := runTally(t, "bench", "ingest", "--kind", "unique", "--records", "6000", "--per-message", "500",
		"--partitions", "2", "--rounds", "1", "--statements", "--latency", "1ms", "--database-url", pgtest.AdminURL())
	if err != nil {
		t.Fatalf("bench: %v\n%s", err, out)
	}
	for _, want := range []string{"ingest, unique records", "ingest, unique-meter readings", "applied 6000, duplicate 0",
		`COPY "unique_readings"`, "ingest unique-meter / counter", "Postgres through a proxy adding 1ms each way (a SELECT 1 through it: "} {
		if !strings.Contains(out, want) {
			t.Errorf("no %q in\n%s", want, out)
		}
	}
	m := regexp.MustCompile(`ingest unique-meter / counter += ([0-9.]+)`).FindStringSubmatch(out)
	if m == nil {
		t.Fatalf("no ratio against counter ingest in\n%s", out)
	}
	if r, _ := strconv.ParseFloat(m[1], 64); r <= 0 {
		t.Errorf("unique-meter / counter = %v", r)
	}
}

// TestPhysicalBaselineStoresTheRecordsSent: the physical baseline's table
// holds every raw record once, field for field as the producer sent it
// (operation id, producer, epoch, customer, meter, seq, total and
// quantity with their scales or NULL, occurred_at to the microsecond as
// timestamptz keeps it, batch id): its own encoding (internal/pgcopy)
// writes what pgx's would have.
func TestPhysicalBaselineStoresTheRecordsSent(t *testing.T) {
	ctx := context.Background()
	msgs := benchMessages(3000, 250, 4, 0.3, 5, ledger.Counter, 0)
	rows, err := physicalRows(msgs, 3000)
	if err != nil {
		t.Fatal(err)
	}
	url := pgtest.NewEmptyURL(t)
	if _, err := benchPhysical(ctx, io.Discard, url, rows, false, nil); err != nil {
		t.Fatal(err)
	}
	conn, err := pgx.Connect(ctx, url)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(ctx)
	want := map[string]string{}
	seen := map[string]bool{}
	for _, m := range msgs {
		if seen[string(m.value)] {
			continue // a retransmit is not a new record
		}
		seen[string(m.value)] = true
		b, _, _, err := wire.Decode(m.key, m.value)
		if err != nil {
			t.Fatal(err)
		}
		for _, r := range b.Records {
			q := "NULL"
			if r.Quantity.Valid {
				q = r.Quantity.Decimal.StringFixed(max(0, -r.Quantity.Decimal.Exponent()))
			}
			want[uuid.UUID(r.OperationID).String()] = fmt.Sprintf("%s %d %s %s %d %s %s %s %s", b.Producer, b.Epoch, r.Customer, r.Meter,
				r.Seq, r.Total.StringFixed(max(0, -r.Total.Exponent())), q,
				r.OccurredAt.UTC().Truncate(time.Microsecond).Format(time.RFC3339Nano), uuid.UUID(b.BatchID))
		}
	}
	got, err := conn.Query(ctx, `SELECT operation_id::text, producer, epoch, customer, meter, seq, total::text,
       coalesce(quantity::text, 'NULL'), occurred_at, batch_id::text FROM bench_physical`)
	if err != nil {
		t.Fatal(err)
	}
	n := 0
	for got.Next() {
		var id, producer, customer, meter, total, quantity, batch string
		var epoch, seq int64
		var at time.Time
		if err := got.Scan(&id, &producer, &epoch, &customer, &meter, &seq, &total, &quantity, &at, &batch); err != nil {
			t.Fatal(err)
		}
		n++
		row := fmt.Sprintf("%s %d %s %s %d %s %s %s %s", producer, epoch, customer, meter, seq, total, quantity, at.UTC().Format(time.RFC3339Nano), batch)
		if want[id] != row {
			t.Errorf("operation %s:\n got %s\nwant %s", id, row, want[id])
		}
	}
	if err := got.Err(); err != nil {
		t.Fatal(err)
	}
	if n != len(want) || n != len(rows) {
		t.Fatalf("%d rows stored, %d records sent, %d rows built", n, len(want), len(rows))
	}
}

// --duplicates NaN passed the range check (every comparison with NaN is
// false): a usage error naming it, before anything runs.
func TestBenchIngestRefusesANaNShare(t *testing.T) {
	_, err := runTally(t, "bench", "ingest", "--duplicates", "NaN", "--database-url", "postgres://127.0.0.1:1/none")
	var ee *ExitError
	if !errors.As(err, &ee) || ee.Code != exitUsage || !strings.Contains(err.Error(), "--duplicates") {
		t.Fatalf("bench ingest --duplicates NaN: %v; want exit 2 naming --duplicates", err)
	}
}
