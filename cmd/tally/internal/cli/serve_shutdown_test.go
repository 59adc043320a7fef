package cli

import (
	"bytes"
	"context"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/tally-ledger/tally/cmd/tally/internal/bench/floodbench"
	"github.com/tally-ledger/tally/internal/pgtest"
)

// A reconciliation run over REST that is still running when serve is
// stopped (SIGTERM: a deploy) is cancelled once the HTTP drain is over:
// serve stops within a bound, without an error, and the run is stored as
// failed, not left "running" with its answer never stored.
func TestServeStopCancelsARunStillRunningAfterTheDrain(t *testing.T) {
	// Hold the ledger's records: the run's checks wait for them.
	db, pool, unlock := lockedRecords(t)

	addr, stop := startServe(t, "--api", "--database-url", db, "--kafka-brokers", "127.0.0.1:1", "--admin-token", testAdminToken)
	waitListening(t, addr)
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
		unlock()
	}()
	start := time.Now()
	err := stop()
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

// The first SIGTERM stops serve gracefully (here a request that holds the
// HTTP drain); a second one ends the process at once, as an operator who
// presses Ctrl-C again expects.
func TestASecondSignalEndsTheProcessAtOnce(t *testing.T) {
	db, pool, _ := lockedRecords(t)
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := ln.Addr().String()
	ln.Close()
	cmd := exec.Command(os.Args[0], "serve", "--api", "--listen", addr, "--kafka-brokers", "127.0.0.1:1")
	cmd.Env = append(os.Environ(), floodbench.LoadEnv+"=1", "TALLY_DATABASE_URL="+db, "TALLY_ADMIN_TOKEN="+testAdminToken)
	var logs bytes.Buffer
	cmd.Stderr = &logs
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	exited := make(chan error, 1)
	waited := make(chan struct{})
	go func() { exited <- cmd.Wait(); close(waited) }()
	defer func() {
		_ = cmd.Process.Kill()
		<-waited
		if t.Failed() {
			t.Logf("tally serve logs:\n%s", logs.String())
		}
	}()
	waitListening(t, addr)
	go func() {
		req, _ := http.NewRequest(http.MethodPost, "http://"+addr+"/v1/reconciliations", strings.NewReader(`{"period":"current"}`))
		req.Header.Set("Authorization", "Bearer "+testAdminToken)
		req.Header.Set("Content-Type", "application/json")
		if resp, err := http.DefaultClient.Do(req); err == nil {
			resp.Body.Close()
		}
	}()
	deadline := time.Now().Add(30 * time.Second)
	var running int
	for running == 0 && time.Now().Before(deadline) {
		time.Sleep(50 * time.Millisecond)
		_ = pool.QueryRow(context.Background(), "SELECT count(*) FROM reconciliation_runs WHERE status = 'running'").Scan(&running)
	}
	if running != 1 {
		t.Fatalf("%d runs running, want the one posted", running)
	}
	if err := cmd.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	select {
	case err := <-exited:
		t.Fatalf("serve exited %v before its drain was over", err)
	case <-time.After(time.Second):
	}
	start := time.Now()
	if err := cmd.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	select {
	case <-exited:
		if took := time.Since(start); took > 3*time.Second {
			t.Errorf("serve exited %v after the second signal, want at once", took)
		}
	case <-time.After(30 * time.Second):
		t.Fatal("serve still runs 30s after a second signal")
	}
}

// lockedRecords is a new database whose records table another
// transaction holds locked until the test ends (a reconciliation run
// waits on it), a pool on it, and what lets the lock go earlier.
func lockedRecords(t *testing.T) (string, *pgxpool.Pool, func()) {
	t.Helper()
	db := pgtest.NewURL(t)
	pool, err := pgxpool.New(context.Background(), db)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pool.Close)
	lock, err := pool.Begin(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	unlock := func() { _ = lock.Rollback(context.Background()) }
	t.Cleanup(unlock)
	if _, err := lock.Exec(context.Background(), "LOCK TABLE records IN ACCESS EXCLUSIVE MODE"); err != nil {
		t.Fatal(err)
	}
	return db, pool, unlock
}

// waitListening waits until serve answers /healthz at addr (30 s at most).
func waitListening(t *testing.T, addr string) {
	t.Helper()
	for up := time.Now().Add(30 * time.Second); ; time.Sleep(50 * time.Millisecond) {
		if resp, err := http.Get("http://" + addr + "/healthz"); err == nil {
			resp.Body.Close()
			return
		}
		if time.Now().After(up) {
			t.Fatal("serve did not listen within 30s")
		}
	}
}
