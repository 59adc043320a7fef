// Package pgtest gives each test its own database on the real Postgres.
//
// The first call in a test process builds (once per schema version, shared by
// all test processes) a template database with every migration applied;
// each test then gets a fresh clone of it, dropped when the test ends. A
// Postgres that cannot be reached fails the test with a message saying how
// to start one: nothing is skipped.
package pgtest

import (
	"context"
	"fmt"
	"log/slog"
	"net/url"
	"os"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/tally-ledger/tally/internal/locks"
	"github.com/tally-ledger/tally/migrations"
)

// DefaultURL is the local development server (trust auth, user root).
const DefaultURL = "postgres://root@127.0.0.1:5432/test?sslmode=disable"

// AdminURL returns TALLY_TEST_DATABASE_URL or DefaultURL.
func AdminURL() string {
	if u := os.Getenv("TALLY_TEST_DATABASE_URL"); u != "" {
		return u
	}
	return DefaultURL
}

var (
	templateOnce sync.Once
	templateName string
	templateErr  error
)

// New returns a pool on a fresh, fully migrated database of its own.
func New(t testing.TB) *pgxpool.Pool {
	t.Helper()
	url := NewURL(t)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	pool, err := pgxpool.New(ctx, url)
	if err != nil {
		t.Fatalf("pgtest: open pool: %v", err)
	}
	t.Cleanup(pool.Close)
	return pool
}

// NewURL creates a fresh migrated database and returns its connection URL,
// for tests that start a separate process against it.
func NewURL(t testing.TB) string {
	t.Helper()
	templateOnce.Do(func() { templateName, templateErr = buildTemplate() })
	if templateErr != nil {
		t.Fatalf("pgtest: %v", templateErr)
	}
	return create(t, "TEMPLATE "+pgx.Identifier{templateName}.Sanitize())
}

// NewEmptyURL creates an empty database (no migrations) and returns its URL.
func NewEmptyURL(t testing.TB) string {
	t.Helper()
	return create(t, "")
}

func create(t testing.TB, suffix string) string {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	admin, err := connect(ctx, AdminURL())
	if err != nil {
		t.Fatalf("pgtest: %v", err)
	}
	defer admin.Close(context.Background())
	name := "tally_t_" + strings.ReplaceAll(uuid.NewString(), "-", "")[:16]
	if _, err := admin.Exec(ctx, "CREATE DATABASE "+pgx.Identifier{name}.Sanitize()+" "+suffix); err != nil {
		t.Fatalf("pgtest: create database: %v", err)
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		c, err := connect(ctx, AdminURL())
		if err != nil {
			t.Errorf("pgtest: drop %s: %v", name, err)
			return
		}
		defer c.Close(ctx)
		if _, err := c.Exec(ctx, "DROP DATABASE IF EXISTS "+pgx.Identifier{name}.Sanitize()+" WITH (FORCE)"); err != nil {
			t.Errorf("pgtest: drop %s: %v", name, err)
		}
	})
	return WithDatabase(AdminURL(), name)
}

// WithDatabase returns u pointing at database name.
func WithDatabase(u, name string) string {
	parsed, err := url.Parse(u)
	if err != nil || parsed.Scheme == "" {
		// Keyword/value form.
		return u + " dbname=" + name
	}
	parsed.Path = "/" + name
	return parsed.String()
}

func connect(ctx context.Context, u string) (*pgx.Conn, error) {
	c, err := pgx.Connect(ctx, u)
	if err != nil {
		return nil, fmt.Errorf("cannot reach the test Postgres at %s (set TALLY_TEST_DATABASE_URL, or start the local server: pg_ctlcluster --skip-systemctl-redirect 15 main start): %w", redact(u), err)
	}
	return c, nil
}

// buildTemplate creates tally_tmpl_<schema fingerprint> once; concurrent test
// processes serialise on an advisory lock and reuse it.
func buildTemplate() (string, error) {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	admin, err := connect(ctx, AdminURL())
	if err != nil {
		return "", err
	}
	defer admin.Close(context.Background())
	name := "tally_tmpl_" + migrations.Fingerprint()
	if _, err := admin.Exec(ctx, "SELECT pg_advisory_lock($1)", int64(locks.TestTemplate)); err != nil {
		return "", fmt.Errorf("lock: %w", err)
	}
	defer admin.Exec(context.Background(), "SELECT pg_advisory_unlock($1)", int64(locks.TestTemplate))
	var exists bool
	if err := admin.QueryRow(ctx, "SELECT EXISTS (SELECT 1 FROM pg_database WHERE datname = $1 AND datistemplate)", name).Scan(&exists); err != nil {
		return "", err
	}
	if exists {
		return name, nil
	}
	ident := pgx.Identifier{name}.Sanitize()
	if _, err := admin.Exec(ctx, "DROP DATABASE IF EXISTS "+ident+" WITH (FORCE)"); err != nil {
		return "", err
	}
	if _, err := admin.Exec(ctx, "CREATE DATABASE "+ident); err != nil {
		return "", fmt.Errorf("create template: %w", err)
	}
	pool, err := pgxpool.New(ctx, WithDatabase(AdminURL(), name))
	if err != nil {
		return "", err
	}
	_, err = migrations.Up(ctx, pool, slog.New(slog.DiscardHandler))
	pool.Close()
	if err != nil {
		return "", fmt.Errorf("migrate template: %w", err)
	}
	if _, err := admin.Exec(ctx, "ALTER DATABASE "+ident+" WITH is_template true ALLOW_CONNECTIONS false"); err != nil {
		return "", err
	}
	return name, nil
}

func redact(u string) string {
	if p, err := url.Parse(u); err == nil && p.User != nil {
		if _, ok := p.User.Password(); ok {
			p.User = url.UserPassword(p.User.Username(), "xxx")
		}
		return p.String()
	}
	return u
}
