package cli

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/segmentio/kafka-go"
	"go.uber.org/goleak"

	"github.com/tally-ledger/tally/internal/kafkatest"
	"github.com/tally-ledger/tally/internal/pgtest"
)

const testAdminToken = "test-admin-token-0123456789abcdef0123"

func TestServeRefusesASchemaBehind(t *testing.T) {
	db := pgtest.NewEmptyURL(t)
	_, err := runTally(t, "serve", "--database-url", db, "--kafka-brokers", "127.0.0.1:1", "--listen", "127.0.0.1:0",
		"--admin-token", testAdminToken)
	if err == nil || !strings.Contains(err.Error(), "tally migrate") {
		t.Fatalf("serve on an unmigrated database: %v; want a refusal naming tally migrate", err)
	}
}

func TestServeAPINeedsAnAdminToken(t *testing.T) {
	t.Setenv("TALLY_ADMIN_TOKEN", "")
	for _, args := range [][]string{{"serve"}, {"serve", "--api"}, {"serve", "--api", "--admin-token", "short"}} {
		_, err := runTally(t, args...)
		if err == nil || !strings.Contains(err.Error(), "TALLY_ADMIN_TOKEN") {
			t.Errorf("%v: %v", args, err)
		}
	}
}

// serve (ingest, API and enforcer) applies a batch sent to Kafka, answers
// for it over REST, serves /metrics (admin token) and /healthz, and stops
// cleanly when its context ends.
func TestServeIngests(t *testing.T) {
	ignore := goleak.IgnoreCurrent()
	t.Cleanup(func() { goleak.VerifyNone(t, ignore) }) // runs last, after the cluster and database are gone
	db := pgtest.NewURL(t)
	k := kafkatest.New(t, kafkatest.Options{Topics: []kafkatest.Topic{{Name: "tally.meter-batches", Partitions: 2}}})
	sample, err := readSample("valid-quantity-final.json")
	if err != nil {
		t.Fatal(err)
	}
	k.Produce(t, "tally.meter-batches", kafka.Message{Key: []byte("acme"), Value: sample})

	addr, stop := startServe(t, "--database-url", db, "--kafka-brokers", strings.Join(k.Addrs, ","), "--admin-token", testAdminToken)
	defer func() {
		if err := stop(); err != nil {
			t.Errorf("serve: %v", err)
		}
	}()

	pool, err := pgxpool.New(context.Background(), db)
	if err != nil {
		t.Fatal(err)
	}
	defer pool.Close()
	deadline := time.Now().Add(30 * time.Second)
	var n int
	for n == 0 && time.Now().Before(deadline) {
		time.Sleep(50 * time.Millisecond)
		_ = pool.QueryRow(context.Background(), "SELECT count(*) FROM records").Scan(&n)
	}
	if n != 3 { // the sample's third record reuses the first one's operation_id: a conflict
		t.Fatalf("%d records in the ledger, want the sample's 3", n)
	}
	for path, want := range map[string]string{
		"/healthz": "ok",
		"/readyz":  "ready",
		"/metrics": `tally_ingest_records_total{outcome="applied",topic="tally.meter-batches"} 3`,
		"/v1/customers/acme/usage?meter=api_calls&period=2026-12-01": `"total":"12.25"`,
	} {
		var body []byte
		for range 50 { // the counter follows the commit by a moment
			req, _ := http.NewRequest(http.MethodGet, "http://"+addr+path, nil)
			req.Header.Set("Authorization", "Bearer "+testAdminToken)
			resp, err := http.DefaultClient.Do(req)
			if err != nil {
				t.Fatal(err)
			}
			body, _ = io.ReadAll(resp.Body)
			resp.Body.Close()
			if bytes.Contains(body, []byte(want)) {
				break
			}
			time.Sleep(50 * time.Millisecond)
		}
		if !bytes.Contains(body, []byte(want)) {
			t.Errorf("GET %s: no %q in\n%.2000s", path, want, body)
		}
	}
}

func readSample(name string) ([]byte, error) {
	return os.ReadFile(filepath.Join("..", "..", "..", "..", "testdata", "batches", name))
}

// A small end-to-end run of tally bench ingest: it must ingest every record
// exactly once (it checks the counters itself) and print the ratios.
func TestBenchIngestSmall(t *testing.T) {
	out, err := runTally(t, "bench", "ingest", "--records", "3000", "--per-message", "500", "--rounds", "1",
		"--database-url", pgtest.AdminURL())
	if err != nil {
		t.Fatalf("bench: %v\n%s", err, out)
	}
	for _, want := range []string{"ingest, unique records", "% duplicates", "COPY into a records-shaped table", "ingest unique / COPY", "ingest duplicates / unique"} {
		if !strings.Contains(out, want) {
			t.Errorf("no %q in\n%s", want, out)
		}
	}
}

// TestServeAPILoadNeverStarvesIngest: the API has a pool of its own. With
// every API connection stuck (a lock on api_tokens holds each token check)
// and a flood of made-up tokens waiting behind them, a batch sent to Kafka
// is applied before any of them gives up, and the API never holds more
// connections than its pool.
func TestServeAPILoadNeverStarvesIngest(t *testing.T) {
	db := pgtest.NewURL(t)
	k := kafkatest.New(t, kafkatest.Options{Topics: []kafkatest.Topic{{Name: "tally.meter-batches", Partitions: 2}}})
	sample, err := readSample("valid-quantity-final.json")
	if err != nil {
		t.Fatal(err)
	}
	addr, stopServe := startServe(t, "--database-url", db, "--kafka-brokers", strings.Join(k.Addrs, ","),
		"--admin-token", testAdminToken, "--api-pool-size", "2", "--api-rate-per-address", "0", "--api-max-in-flight", "200")
	defer func() {
		if err := stopServe(); err != nil {
			t.Errorf("serve: %v", err)
		}
	}()
	pool, err := pgxpool.New(context.Background(), db)
	if err != nil {
		t.Fatal(err)
	}
	defer pool.Close()
	get := func(path, token string) int {
		req, _ := http.NewRequest(http.MethodGet, "http://"+addr+path, nil)
		req.Header.Set("Authorization", "Bearer "+token)
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			return 0
		}
		resp.Body.Close()
		return resp.StatusCode
	}
	for deadline := time.Now().Add(30 * time.Second); get("/readyz", "") != 200; time.Sleep(50 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatal("serve not ready in 30s")
		}
	}
	// Every token check now waits for this lock, holding an API connection.
	tx, err := pool.Begin(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	defer tx.Rollback(context.Background())
	if _, err := tx.Exec(context.Background(), `LOCK TABLE api_tokens IN ACCESS EXCLUSIVE MODE`); err != nil {
		t.Fatal(err)
	}
	stop := make(chan struct{})
	var wg sync.WaitGroup
	var answered atomic.Int64 // none is, until the API's 10s request timeout
	for i := range 50 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for j := 0; ; j++ {
				select {
				case <-stop:
					return
				default:
				}
				get("/v1/customers/acme", fmt.Sprintf("tly_%043d", i*1_000_000+j))
				answered.Add(1)
			}
		}()
	}
	defer func() { close(stop); _ = tx.Rollback(context.Background()); wg.Wait() }()
	apiConns := func() (n int) {
		_ = pool.QueryRow(context.Background(), `SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() AND application_name = 'tally-api'`).Scan(&n)
		return n
	}
	for deadline := time.Now().Add(30 * time.Second); apiConns() < 2; time.Sleep(20 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatal("the flood did not reach the API's pool")
		}
	}
	k.Produce(t, "tally.meter-batches", kafka.Message{Key: []byte("acme"), Value: sample})
	var n int
	for deadline := time.Now().Add(30 * time.Second); n == 0 && time.Now().Before(deadline); time.Sleep(50 * time.Millisecond) {
		_ = pool.QueryRow(context.Background(), "SELECT count(*) FROM records").Scan(&n)
		if c := apiConns(); c > 2 {
			t.Fatalf("the API holds %d connections, its pool has 2", c)
		}
	}
	if n != 3 {
		t.Fatalf("%d records applied while the API was flooded, want the sample's 3", n)
	}
	// Applied while every API request was still waiting: ingest did not
	// need one of them to give up its connection.
	if a := answered.Load(); a != 0 {
		t.Fatalf("the batch was applied only after %d API requests gave up", a)
	}
}

// A small run of tally bench flood: every measurement is made and printed.
func TestBenchFloodSmall(t *testing.T) {
	out, err := runTally(t, "bench", "flood", "--records", "2000", "--per-message", "200", "--rounds", "1", "--conns", "8",
		"--methods", "2000", "--saturation", "1s", "--warmup", "200ms", "--database-url", pgtest.AdminURL(), "--database-prefix", "tally_test_flood")
	if err != nil {
		t.Fatalf("bench: %v\n%s", err, out)
	}
	for _, want := range []string{"API saturation", "CPU-only (/healthz)", "flood (made-up tokens)", "ingest flood / CPU-only", "each with a method name never sent before", "HTTP series"} {
		if !strings.Contains(out, want) {
			t.Errorf("no %q in\n%s", want, out)
		}
	}
	t.Log(out)
}

func TestServeRefusesAnEmptyPool(t *testing.T) {
	for _, flag := range []string{"--ingest-pool-size", "--api-pool-size", "--enforce-pool-size"} {
		_, err := runTally(t, "serve", "--database-url", pgtest.AdminURL(), "--admin-token", testAdminToken, flag, "0")
		if err == nil || !strings.Contains(err.Error(), flag+" must be at least 1") {
			t.Errorf("%s 0: %v", flag, err)
		}
	}
}

// serve checks the Kafka addresses and the ingest's timings as flags,
// before it opens anything: found by the components, on a migrated
// database, they were their Go fields ("ingest: Brokers is empty",
// "HeartbeatInterval 10s must be at most half of SessionTimeout 2s"),
// exit 1. TALLY_KAFKA_BROKERS set but empty names no broker either.
func TestServeRefusesItsFlagsByName(t *testing.T) {
	db := pgtest.NewURL(t)
	t.Setenv("TALLY_KAFKA_BROKERS", "")
	for _, tc := range []struct {
		args []string
		says string
	}{
		{[]string{"--ingest"}, "--kafka-brokers (TALLY_KAFKA_BROKERS) names no broker"},
		{[]string{"--enforce", "--kafka-brokers", ","}, "--kafka-brokers (TALLY_KAFKA_BROKERS) names no broker"},
		// Read as reconcile --deep reads them: a port, when given, is one.
		{[]string{"--ingest", "--kafka-brokers", "127.0.0.1:9092,kafka-2:port"}, `--kafka-brokers (TALLY_KAFKA_BROKERS) names "kafka-2:port", whose port`},
		{[]string{"--ingest", "--kafka-brokers", "127.0.0.1:1", "--heartbeat-interval", "10s"}, "--heartbeat-interval (TALLY_HEARTBEAT_INTERVAL) 10s must be at most half of --session-timeout"},
		{[]string{"--ingest", "--kafka-brokers", "127.0.0.1:1", "--session-timeout", "-1s"}, "--session-timeout"},
		{[]string{"--ingest", "--kafka-brokers", "127.0.0.1:1", "--heartbeat-interval", "0s"}, "--heartbeat-interval"},
		{[]string{"--api", "--admin-token", testAdminToken, "--api-body-timeout", "-1s"}, "--api-body-timeout"},
		// No listener: the API was not served, and serve --api exited 0 at once.
		{[]string{"--api", "--admin-token", testAdminToken, "--listen", ""}, `"--listen" flag: must not be empty`},
		{[]string{"--ingest", "--kafka-brokers", "127.0.0.1:1", "--listen", ""}, `"--listen" flag: must not be empty`},
	} {
		var out, errOut bytes.Buffer
		args := append([]string{"serve", "--database-url", db, "--listen", "127.0.0.1:0"}, tc.args...)
		// A serve that starts is stopped (the test fails then).
		ctx, cancel := context.WithTimeout(t.Context(), 3*time.Second)
		code := execute(ctx, args, &out, &errOut)
		cancel()
		if code != exitUsage || !strings.Contains(errOut.String(), tc.says) {
			t.Errorf("tally %s: exit %d, want 2 saying %q; stderr:\n%s", strings.Join(args, " "), code, tc.says, errOut.String())
		}
	}
}

// serveUsage runs tally serve with args and env (variable to value) on a
// migrated database and returns its exit code and stderr. A serve that
// starts is stopped after 3 s (the caller's check then fails).
func serveUsage(t *testing.T, db string, env map[string]string, args ...string) (int, string) {
	t.Helper()
	for k, v := range env {
		t.Setenv(k, v)
	}
	var out, errOut bytes.Buffer
	args = append([]string{"serve", "--database-url", db, "--listen", "127.0.0.1:0", "--admin-token", testAdminToken}, args...)
	ctx, cancel := context.WithTimeout(t.Context(), 3*time.Second)
	defer cancel()
	return execute(ctx, args, &out, &errOut), errOut.String()
}

// --api-max-in-flight below 1 is a usage error naming the flag and its
// variable: 0 silently meant the API's default of 64 and a negative value
// no bound at all. So is a negative --api-bodies-per-address (0 is its
// documented "no bound").
func TestServeAPIMaxInFlightMustBePositive(t *testing.T) {
	db := pgtest.NewURL(t)
	for _, tc := range []struct {
		env  map[string]string
		args []string
	}{
		{nil, []string{"--api", "--api-max-in-flight", "0"}},
		{nil, []string{"--api", "--api-max-in-flight", "-1"}},
		{map[string]string{"TALLY_API_MAX_IN_FLIGHT": "0"}, []string{"--api"}},
	} {
		t.Run(strings.Join(tc.args, " "), func(t *testing.T) {
			code, stderr := serveUsage(t, db, tc.env, tc.args...)
			if code != exitUsage || !strings.Contains(stderr, "--api-max-in-flight (TALLY_API_MAX_IN_FLIGHT) must be at least 1") {
				t.Errorf("exit %d, want 2 naming --api-max-in-flight and TALLY_API_MAX_IN_FLIGHT; stderr:\n%s", code, stderr)
			}
		})
	}
	for _, env := range []map[string]string{nil, {"TALLY_API_BODIES_PER_ADDRESS": "-1"}} {
		args := []string{"--api"}
		if env == nil {
			args = append(args, "--api-bodies-per-address", "-1")
		}
		t.Run(strings.Join(args, " "), func(t *testing.T) {
			code, stderr := serveUsage(t, db, env, args...)
			if code != exitUsage || !strings.Contains(stderr, "--api-bodies-per-address (TALLY_API_BODIES_PER_ADDRESS) must be 0 (no bound) or more") {
				t.Errorf("exit %d, want 2 naming --api-bodies-per-address and TALLY_API_BODIES_PER_ADDRESS; stderr:\n%s", code, stderr)
			}
		})
	}
}

// A rate flag is a number of requests per second, 0 (off) or more: NaN,
// Inf and negative values (which turned the limit off) are a usage error
// naming the flag and its variable, given either way.
func TestServeAPIRatesMustBeFiniteAndNotNegative(t *testing.T) {
	db := pgtest.NewURL(t)
	for flag, env := range map[string]string{
		"--api-rate-per-address": "TALLY_API_RATE_PER_ADDRESS",
		"--api-rate-per-token":   "TALLY_API_RATE_PER_TOKEN",
		"--api-rate-per-gateway": "TALLY_API_RATE_PER_GATEWAY",
	} {
		for _, v := range []string{"NaN", "Inf", "-Inf", "-1"} {
			for _, viaEnv := range []bool{false, true} {
				args, vars := []string{"--api", flag, v}, map[string]string(nil)
				if viaEnv {
					args, vars = []string{"--api"}, map[string]string{env: v}
				}
				t.Run(fmt.Sprintf("%s=%s env %v", flag, v, viaEnv), func(t *testing.T) {
					code, stderr := serveUsage(t, db, vars, args...)
					want := fmt.Sprintf("%s (%s) must be a number of requests per second, 0 (off) or more", flag, env)
					if code != exitUsage || !strings.Contains(stderr, want) {
						t.Errorf("exit %d, want 2 saying %q; stderr:\n%s", code, want, stderr)
					}
				})
			}
		}
	}
}

// Every command reads its brokers with parseBrokers: a bare host is at
// Kafka's default port, as kafka-go dials it, and the list is host:port.
func TestParseBrokers(t *testing.T) {
	got, err := parseBrokers(" kafka-1 ,kafka-2:9093,[::1],127.0.0.1", brokersFlag)
	want := []string{"kafka-1:9092", "kafka-2:9093", "[::1]:9092", "127.0.0.1:9092"}
	if err != nil || strings.Join(got, ",") != strings.Join(want, ",") {
		t.Errorf("got %v, %v; want %v", got, err, want)
	}
	for _, bad := range []string{"", " , ", "kafka-1:", "::1", "kafka-1:0", "kafka-1:65536", ":9092"} {
		if _, err := parseBrokers(bad, brokersFlag); err == nil || !strings.Contains(err.Error(), brokersFlag) {
			t.Errorf("%q: %v; want an error naming %s", bad, err, brokersFlag)
		}
	}
}
