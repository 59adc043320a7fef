package enforcebench_test

import (
	"context"
	"os"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/shopspring/decimal"

	"github.com/tally-ledger/tally/cmd/tally/internal/bench/enforcebench"
	"github.com/tally-ledger/tally/ingest"
	"github.com/tally-ledger/tally/internal/kafkatest"
	"github.com/tally-ledger/tally/internal/pgtest"
	"github.com/tally-ledger/tally/quota"
)

// The topics of the pipeline: ingest's default and the enforcer's.
const (
	ingestTopic    = "tally.meter-batches"
	decisionsTopic = quota.DefaultTopic
)

func runPipeline(tb testing.TB, o enforcebench.Options) enforcebench.Result {
	tb.Helper()
	k := kafkatest.New(tb, kafkatest.Options{Topics: []kafkatest.Topic{
		{Name: decisionsTopic, Partitions: 1}, {Name: ingestTopic, Partitions: 4},
	}})
	o.Pool, o.Brokers = pgtest.New(tb), k.Addrs
	r, err := enforcebench.Run(context.Background(), o)
	if err != nil {
		tb.Fatal(err)
	}
	var sb strings.Builder
	r.Report(&sb)
	for _, line := range strings.Split(strings.TrimSpace(sb.String()), "\n") {
		tb.Log(line)
	}
	if len(r.Missing) > 0 {
		tb.Errorf("no decision for %d crossings", len(r.Missing))
	}
	return r
}

// TestEndToEndThroughIngest runs the whole pipeline at a small rate: usage
// through Kafka and the real ingest consumer reaches warn and limit, and a
// kafka-go reader sees the decisions within the lag the decisions state.
func TestEndToEndThroughIngest(t *testing.T) {
	t.Parallel()
	r := runPipeline(t, enforcebench.Options{Customers: 5, Rate: 1000, Duration: 7 * time.Second,
		Interval: 100 * time.Millisecond, Ingest: fastIngest})
	if len(r.Crossings) != 10 {
		t.Fatalf("%d crossings seen, want 10 (warn and limit of 5 customers)", len(r.Crossings))
	}
	for _, c := range r.Crossings {
		if c.Used.LessThan(decimal.NewFromInt(c.Threshold)) {
			t.Errorf("%s %s decided with used %s below threshold %d", c.Customer, c.State, c.Used, c.Threshold)
		}
		if c.Projected.LessThan(c.Used) {
			t.Errorf("projected %s below used %s", c.Projected, c.Used)
		}
		// A decision made within a millisecond of its as_of states lag 0
		// (lag is never negative); only a negative or huge lag is wrong.
		if c.Lag < 0 || c.Lag > 5*time.Second {
			t.Errorf("%s %s: lag %v", c.Customer, c.State, c.Lag)
		}
	}
	if _, p99 := r.Latency(); p99 > 5*time.Second {
		t.Errorf("p99 produce → decision %v", p99)
	}
}

// TestAlertsThroughIngest: with Alerts, every crossing of 80% and 100%
// reaches the in-process webhook, after the ingest transaction that
// committed it.
func TestAlertsThroughIngest(t *testing.T) {
	t.Parallel()
	r := runPipeline(t, enforcebench.Options{Customers: 5, Rate: 1000, Duration: 7 * time.Second,
		Interval: 100 * time.Millisecond, Ingest: fastIngest, Alerts: true})
	_, p99, n, missing := r.AlertLatency()
	if n != 10 || missing != 0 {
		t.Fatalf("%d crossings with a webhook, %d without; want 10 and 0", n, missing)
	}
	for _, c := range r.Crossings {
		if c.Webhook.Before(c.Ingested) {
			t.Errorf("%s %s: webhook %v before the ingest transaction %v", c.Customer, c.State, c.Webhook, c.Ingested)
		}
	}
	if p99 > 5*time.Second {
		t.Errorf("p99 ingest → webhook %v", p99)
	}
}

func fastIngest(c *ingest.Config) {
	c.MaxBatchWait = 50 * time.Millisecond
	c.FetchMaxWait = 100 * time.Millisecond
	c.PositionInterval = 200 * time.Millisecond
	c.HeartbeatInterval = 100 * time.Millisecond
	c.SessionTimeout = 1500 * time.Millisecond
}

// BenchmarkEnforceEndToEnd: docs/design.md §10 enforcement lag at 20k records/s.
//
//	go test -run '^$' -bench EnforceEndToEnd -benchtime 1x ./cmd/tally/internal/bench/enforcebench/
//
// QUOTA_BENCH_SECONDS (default 20), QUOTA_BENCH_RATE (20000) and
// QUOTA_BENCH_INTERVAL (the enforcer's, default 1s) tune it. Ingest and the
// enforcer otherwise run with their production defaults.
func BenchmarkEnforceEndToEnd(b *testing.B) {
	o := enforcebench.Options{Customers: 100, Rate: envInt("QUOTA_BENCH_RATE", 20000),
		Duration: time.Duration(envInt("QUOTA_BENCH_SECONDS", 20)) * time.Second, Interval: quota.DefaultInterval}
	if v := os.Getenv("QUOTA_BENCH_INTERVAL"); v != "" {
		d, err := time.ParseDuration(v)
		if err != nil {
			b.Fatal(err)
		}
		o.Interval = d
	}
	for b.Loop() {
		r := runPipeline(b, o)
		p50, p99 := r.Latency()
		b.ReportMetric(float64(p50.Milliseconds()), "p50-ms")
		b.ReportMetric(float64(p99.Milliseconds()), "p99-ms")
		b.ReportMetric(float64(r.Records)/r.Elapsed.Seconds(), "records/s")
	}
}

func envInt(name string, def int) int {
	if v := os.Getenv(name); v != "" {
		if n, err := strconv.Atoi(v); err == nil {
			return n
		}
	}
	return def
}
