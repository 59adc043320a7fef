package migrations_test

import (
	"context"
	"log/slog"
	"testing"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/tally-ledger/tally/internal/pgtest"
	"github.com/tally-ledger/tally/migrations"
)

// emptyPool is a pool on a new database without any migration applied.
func emptyPool(t *testing.T) *pgxpool.Pool {
	t.Helper()
	pool, err := pgxpool.New(context.Background(), pgtest.NewEmptyURL(t))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pool.Close)
	return pool
}

// poolAt is emptyPool migrated up to version: the ledger as an earlier
// release left it, for a migration's test to write into.
func poolAt(t *testing.T, version int64) *pgxpool.Pool {
	t.Helper()
	pool := emptyPool(t)
	if err := migrations.UpTo(context.Background(), pool, version); err != nil {
		t.Fatal(err)
	}
	return pool
}

func TestUpIsIdempotent(t *testing.T) {
	ctx := context.Background()
	pool := emptyPool(t)
	log := slog.New(slog.DiscardHandler)

	v1, err := migrations.Up(ctx, pool, log)
	if err != nil {
		t.Fatalf("first Up: %v", err)
	}
	v2, err := migrations.Up(ctx, pool, log)
	if err != nil {
		t.Fatalf("second Up: %v", err)
	}
	current, latest, err := migrations.Status(ctx, pool)
	if err != nil {
		t.Fatal(err)
	}
	if v1 != v2 || v1 != latest || current != latest || latest < 1 {
		t.Fatalf("versions: first %d, second %d, current %d, latest %d", v1, v2, current, latest)
	}
	var n int
	if err := pool.QueryRow(ctx, "SELECT count(*) FROM records").Scan(&n); err != nil {
		t.Fatalf("records table missing after migrate: %v", err)
	}
}
