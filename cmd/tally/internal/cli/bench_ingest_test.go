package cli

import (
	"regexp"
	"strconv"
	"strings"
	"testing"

	"github.com/tally-ledger/tally/internal/pgtest"
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
	out, err := runTally(t, "bench", "ingest", "--kind", "unique", "--records", "6000", "--per-message", "500",
		"--partitions", "2", "--rounds", "1", "--statements", "--database-url", pgtest.AdminURL())
	if err != nil {
		t.Fatalf("bench: %v\n%s", err, out)
	}
	for _, want := range []string{"ingest, unique records", "ingest, unique-meter readings", "applied 6000, duplicate 0",
		`COPY "unique_readings"`, "ingest unique-meter / counter"} {
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
