package ledgertest_test

import (
	"context"
	"testing"
	"time"

	"github.com/shopspring/decimal"

	"github.com/tally-ledger/tally/internal/ledgertest"
	"github.com/tally-ledger/tally/internal/pgtest"
	"github.com/tally-ledger/tally/ledger"
)

// Each Use is the next record of its customer/meter's own stream, its total
// the running sum; Position sets every partition of the topic and moves it
// again on a second call.
func TestUseAndPosition(t *testing.T) {
	pool := pgtest.New(t)
	l, err := ledger.New(ledger.Config{})
	if err != nil {
		t.Fatal(err)
	}
	s := ledgertest.New(pool, l)
	at := time.Date(2026, 11, 20, 11, 0, 0, 0, time.UTC)
	s.Use(t, "acme", "api_calls", at, decimal.RequireFromString("2.5"))
	s.Use(t, "acme", "api_calls", at, decimal.NewFromInt(3))
	s.Use(t, "globex", "api_calls", at, decimal.NewFromInt(7))
	ctx := context.Background()
	var seq int64
	var total decimal.Decimal
	if err := pool.QueryRow(ctx, `SELECT last_seq, last_total FROM streams WHERE customer = 'acme' AND meter = 'api_calls'`).Scan(&seq, &total); err != nil {
		t.Fatal(err)
	}
	if seq != 2 || !total.Equal(decimal.RequireFromString("5.5")) {
		t.Fatalf("acme's stream: seq %d total %s, want 2 and 5.5", seq, total)
	}

	ledgertest.Position(t, pool, "meters", 3, at)
	ledgertest.Position(t, pool, "meters", 3, at.Add(time.Minute))
	var n int
	var oldest time.Time
	if err := pool.QueryRow(ctx, `SELECT count(*), min(applied_through) FROM ingest_partitions WHERE topic = 'meters'`).Scan(&n, &oldest); err != nil {
		t.Fatal(err)
	}
	if n != 3 || !oldest.Equal(at.Add(time.Minute)) {
		t.Fatalf("positions: %d partitions through %s, want 3 through %s", n, oldest, at.Add(time.Minute))
	}
}
