package scenario_test

import (
	"context"
	"log/slog"
	"math"
	"os"
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
	"github.com/tally-ledger/tally/reconcile"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

const topic = "tally.meter-batches"

// TestEveryFaultVerifiesClean runs a scenario with every fault against an
// in-process Kafka, ingests it into a real ledger and checks that the
// ledger matches the ground truth exactly; then that Verify names a
// difference when there is one.
func TestEveryFaultVerifiesClean(t *testing.T) {
	c := kafkatest.New(t, kafkatest.Options{Topics: []kafkatest.Topic{{Name: topic, Partitions: 4}}})
	pool := pgtest.New(t)
	runIngest(t, c.Addrs, pool)

	f := scenario.AllFaults()
	// Every fault happens at its first chance; these rates give several of
	// each even in a CPU-starved run of a few dozen writes.
	f.Lost, f.Reorder, f.Duplicates, f.Retransmits = 0.15, 0.15, 0.15, 0.5
	f.Crashes = 4
	ctx := context.Background()
	e, err := scenario.Run(ctx, scenario.Config{
		Brokers: c.Addrs, Topic: topic, Producers: 3, Customers: 4, Meters: 2, Workers: 2,
		// A record count, not a duration: a CPU-starved machine takes longer
		// but still writes enough for every fault to happen. A starved
		// producer packs more records per message: with 1,200 records one
		// CI run wrote 77 messages and no loss became a gap (each was the
		// last of its streams before a crash or the end), so twice that.
		Records: 2400, Rate: 1200, Spread: 45 * 24 * time.Hour, Faults: f, Linger: 10 * time.Millisecond,
	})
	if err != nil {
		t.Fatal(err)
	}
	s := e.Stats
	t.Logf("stats %+v", s)
	if s.Records < 500 || s.Duplicates == 0 || s.Retransmits == 0 || s.Lost == 0 || s.Reordered == 0 || s.Crashes != 4 || s.Epochs != 5 {
		t.Errorf("not every fault happened: %+v", s)
	}
	gaps := 0
	for _, st := range e.Streams {
		gaps += len(st.Gaps)
	}
	periods := map[string]bool{}
	for _, tot := range e.Totals {
		periods[tot.Period] = true
	}
	if gaps == 0 || len(periods) < 2 {
		t.Errorf("expected gaps and several periods; got %d gaps, periods %v", gaps, periods)
	}

	diffs := waitVerify(t, pool, e, 60*time.Second)
	if len(diffs) > 0 {
		t.Fatalf("ledger differs from the ground truth:\n%s", strings.Join(diffs, "\n"))
	}

	// A verify that cannot fail proves nothing: change the truth.
	e.Totals[0].Quantity = e.Totals[0].Quantity.Add(decimal.RequireFromString("0.001"))
	e.Streams[0].LastSeq++
	e.DeadLetters[e.Run+"-bad"]++
	diffs, err = scenario.Verify(ctx, pool, e)
	if err != nil {
		t.Fatal(err)
	}
	if len(diffs) != 3 || !strings.Contains(strings.Join(diffs, "\n"), "short by 0.001") {
		t.Errorf("verify against a wrong truth: %d differences, want 3:\n%s", len(diffs), strings.Join(diffs, "\n"))
	}
}

// TestGaugesAndUniquesVerifyClean runs a scenario of counters, gauges
// and unique meters with every fault, and checks that the ledger's
// gauge aggregates (max, latest, unit_seconds) and distinct members per
// period equal the ground truth, lost readings included; then that a
// ledger whose aggregates were altered is reported.
func TestGaugesAndUniquesVerifyClean(t *testing.T) {
	c := kafkatest.New(t, kafkatest.Options{Topics: []kafkatest.Topic{{Name: topic, Partitions: 4}}})
	pool := pgtest.New(t)
	runIngest(t, c.Addrs, pool)

	f := scenario.AllFaults()
	f.Lost, f.Reorder, f.Duplicates, f.Retransmits = 0.15, 0.15, 0.15, 0.3
	f.Crashes = 4
	cfg := scenario.Config{
		Brokers: c.Addrs, Topic: topic, Producers: 2, Customers: 2, Meters: 1, Gauges: 2, Uniques: 1, Workers: 2,
		Records: 1000, Rate: 600, Spread: 45 * 24 * time.Hour, Faults: f, Linger: 10 * time.Millisecond,
	}
	ctx := context.Background()
	if err := scenario.DeclareMeters(ctx, pool, cfg); err != nil {
		t.Fatal(err)
	}
	e, err := scenario.Run(ctx, cfg)
	if err != nil {
		t.Fatal(err)
	}
	s := e.Stats
	t.Logf("stats %+v", s)
	// Three of the four meters are gauges or unique meters, so a lost
	// batch holds readings of them.
	if s.Duplicates == 0 || s.Retransmits == 0 || s.Reordered == 0 || s.LostReadings == 0 || s.Crashes != 4 || s.Epochs != 4 {
		t.Errorf("not every fault happened: %+v", s)
	}
	periods := map[string]bool{}
	for _, g := range e.Gauges {
		periods[g.Period] = true
	}
	if len(periods) < 2 || len(e.Uniques) == 0 {
		t.Errorf("expected gauges over several periods and unique counts; got gauge periods %v, %d unique totals", periods, len(e.Uniques))
	}
	if diffs := waitVerify(t, pool, e, 60*time.Second); len(diffs) > 0 {
		t.Fatalf("ledger differs from the ground truth:\n%s", strings.Join(diffs, "\n"))
	}

	// A verify that cannot fail proves nothing: alter the ledger's gauge
	// level-seconds in one bucket and drop a member from one count.
	c1 := e.Run + "-c1"
	if _, err := pool.Exec(ctx, `UPDATE gauge_days SET unit_seconds = unit_seconds + 1
		WHERE ctid = (SELECT ctid FROM gauge_days WHERE customer = $1 AND meter = 'g1' AND unit_seconds > 0 LIMIT 1)`, c1); err != nil {
		t.Fatal(err)
	}
	if _, err := pool.Exec(ctx, `UPDATE unique_counts SET members = members - 1
		WHERE ctid = (SELECT ctid FROM unique_counts WHERE customer = $1 AND meter = 'u1' AND NOT per_day LIMIT 1)`, c1); err != nil {
		t.Fatal(err)
	}
	diffs, err := scenario.Verify(ctx, pool, e)
	if err != nil {
		t.Fatal(err)
	}
	all := strings.Join(diffs, "\n")
	if len(diffs) != 2 || !strings.Contains(all, c1+"/g1 period ") || !strings.Contains(all, "ledger's unit_seconds") ||
		!strings.Contains(all, "over by 1") || !strings.Contains(all, "distinct members") || !strings.Contains(all, "short by 1") {
		t.Errorf("verify against an altered ledger: %d differences, want 2 (g1 unit_seconds over by 1, u1 short by 1):\n%s", len(diffs), all)
	}
}

func waitVerify(t *testing.T, pool *pgxpool.Pool, e *scenario.Expect, within time.Duration) []string {
	t.Helper()
	deadline := time.Now().Add(within)
	for {
		diffs, err := scenario.Verify(context.Background(), pool, e)
		if err != nil {
			t.Fatal(err)
		}
		if len(diffs) == 0 || time.Now().After(deadline) {
			return diffs
		}
		time.Sleep(200 * time.Millisecond)
	}
}

func runIngest(t *testing.T, brokers []string, pool *pgxpool.Pool) {
	t.Helper()
	log := slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelError}))
	l, err := ledger.New(ledger.Config{Logger: log})
	if err != nil {
		t.Fatal(err)
	}
	cons, err := ingest.NewConsumer(ingest.Config{
		Brokers: brokers, Topic: topic, Pool: pool, Ledger: l, Logger: log,
		Registry: prometheus.NewRegistry(), MaxBatchWait: 50 * time.Millisecond,
		RetryMin: 10 * time.Millisecond, RetryMax: 300 * time.Millisecond, PositionInterval: 200 * time.Millisecond,
		HeartbeatInterval: 100 * time.Millisecond, SessionTimeout: 1500 * time.Millisecond,
		FetchMaxWait: 500 * time.Millisecond,
	})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- cons.Run(ctx) }()
	t.Cleanup(func() {
		cancel()
		select {
		case err := <-done:
			if err != nil {
				t.Errorf("ingest: %v", err)
			}
		case <-time.After(30 * time.Second):
			t.Errorf("ingest did not stop within 30s")
		}
	})
}

// TestReconcileFaultyButCorrect: a scenario of counters, a gauge and a
// unique meter with duplicates, lost middle batches, reordering,
// retransmits and producer crashes (new epochs), but no bad input,
// reconciles clean in every period it touched (the gauges' aggregates
// recomputed from their readings, members recounted); the only
// findings are notices: the gaps the lost batches left (exactly those the
// ground truth expects) and the streams the crashes abandoned.
func TestReconcileFaultyButCorrect(t *testing.T) {
	// A run starved of CPU writes as few as ~20 messages; the scenario
	// loses the first batch it can, but a crash or a resend can still undo
	// every loss of so short a run. The check needs a gap to look for, so
	// a run whose ground truth has none is run again, on a fresh broker
	// and database (at most three runs).
	f := scenario.Faults{Duplicates: 0.1, Retransmits: 0.1, Lost: 0.1, Reorder: 0.1, Crashes: 2}
	ctx := context.Background()
	var (
		e        *scenario.Expect
		pool     *pgxpool.Pool
		wantGaps int
	)
	for attempt := 1; wantGaps == 0; attempt++ {
		if attempt > 3 {
			t.Fatalf("three runs of the scenario lost no batch for good (last: %+v)", e.Stats)
		}
		c := kafkatest.New(t, kafkatest.Options{Topics: []kafkatest.Topic{{Name: topic, Partitions: 4}}})
		pool = pgtest.New(t)
		runIngest(t, c.Addrs, pool)
		cfg := scenario.Config{
			Brokers: c.Addrs, Topic: topic, Producers: 2, Customers: 3, Meters: 2, Gauges: 1, Uniques: 1, Workers: 2,
			Duration: 2 * time.Second, Rate: 500, Spread: 40 * 24 * time.Hour, Faults: f, Linger: 10 * time.Millisecond,
		}
		if err := scenario.DeclareMeters(ctx, pool, cfg); err != nil {
			t.Fatal(err)
		}
		var err error
		e, err = scenario.Run(ctx, cfg)
		if err != nil {
			t.Fatal(err)
		}
		t.Logf("run %d: stats %+v", attempt, e.Stats)
		if diffs := waitVerify(t, pool, e, 60*time.Second); len(diffs) > 0 {
			t.Fatalf("ledger differs from the ground truth:\n%s", strings.Join(diffs, "\n"))
		}
		for _, st := range e.Streams {
			wantGaps += len(st.Gaps)
		}
	}
	rc, err := reconcile.New(reconcile.Config{Pool: pool})
	if err != nil {
		t.Fatal(err)
	}
	periods := map[string]bool{}
	for _, tot := range e.Totals {
		periods[tot.Period] = true
	}
	gaps := 0
	for p := range periods {
		run, err := rc.Run(ctx, reconcile.Options{Period: p})
		if err != nil {
			t.Fatalf("reconcile %s: %v", p, err)
		}
		if run.Status != reconcile.StatusClean {
			t.Errorf("period %s: %s", p, run.Status)
		}
		for _, fd := range run.Findings {
			switch fd.Kind {
			case reconcile.KindOpenGap:
				gaps++
			case reconcile.KindAbandoned:
			default:
				t.Errorf("period %s: unexpected finding %s (%s): %s", p, fd.Kind, fd.Severity, fd.Detail)
			}
		}
	}
	if gaps != wantGaps {
		t.Errorf("%d open-gap findings across %d periods; the ground truth has %d gaps", gaps, len(periods), wantGaps)
	}
}

// Validate refuses a NaN probability or rate and an infinite rate: every
// comparison with NaN is false, so a range check let it through.
func TestValidateRefusesNaN(t *testing.T) {
	nan := math.NaN()
	for name, cfg := range map[string]scenario.Config{
		"lost NaN":  {Faults: scenario.Faults{Lost: nan}},
		"rate NaN":  {Rate: nan},
		"rate +Inf": {Rate: math.Inf(1)},
	} {
		cfg.Brokers = []string{"127.0.0.1:9092"}
		if err := cfg.Validate(); err == nil {
			t.Errorf("%s: valid", name)
		}
	}
}
