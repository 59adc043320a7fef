package cli

import (
	"context"
	"io"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/tally-ledger/tally/internal/pgtest"
)

// A reconciliation run over REST that is still running when serve is
// stopped (SIGTERM: a deploy) is cancelled once the HTTP drain is over:
// serve stops within a bound, without an error, and the run is stored as
// failed, not left "running" with its answer never stored.
func TestServeStopCancelsARunStillRunningAfterTheDrain(t *testing.T) {
	db := pgtest.NewURL(t)
	pool, err := pgxpool.New(context.Background(), db)
	if err != nil {
		t.Fatal(err)
	}
	defer pool.Close()
	// Hold the ledger's records: the run's checks wait for them.
	lock, err := pool.Begin(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = lock.Rollback(context.Background()) }()
	if _, err := lock.Exec(context.Background(), "LOCK TABLE records IN ACCESS EXCLUSIVE MODE"); err != nil {
		t.Fatal(err)
	}

	addr, stop := startServe(t, "--api", "--database-url", db, "--kafka-brokers", "127.0.0.1:1", "--admin-token", testAdminToken)
	for up := time.Now().Add(30 * time.Second); ; time.Sleep(50 * time.Millisecond) {
		if resp, err := http.Get("http://" + addr + "/healthz"); err == nil {
			resp.Body.Close()
			break
		}
		if time.Now().After(up) {
			t.Fatal("serve did not listen within 30s")
		}
	}
	answered := make(chan string, 1)
	go func() {
		req, _ := http.NewRequest(http.MethodPost, "http://"+addr+"/v1/reconciliations", strings.NewReader(`{"period":"current"}`))
		req.Header.Set("Authorization", "Bearer "+testAdminToken)
		req.Header.Set("Content-Type", "application/json")
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			answered <- err.Error()
			return
		}
		body, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		answered <- string(body)
	}()
	deadline := time.Now().Add(30 * time.Second)
	var running int
	for running == 0 && time.Now().Before(deadline) {
		select {
		case body := <-answered:
			t.Fatalf("answered before the run started: %.500s", body)
		case <-time.After(50 * time.Millisecond):
		}
		_ = pool.QueryRow(context.Background(), "SELECT count(*) FROM reconciliation_runs WHERE status = 'running'").Scan(&running)
	}
	if running != 1 {
		t.Fatalf("%d runs running, want the one posted", running)
	}

	// Whatever happens, the lock goes after a while, so a serve that waits
	// for the run still ends.
	go func() {
		time.Sleep(40 * time.Second)
		_ = lock.Rollback(context.Background())
	}()
	start := time.Now()
	err = stop()
	took := time.Since(start)
	if err != nil {
		t.Errorf("serve stopped with %v, want nil", err)
	}
	if took > 20*time.Second {
		t.Errorf("serve took %v to stop, want the drain (10s) and a moment", took)
	}
	var status, msg string
	if err := pool.QueryRow(context.Background(), "SELECT status, coalesce(error, '') FROM reconciliation_runs").Scan(&status, &msg); err != nil {
		t.Fatal(err)
	}
	if status != "failed" || !strings.Contains(msg, "canceled") {
		t.Errorf("the run is stored %q (%q), want failed: cancelled by the stop", status, msg)
	}
	select {
	case body := <-answered:
		if !strings.Contains(body, `"status":"failed"`) {
			t.Errorf("the request was answered %.500s, want the failed run", body)
		}
	case <-time.After(10 * time.Second):
		t.Error("the request was not answered")
	}
}
