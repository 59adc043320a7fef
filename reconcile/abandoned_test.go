package reconcile_test

import (
	"context"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/tally-ledger/tally/reconcile"
)

// A run whose process dies mid-run (SIGKILL, an OOM kill: its sessions
// end and it stores nothing more) is not shown as running forever: the
// next run stores it as failed, saying why. A run still running in a live
// process is left alone.
func TestARunLeftRunningByADeadProcessIsStoredFailed(t *testing.T) {
	e := newEnv(t)
	ctx := context.Background()
	e.apply(rec("gw", 1, "acme", 1, "10", "10", nov))
	e.now = time.Date(2026, 12, 5, 12, 0, 0, 0, time.UTC)

	// The checks wait while the records are locked.
	lock, err := e.pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = lock.Rollback(ctx) }()
	if _, err := lock.Exec(ctx, "LOCK TABLE records IN ACCESS EXCLUSIVE MODE"); err != nil {
		t.Fatal(err)
	}

	// The doomed process: its own pool, which cannot connect again once
	// it is dead.
	cfg := e.pool.Config().Copy()
	cfg.ConnConfig.RuntimeParams["application_name"] = "doomed-reconcile"
	var dead atomic.Bool
	cfg.BeforeConnect = func(context.Context, *pgx.ConnConfig) error {
		if dead.Load() {
			return context.Canceled
		}
		return nil
	}
	doomedPool, err := pgxpool.NewWithConfig(ctx, cfg)
	if err != nil {
		t.Fatal(err)
	}
	defer doomedPool.Close()
	doomed, err := reconcile.New(reconcile.Config{Pool: doomedPool, Clock: func() time.Time { return e.now }})
	if err != nil {
		t.Fatal(err)
	}
	ended := make(chan struct{})
	go func() {
		defer close(ended)
		_, _ = doomed.Run(ctx, reconcile.Options{Period: "2026-11-01"})
	}()
	running := func() []string {
		rows, err := e.pool.Query(ctx, "SELECT id::text FROM reconciliation_runs WHERE status = 'running' ORDER BY id")
		if err != nil {
			t.Fatal(err)
		}
		ids, err := pgx.CollectRows(rows, pgx.RowTo[string])
		if err != nil {
			t.Fatal(err)
		}
		return ids
	}
	deadline := time.Now().Add(20 * time.Second)
	for len(running()) == 0 && time.Now().Before(deadline) {
		time.Sleep(20 * time.Millisecond)
	}
	ids := running()
	if len(ids) != 1 {
		t.Fatalf("runs running: %v, want the doomed one", ids)
	}
	doomedID := ids[0]

	// Another run (of another period) while the doomed process lives
	// leaves its run alone; it waits for the records too, and gives up.
	wctx, cancel := context.WithTimeout(ctx, time.Second)
	_, _ = e.rc.Run(wctx, reconcile.Options{Period: "2026-10-01"})
	cancel()
	if got := running(); len(got) != 1 || got[0] != doomedID {
		t.Fatalf("runs running while the doomed process lives: %v, want %s", got, doomedID)
	}

	// The process dies: its sessions end, it connects no more.
	dead.Store(true)
	if _, err := e.pool.Exec(ctx, "SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE application_name = 'doomed-reconcile'"); err != nil {
		t.Fatal(err)
	}
	<-ended
	if err := lock.Rollback(ctx); err != nil {
		t.Fatal(err)
	}
	if got := running(); len(got) != 1 || got[0] != doomedID {
		t.Fatalf("runs running after the process died: %v, want %s, left as it was", got, doomedID)
	}

	if r := e.run(reconcile.Options{Period: "2026-11-01"}); r.Status != reconcile.StatusClean {
		t.Fatalf("the next run: %s %v", r.Status, r.Findings)
	}
	var status, msg string
	if err := e.pool.QueryRow(ctx, "SELECT status, coalesce(error, '') FROM reconciliation_runs WHERE id = $1", doomedID).Scan(&status, &msg); err != nil {
		t.Fatal(err)
	}
	if status != reconcile.StatusFailed || !strings.Contains(msg, "ended before it finished") {
		t.Errorf("the dead process's run is %s (%q), want failed saying its process ended", status, msg)
	}
}
