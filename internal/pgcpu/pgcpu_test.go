package pgcpu_test

import (
	"context"
	"os"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/tally-ledger/tally/internal/pgcpu"
	"github.com/tally-ledger/tally/internal/pgtest"
)

// A process's CPU, read from /proc, grows while it runs.
func TestBackendReadsAProcessCPU(t *testing.T) {
	pid := int32(os.Getpid())
	before, ok := pgcpu.Backend(pid)
	if !ok {
		t.Fatalf("CPU of this process (%d) not read from /proc", pid)
	}
	for end := time.Now().Add(300 * time.Millisecond); time.Now().Before(end); { // spin
	}
	if after, ok := pgcpu.Backend(pid); !ok || after <= before {
		t.Fatalf("CPU of this process %s, then %s after 300 ms of spinning (ok %v); want it grown", before, after, ok)
	}
}

// The CPU of the database's backends grows with the work they do, and a
// name matches only the backends that carry it. A Postgres on another
// host (TALLY_TEST_DATABASE_URL) reads as not readable.
func TestDatabaseCountsItsBackendsWork(t *testing.T) {
	pool := pgtest.New(t)
	ctx := context.Background()
	var pid int32
	if err := pool.QueryRow(ctx, `SELECT pg_backend_pid()`).Scan(&pid); err != nil {
		t.Fatal(err)
	}
	comm, err := os.ReadFile("/proc/" + strconv.Itoa(int(pid)) + "/comm")
	local := err == nil && strings.HasPrefix(string(comm), "postgres")
	before, n, ok := pgcpu.Database(ctx, pool, "")
	if !local {
		if ok {
			t.Fatalf("backend %d is not a process of this host, yet the database's backends read as %s", pid, before)
		}
		return
	}
	if !ok || n < 1 {
		t.Fatalf("backends' CPU not read (%d backends, ok %v): want the pool's, from /proc", n, ok)
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
