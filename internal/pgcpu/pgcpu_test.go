package pgcpu_test

import (
	"context"
	"testing"

	"github.com/tally-ledger/tally/internal/pgcpu"
	"github.com/tally-ledger/tally/internal/pgtest"
)

// The CPU of the database's backends grows with the work they do, and a
// name matches only the backends that carry it.
func TestDatabaseCountsItsBackendsWork(t *testing.T) {
	pool := pgtest.New(t)
	ctx := context.Background()
	before, n, ok := pgcpu.Database(ctx, pool, "")
	if !ok {
		t.Skip("Postgres's backends are not readable from this host's /proc")
	}
	if n < 1 {
		t.Fatalf("%d backends, want at least the pool's", n)
	}
	if _, err := pool.Exec(ctx, `SELECT count(*) FROM generate_series(1, 3000000)`); err != nil {
		t.Fatal(err)
	}
	after, _, ok := pgcpu.Database(ctx, pool, "")
	if !ok || after <= before {
		t.Fatalf("backends' CPU %s, then %s after counting three million rows (ok %v); want it grown", before, after, ok)
	}
	if _, _, ok := pgcpu.Database(ctx, pool, "no backend has this name"); ok {
		t.Fatal("a name no backend carries read as backends")
	}
}
