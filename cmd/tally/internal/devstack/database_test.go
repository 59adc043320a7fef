package devstack_test

import (
	"context"
	"net/url"
	"path/filepath"
	"strings"
	"testing"

	"github.com/jackc/pgx/v5"

	"github.com/tally-ledger/tally/cmd/tally/internal/devstack"
)

// Two clones on one machine (two data directories) get two databases on
// the local server, each the same on every start: positions one clone's
// embedded broker left in its database never stop the other's first run.
func TestLocalServerDatabasePerDirectory(t *testing.T) {
	ctx := context.Background()
	first, second := filepath.Join(t.TempDir(), ".tally-dev"), filepath.Join(t.TempDir(), ".tally-dev")
	start := func(dir string) string {
		t.Helper()
		pg, err := devstack.StartPostgres(ctx, devstack.PostgresConfig{Dir: dir})
		if err != nil {
			t.Fatal(err)
		}
		if pg.Source != "local server" {
			t.Fatalf("want the local server at %s, got %s", devstack.DefaultLocalAddr, pg.Source)
		}
		u, err := url.Parse(pg.URL)
		if err != nil {
			t.Fatal(err)
		}
		name := strings.TrimPrefix(u.Path, "/")
		t.Cleanup(func() { dropDatabase(t, pg.URL, name) })
		return name
	}
	a, b := start(first), start(second)
	if a == b {
		t.Fatalf("both data directories use database %q", a)
	}
	if again := start(first); again != a {
		t.Fatalf("the first directory's database changed between starts: %q, then %q", a, again)
	}
	for _, name := range []string{a, b} {
		if !strings.HasPrefix(name, devstack.DefaultDatabase+"_") || len(name) > 63 {
			t.Errorf("database %q: want %s_ and a short suffix", name, devstack.DefaultDatabase)
		}
	}
	if want, err := devstack.LocalDatabase(first); err != nil || want != a {
		t.Errorf("LocalDatabase(%s) = %q, %v; StartPostgres used %q", first, want, err, a)
	}
}

func dropDatabase(t *testing.T, dbURL, name string) {
	t.Helper()
	if name == devstack.DefaultDatabase {
		return // not this test's: it may be the machine's own dev database
	}
	u, err := url.Parse(dbURL)
	if err != nil {
		t.Fatal(err)
	}
	u.Path = "/postgres"
	c, err := pgx.Connect(context.Background(), u.String())
	if err != nil {
		t.Error(err)
		return
	}
	defer c.Close(context.Background())
	if _, err := c.Exec(context.Background(), "DROP DATABASE IF EXISTS "+pgx.Identifier{name}.Sanitize()+" WITH (FORCE)"); err != nil {
		t.Error(err)
	}
}

// Reset drops the data directory's database and creates it empty, and
// says what it dropped; it never drops a database TALLY_DATABASE_URL names.
func TestResetDropsOnlyTheDevDatabase(t *testing.T) {
	ctx := context.Background()
	dir := filepath.Join(t.TempDir(), ".tally-dev")
	pg, err := devstack.StartPostgres(ctx, devstack.PostgresConfig{Dir: dir})
	if err != nil {
		t.Fatal(err)
	}
	name, err := devstack.LocalDatabase(dir)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { dropDatabase(t, pg.URL, name) })
	c, err := pgx.Connect(ctx, pg.URL)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := c.Exec(ctx, "CREATE TABLE ingest_partitions (next_offset bigint)"); err != nil {
		t.Fatal(err)
	}
	c.Close(ctx)

	pg, err = devstack.StartPostgres(ctx, devstack.PostgresConfig{Dir: dir, Reset: true})
	if err != nil {
		t.Fatal(err)
	}
	if pg.Dropped != name {
		t.Fatalf("Dropped %q, want %q", pg.Dropped, name)
	}
	c, err = pgx.Connect(ctx, pg.URL)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close(ctx)
	var left bool
	if err := c.QueryRow(ctx, "SELECT EXISTS (SELECT 1 FROM pg_tables WHERE tablename = 'ingest_partitions')").Scan(&left); err != nil || left {
		t.Fatalf("after Reset the old database's table is still there (%v, %v)", left, err)
	}
	if _, err := devstack.StartPostgres(ctx, devstack.PostgresConfig{URL: pg.URL, Dir: dir, Reset: true}); err == nil ||
		!strings.Contains(err.Error(), "TALLY_DATABASE_URL") {
		t.Fatalf("Reset with a chosen database: %v", err)
	}
}
