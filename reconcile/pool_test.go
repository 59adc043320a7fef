package reconcile_test

import (
	"context"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/tally-ledger/tally/reconcile"
)

// Runs of several periods at once, more than the pool has connections
// (an API process's pool of 4 and as many POST /v1/reconciliations),
// each finish: a run's period locks never hold a connection of the pool
// that the runs' checks then wait for.
func TestConcurrentRunsNeverExhaustTheirPool(t *testing.T) {
	e := newEnv(t)
	e.apply(rec("gw", 1, "acme", 1, "10", "10", nov))
	cfg := e.pool.Config().Copy()
	cfg.MaxConns = 2
	pool, err := pgxpool.NewWithConfig(context.Background(), cfg)
	if err != nil {
		t.Fatal(err)
	}
	defer pool.Close()
	rc, err := reconcile.New(reconcile.Config{Pool: pool, Clock: func() time.Time { return e.now }})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	periods := []string{"2026-08-01", "2026-09-01", "2026-10-01", "2026-11-01"}
	errs := make(chan error, len(periods))
	for _, p := range periods {
		go func() {
			_, err := rc.Run(ctx, reconcile.Options{Period: p})
			errs <- err
		}()
	}
	for range periods {
		if err := <-errs; err != nil {
			t.Errorf("run: %v", err)
		}
	}
}
