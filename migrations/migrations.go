// Package migrations holds Tally's SQL schema as numbered, embedded files and
// applies them with goose. Each file says in a comment why it exists.
package migrations

import (
	"context"
	"crypto/sha256"
	"database/sql"
	"embed"
	"encoding/hex"
	"fmt"
	"io/fs"
	"log/slog"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/jackc/pgx/v5/stdlib"
	"github.com/pressly/goose/v3"
	"github.com/pressly/goose/v3/lock"
)

//go:embed *.sql
var files embed.FS

// Up applies every pending migration and returns the schema version.
// It is safe to run concurrently from several processes: goose takes a
// Postgres advisory lock for the duration.
func Up(ctx context.Context, pool *pgxpool.Pool, log *slog.Logger) (int64, error) {
	db := stdlib.OpenDBFromPool(pool)
	defer db.Close()
	p, err := provider(db, log)
	if err != nil {
		return 0, err
	}
	res, err := p.Up(ctx)
	if err != nil {
		return 0, fmt.Errorf("migrate: %w", err)
	}
	for _, r := range res {
		log.Info("migration applied", "version", r.Source.Version, "file", r.Source.Path, "duration", r.Duration)
	}
	return p.GetDBVersion(ctx)
}

// Status reports the applied version and the newest version this binary knows.
func Status(ctx context.Context, pool *pgxpool.Pool) (current, latest int64, err error) {
	db := stdlib.OpenDBFromPool(pool)
	defer db.Close()
	p, err := provider(db, slog.New(slog.DiscardHandler))
	if err != nil {
		return 0, 0, err
	}
	current, err = p.GetDBVersion(ctx)
	if err != nil {
		return 0, 0, fmt.Errorf("read schema version: %w", err)
	}
	sources := p.ListSources()
	if len(sources) > 0 {
		latest = sources[len(sources)-1].Version
	}
	return current, latest, nil
}

func provider(db *sql.DB, log *slog.Logger) (*goose.Provider, error) {
	locker, err := lock.NewPostgresSessionLocker()
	if err != nil {
		return nil, err
	}
	return goose.NewProvider(goose.DialectPostgres, db, files,
		goose.WithSessionLocker(locker),
		goose.WithSlog(log),
		goose.WithDisableGlobalRegistry(true),
	)
}

// Fingerprint is a short hash of every migration file, so test harnesses can
// tell a template database built from an older schema.
func Fingerprint() string {
	h := sha256.New()
	entries, _ := fs.ReadDir(files, ".")
	for _, e := range entries {
		b, _ := fs.ReadFile(files, e.Name())
		fmt.Fprintf(h, "%s\x00%d\x00", e.Name(), len(b))
		h.Write(b)
	}
	return hex.EncodeToString(h.Sum(nil))[:12]
}
