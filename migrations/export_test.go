package migrations

import (
	"context"
	"log/slog"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/jackc/pgx/v5/stdlib"
)

// UpTo applies migrations up to version, for tests of one migration.
func UpTo(ctx context.Context, pool *pgxpool.Pool, version int64) error {
	db := stdlib.OpenDBFromPool(pool)
	defer db.Close()
	p, err := provider(db, slog.New(slog.DiscardHandler))
	if err != nil {
		return err
	}
	_, err = p.UpTo(ctx, version)
	return err
}

// DownTo rolls migrations back to version, for tests of one migration's Down.
func DownTo(ctx context.Context, pool *pgxpool.Pool, version int64) error {
	db := stdlib.OpenDBFromPool(pool)
	defer db.Close()
	p, err := provider(db, slog.New(slog.DiscardHandler))
	if err != nil {
		return err
	}
	_, err = p.DownTo(ctx, version)
	return err
}
