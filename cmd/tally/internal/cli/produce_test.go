package cli

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/shopspring/decimal"
	"go.uber.org/goleak"

	"github.com/tally-ledger/tally/cmd/tally/internal/scenario"
	"github.com/tally-ledger/tally/ingest"
	"github.com/tally-ledger/tally/internal/kafkatest"
	"github.com/tally-ledger/tally/internal/pgtest"
	"github.com/tally-ledger/tally/ledger"
)

// TestProduceThenVerify runs `tally produce --faults all` with counters,
// a gauge and a unique meter against an in-process Kafka with the real
// ingest running, then `tally verify`: clean, and exit status 3 naming
// the difference once the truth is wrong, or the ledger's gauge and
// unique aggregates are.
func TestProduceThenVerify(t *testing.T) {
	ignore := goleak.IgnoreCurrent()
	t.Cleanup(func() { goleak.VerifyNone(t, ignore) })
	const topic = "tally.meter-batches"
	k := kafkatest.New(t, kafkatest.Options{Topics: []kafkatest.Topic{{Name: topic, Partitions: 4}}})
	db := pgtest.NewURL(t)
	pool, err := pgxpool.New(context.Background(), db)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pool.Close)
	l, err := ledger.New(ledger.Config{})
	if err != nil {
		t.Fatal(err)
	}
	cons, err := ingest.NewConsumer(ingest.Config{Brokers: k.Addrs, Topic: topic, Pool: pool, Ledger: l,
		Logger: slog.New(slog.DiscardHandler), Registry: prometheus.NewRegistry(), MaxBatchWait: 50 * time.Millisecond,
		HeartbeatInterval: 100 * time.Millisecond, SessionTimeout: 1500 * time.Millisecond, FetchMaxWait: 500 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- cons.Run(ctx) }()
	t.Cleanup(func() {
		cancel()
		<-done
	})

	expect := filepath.Join(t.TempDir(), "expect.json")
	out, err := runTally(t, "produce", "--kafka-brokers", strings.Join(k.Addrs, ","), "--duration", "2s", "--rate", "400",
		"--faults", "all", "--fault-rate", "0.1", "--linger", "10ms", "--spread", "1080h", "--expect", expect,
		"--gauges", "1", "--uniques", "1", "--database-url", db)
	if err != nil {
		t.Fatalf("produce: %v\n%s", err, out)
	}
	for _, want := range []string{"records acknowledged (each fsynced)", "2 crashes", "3 bad messages", "gauges and unique meters: ", "wrote " + expect} {
		if !strings.Contains(out, want) {
			t.Errorf("produce printed no %q:\n%s", want, out)
		}
	}

	out, err = runTally(t, "verify", "--expect", expect, "--database-url", db, "--wait", "60s")
	if err != nil || !strings.HasPrefix(out, "clean: run ") || !strings.Contains(out, "gauge and ") {
		t.Fatalf("verify: %v\n%s", err, out)
	}

	// Bill one more thousandth in the truth: verify must name it.
	var e scenario.Expect
	b, err := os.ReadFile(expect)
	if err != nil {
		t.Fatal(err)
	}
	if err := json.Unmarshal(b, &e); err != nil {
		t.Fatal(err)
	}
	if len(e.Gauges) == 0 || len(e.Uniques) == 0 {
		t.Fatalf("the truth has %d gauge and %d unique aggregates, want some of each", len(e.Gauges), len(e.Uniques))
	}
	e.Totals[0].Quantity = e.Totals[0].Quantity.Add(decimal.New(1, -3))
	if err := writeExpect(expect, &e); err != nil {
		t.Fatal(err)
	}
	out, err = runTally(t, "verify", "--expect", expect, "--database-url", db)
	var ee *ExitError
	if !errors.As(err, &ee) || ee.Code != 3 {
		t.Fatalf("verify against a wrong truth: %v, want exit status 3\n%s", err, out)
	}
	want := e.Totals[0].Customer + "/" + e.Totals[0].Meter + " period " + e.Totals[0].Period
	if !strings.Contains(out, "1 difference between") || !strings.Contains(out, want) || !strings.Contains(out, "short by 0.001") {
		t.Errorf("verify output does not name the difference (%s ... short by 0.001):\n%s", want, out)
	}

	// Alter the ledger instead: the unique meter's last member in the
	// latest period is forgotten, and a gauge bucket's level-seconds grow
	// by one.
	e.Totals[0].Quantity = e.Totals[0].Quantity.Sub(decimal.New(1, -3))
	if err := writeExpect(expect, &e); err != nil {
		t.Fatal(err)
	}
	u, g := e.Uniques[len(e.Uniques)-1], e.Gauges[len(e.Gauges)-1]
	if _, err := pool.Exec(context.Background(), `UPDATE unique_counts SET members = members - 1
		WHERE customer = $1 AND meter = $2 AND period_start = $3 AND NOT per_day`, u.Customer, u.Meter, u.PeriodStart); err != nil {
		t.Fatal(err)
	}
	if _, err := pool.Exec(context.Background(), `UPDATE gauge_days SET unit_seconds = unit_seconds + 1
		WHERE ctid = (SELECT ctid FROM gauge_days WHERE customer = $1 AND meter = $2 AND period_start = $3 ORDER BY day_start DESC LIMIT 1)`,
		g.Customer, g.Meter, g.PeriodStart); err != nil {
		t.Fatal(err)
	}
	out, err = runTally(t, "verify", "--expect", expect, "--database-url", db)
	if !errors.As(err, &ee) || ee.Code != 3 {
		t.Fatalf("verify against an altered ledger: %v, want exit status 3\n%s", err, out)
	}
	for _, want := range []string{"2 differences between",
		fmt.Sprintf("%s/%s period %s: ledger counts %d distinct members, expected %d (short by 1)", u.Customer, u.Meter, u.Period, u.Members-1, u.Members),
		fmt.Sprintf("%s/%s period %s: ledger's unit_seconds %s, expected %s (over by 1)", g.Customer, g.Meter, g.Period, g.UnitSeconds.Add(decimal.NewFromInt(1)), g.UnitSeconds)} {
		if !strings.Contains(out, want) {
			t.Errorf("verify output does not say %q:\n%s", want, out)
		}
	}
}

// --rate and --fault-rate are numbers, 0 or more: NaN passed every check
// (the comparisons are false) and Inf was taken for a rate.
func TestProduceRatesMustBeNumbers(t *testing.T) {
	for _, args := range [][]string{
		{"--rate", "NaN"}, {"--rate", "Inf"}, {"--rate", "-1"},
		{"--faults", "lost", "--fault-rate", "NaN"}, {"--faults", "lost", "--fault-rate", "-0.1"},
	} {
		var out, errOut bytes.Buffer
		ctx, cancel := context.WithTimeout(t.Context(), 3*time.Second)
		code := execute(ctx, append([]string{"produce", "--kafka-brokers", "127.0.0.1:1", "--duration", "1s"}, args...), &out, &errOut)
		cancel()
		if code != exitUsage || !strings.Contains(errOut.String(), args[len(args)-2]+" must be") {
			t.Errorf("produce %s: exit %d, want 2 naming %s; stderr:\n%s", strings.Join(args, " "), code, args[len(args)-2], errOut.String())
		}
	}
}

// produce reads --kafka-brokers as serve and reconcile do: an empty list or
// a bad port is a usage error naming the flag and its variable.
func TestProduceReadsBrokersAsServeDoes(t *testing.T) {
	for _, brokers := range []string{" , ", "kafka-1:port"} {
		var out, errOut bytes.Buffer
		ctx, cancel := context.WithTimeout(t.Context(), 3*time.Second)
		code := execute(ctx, []string{"produce", "--kafka-brokers", brokers, "--duration", "1s"}, &out, &errOut)
		cancel()
		if code != exitUsage || !strings.Contains(errOut.String(), "--kafka-brokers (TALLY_KAFKA_BROKERS) names") {
			t.Errorf("produce --kafka-brokers %q: exit %d, want 2 naming the flag; stderr:\n%s", brokers, code, errOut.String())
		}
	}
}
