package cli

import (
	"context"
	"strings"
	"testing"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/shopspring/decimal"
	"github.com/tally-ledger/tally/internal/pgtest"
)

// A period reference outside 1970-01-01..9998-12-31 is refused by name
// before anything runs, by every subcommand that takes a period.
func TestPeriodOutOfRangeRefused(t *testing.T) {
	db := pgtest.NewURL(t)
	if _, err := runTally(t, "periods", "close", "--customer", "acme", "--period", "2026-10-01",
		"--force", "--reason", "r", "--actor", "a", "--database-url", db); err == nil || !strings.Contains(err.Error(), "unknown customer") {
		t.Fatalf("close of an unknown customer: %v", err) // the command reaches the store
	}
	for _, ref := range []string{"9999-12-01", "0000-01-01"} {
		for _, args := range [][]string{
			{"periods", "close", "--customer", "acme", "--period", ref, "--force", "--reason", "r", "--actor", "a"},
			{"reconcile", "--period", ref},
			{"reconcile", "--period", ref, "--customer", "acme"},
		} {
			_, err := runTally(t, append(args, "--database-url", db)...)
			if err == nil || !strings.Contains(err.Error(), `period "`+ref+`"`) || !strings.Contains(err.Error(), "supported range") {
				t.Errorf("%v: %v", args, err)
			}
		}
	}
}

// A period with a clean reconciliation run closes without --force, as
// the command's help says; before a run it is refused as not reconciled.
func TestPeriodsCloseAfterACleanReconciliation(t *testing.T) {
	db := pgtest.NewURL(t)
	pool, err := pgxpool.New(context.Background(), db)
	if err != nil {
		t.Fatal(err)
	}
	defer pool.Close()
	if _, err := pool.Exec(context.Background(), `INSERT INTO customers (id, schedule) VALUES ('acme',
		'[{"effective_from":"0001-01-01T00:00:00Z","calendar":{"cadence":"monthly","anchor_day":1,"anchor_time":"00:00","zone":"UTC"}}]')`); err != nil {
		t.Fatal(err)
	}
	closeArgs := []string{"periods", "close", "--customer", "acme", "--period", "2026-10-01", "--database-url", db}
	if _, err := runTally(t, closeArgs...); err == nil || !strings.Contains(err.Error(), "reconcil") {
		t.Fatalf("close before any reconciliation: %v, want it refused as not reconciled", err)
	}
	if out, err := runTally(t, "reconcile", "--period", "2026-10-01", "--customer", "acme", "--database-url", db); err != nil {
		t.Fatalf("reconcile: %v\n%s", err, out)
	}
	out, err := runTally(t, closeArgs...)
	if err != nil {
		t.Fatalf("close after a clean reconciliation: %v\n%s", err, out)
	}
	var state string
	if err := pool.QueryRow(context.Background(), `SELECT count(*)::text FROM period_closes WHERE customer = 'acme'`).Scan(&state); err != nil || state != "1" {
		t.Fatalf("closed periods of acme: %s %v", state, err)
	}
}

// periods list shows each meter's billed total, never one sum across
// meters.
func TestBilledTextIsPerMeter(t *testing.T) {
	for want, billed := range map[string]map[string]decimal.Decimal{
		"-":                           {},
		"api_calls=12 storage_gb=3.5": {"storage_gb": decimal.RequireFromString("3.5"), "api_calls": decimal.NewFromInt(12)},
	} {
		if got := billedText(billed); got != want {
			t.Errorf("billedText(%v) = %q, want %q", billed, got, want)
		}
	}
}

// --grace 0s (TALLY_GRACE=0s) means no grace: a period is due for closing
// as soon as it ends. Yesterday's period of a daily calendar has ended
// (less than a day ago), so with no grace it closes at once, by
// `periods close` after a clean run and by `reconcile --close`.
func TestZeroGraceClosesAtTheEnd(t *testing.T) {
	db := pgtest.NewURL(t)
	pool, err := pgxpool.New(context.Background(), db)
	if err != nil {
		t.Fatal(err)
	}
	defer pool.Close()
	if _, err := pool.Exec(context.Background(), `INSERT INTO customers (id, schedule)
		SELECT id, '[{"effective_from":"0001-01-01T00:00:00Z","calendar":{"cadence":"daily","anchor_time":"00:00","zone":"UTC"}}]'
		FROM unnest(ARRAY['acme', 'globex']) AS id`); err != nil {
		t.Fatal(err)
	}
	if out, err := runTally(t, "reconcile", "--period", "previous", "--customer", "acme", "--grace", "0s", "--database-url", db); err != nil {
		t.Fatalf("reconcile: %v\n%s", err, out)
	}
	if out, err := runTally(t, "periods", "close", "--customer", "acme", "--period", "previous", "--grace", "0s", "--database-url", db); err != nil {
		t.Fatalf("close with no grace: %v\n%s", err, out)
	}
	if out, err := runTally(t, "reconcile", "--period", "previous", "--customer", "globex", "--close", "--grace", "0s", "--database-url", db); err != nil {
		t.Fatalf("reconcile --close: %v\n%s", err, out)
	}
	var closed []string
	rows, err := pool.Query(context.Background(), `SELECT customer FROM period_closes ORDER BY customer`)
	if err != nil {
		t.Fatal(err)
	}
	for rows.Next() {
		var c string
		if err := rows.Scan(&c); err != nil {
			t.Fatal(err)
		}
		closed = append(closed, c)
	}
	if strings.Join(closed, ",") != "acme,globex" {
		t.Fatalf("closed with no grace: %v, want acme and globex", closed)
	}
}
