package cli

import (
	"bytes"
	"context"
	"encoding/json"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/shopspring/decimal"

	"github.com/tally-ledger/tally/alerts"
	"github.com/tally-ledger/tally/cmd/tally/internal/bench/floodbench"
	"github.com/tally-ledger/tally/internal/kafkatest"
	"github.com/tally-ledger/tally/internal/ledgertest"
	"github.com/tally-ledger/tally/internal/pgtest"
	"github.com/tally-ledger/tally/ledger"
	"github.com/tally-ledger/tally/periods"
	"github.com/tally-ledger/tally/quota"
)

// TestAlertsSurviveSIGKILL: tally serve --enforce (a child process) commits
// transitions while the webhook receiver refuses connections, and is
// killed with SIGKILL before it could deliver them; a second process
// delivers every event, in order, once, with verified signatures, and
// repeats no transition.
func TestAlertsSurviveSIGKILL(t *testing.T) {
	db := pgtest.NewURL(t)
	k := kafkatest.New(t, kafkatest.Options{Topics: []kafkatest.Topic{
		{Name: quota.DefaultIngestTopic, Partitions: 1}, {Name: quota.DefaultTopic, Partitions: 1}, {Name: alerts.DefaultTopic, Partitions: 1}}})
	ctx := context.Background()
	pool, err := pgxpool.New(ctx, db)
	if err != nil {
		t.Fatal(err)
	}
	defer pool.Close()
	led, err := ledger.New(ledger.Config{})
	if err != nil {
		t.Fatal(err)
	}
	streams := ledgertest.New(pool, led)
	ledgertest.Follow(t, pool, quota.DefaultIngestTopic, 1, time.Now)

	// The receiver: refuses connections until up.
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := ln.Addr().String()
	ln.Close()
	type got struct {
		id, sig string
		body    []byte
		at      time.Time
	}
	var mu sync.Mutex
	var reqs []got
	srv := &http.Server{ReadHeaderTimeout: time.Second, Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		b, _ := io.ReadAll(r.Body)
		mu.Lock()
		reqs = append(reqs, got{r.Header.Get("Tally-Event-Id"), r.Header.Get("Tally-Signature"), b, time.Now()})
		mu.Unlock()
		w.WriteHeader(http.StatusOK)
	})}
	defer srv.Close()

	_, secret, _, err := alerts.PutWebhook(ctx, pool, alerts.WebhookInput{Name: "billing", URL: "http://" + addr + "/hook", AllowPrivate: true}, time.Now())
	if err != nil {
		t.Fatal(err)
	}
	// acme's calendar, set before anything refers to it, so that no period
	// of it ends while the test runs: with the default calendar, usage
	// booked in a month's last moments was evaluated in the next month (no
	// transition), or the month's end resolved both thresholds before the
	// credit could.
	if _, _, err := (periods.Store{}).SetCalendar(ctx, pool, "acme", ledgertest.SteadyCalendar(time.Now())); err != nil {
		t.Fatal(err)
	}
	if _, err := quota.PutRuleDB(ctx, pool, quota.RuleInput{Customer: "acme", Meter: "calls", Limit: decimal.NewFromInt(100), Actor: "t"}); err != nil {
		t.Fatal(err)
	}
	eighty, hundred := decimal.NewFromInt(80), decimal.NewFromInt(100)
	if _, _, err := alerts.PutRule(ctx, pool, alerts.RuleInput{Name: "acme", Subject: "customer:acme", Meter: "calls",
		Thresholds: []alerts.Threshold{{Percent: &eighty}, {Percent: &hundred}}, Endpoints: []string{"billing"}, Actor: "t"}, time.Now()); err != nil {
		t.Fatal(err)
	}

	var logs bytes.Buffer
	var logMu sync.Mutex
	start := func() *exec.Cmd {
		cmd := exec.Command(os.Args[0], "serve", "--enforce", "--listen", "127.0.0.1:0")
		cmd.Env = append(os.Environ(), floodbench.LoadEnv+"=1", "TALLY_DATABASE_URL="+db,
			"TALLY_KAFKA_BROKERS="+strings.Join(k.Addrs, ","), "TALLY_WEBHOOK_ALLOW_PRIVATE=true")
		cmd.Stderr = writerFunc(func(p []byte) (int, error) { logMu.Lock(); defer logMu.Unlock(); return logs.Write(p) })
		if err := cmd.Start(); err != nil {
			t.Fatal(err)
		}
		return cmd
	}
	defer func() {
		if t.Failed() {
			logMu.Lock()
			t.Logf("tally serve logs:\n%s", logs.String())
			logMu.Unlock()
		}
	}()
	count := func(q string) int {
		var n int
		if err := pool.QueryRow(ctx, q).Scan(&n); err != nil {
			t.Fatal(err)
		}
		return n
	}
	wait := func(what string, d time.Duration, cond func() bool) {
		t.Helper()
		for deadline := time.Now().Add(d); !cond(); time.Sleep(20 * time.Millisecond) {
			if time.Now().After(deadline) {
				t.Fatalf("timed out waiting for %s", what)
			}
		}
	}

	first := start()
	var killed atomic.Bool
	defer func() {
		if !killed.Load() {
			_ = first.Process.Kill()
			_ = first.Wait()
		}
	}()
	streams.Use(t, "acme", "calls", ledgertest.Recent(time.Now()), decimal.NewFromInt(120))
	wait("two transitions", 30*time.Second, func() bool { return count(`SELECT count(*) FROM alert_events`) == 2 })
	if err := first.Process.Signal(syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	_ = first.Wait()
	killed.Store(true)
	if n := count(`SELECT count(*) FROM alert_deliveries WHERE endpoint = 'billing' AND state = 'delivered'`); n != 0 {
		t.Fatalf("%d deliveries before the receiver was up", n)
	}

	ln, err = net.Listen("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	go func() { _ = srv.Serve(ln) }()
	second := start()
	defer func() {
		_ = second.Process.Signal(syscall.SIGTERM)
		_ = second.Wait()
	}()
	// A delivery the killed process had claimed waits for its claim to
	// expire (15 s); the second leader waits for the killed one's lease
	// (10 s) before it evaluates; a credit then resolves both thresholds.
	wait("the first two delivered", 60*time.Second, func() bool {
		return count(`SELECT count(*) FROM alert_deliveries WHERE endpoint = 'billing' AND state = 'delivered'`) == 2
	})
	err = pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
		_, err := led.Adjust(ctx, tx, ledger.Adjustment{OperationID: uuid.New(), Customer: "acme", Meter: "calls",
			Quantity: decimal.NewFromInt(-100), Reason: "credit", Actor: "t"})
		return err
	})
	if err != nil {
		t.Fatal(err)
	}
	wait("four delivered", 60*time.Second, func() bool {
		return count(`SELECT count(*) FROM alert_deliveries WHERE endpoint = 'billing' AND state = 'delivered'`) == 4
	})
	time.Sleep(500 * time.Millisecond)

	rows, err := pool.Query(ctx, `SELECT id::text, type FROM alert_events ORDER BY seq`)
	if err != nil {
		t.Fatal(err)
	}
	type stored struct{ ID, Type string }
	evs, err := pgx.CollectRows(rows, pgx.RowToStructByPos[stored])
	if err != nil {
		t.Fatal(err)
	}
	mu.Lock()
	defer mu.Unlock()
	var order []string
	for _, r := range reqs {
		if err := alerts.Verify(secret, r.sig, r.body, r.at, time.Minute); err != nil {
			t.Errorf("event %s: %v", r.id, err)
		}
		var ev alerts.Event
		if err := json.Unmarshal(r.body, &ev); err != nil || ev.ID.String() != r.id {
			t.Errorf("body %s for id %s: %v", r.body, r.id, err)
		}
		if ev.Type == alerts.TypeResolved && ev.Reason != alerts.ReasonCredited {
			t.Errorf("event %s resolved with reason %q, want %q (the credit)", r.id, ev.Reason, alerts.ReasonCredited)
		}
		order = append(order, r.id)
	}
	var want, types []string
	for _, e := range evs {
		want, types = append(want, e.ID), append(types, e.Type)
	}
	if !slices.Equal(order, want) {
		t.Fatalf("received %v, stored %v", order, want)
	}
	if !slices.Equal(types, []string{alerts.TypeTriggered, alerts.TypeTriggered, alerts.TypeResolved, alerts.TypeResolved}) {
		t.Fatalf("events %v", types)
	}
}

type writerFunc func([]byte) (int, error)

func (f writerFunc) Write(p []byte) (int, error) { return f(p) }
