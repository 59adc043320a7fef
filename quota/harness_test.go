package quota_test

import (
	"context"
	"encoding/json"
	"fmt"
	"log/slog"
	"os"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/segmentio/kafka-go"
	"github.com/shopspring/decimal"
	"go.uber.org/goleak"

	"github.com/tally-ledger/tally/internal/kafkatest"
	"github.com/tally-ledger/tally/internal/ledgertest"
	"github.com/tally-ledger/tally/internal/pgtest"
	"github.com/tally-ledger/tally/internal/testrun"
	"github.com/tally-ledger/tally/ledger"
	"github.com/tally-ledger/tally/periods"
	"github.com/tally-ledger/tally/quota"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

const (
	ingestTopic    = "tally.meter-batches"
	decisionsTopic = quota.DefaultTopic
)

// env is one test's database, Kafka cluster and clock.
type env struct {
	t     *testing.T
	pool  *pgxpool.Pool
	kafka *kafkatest.Cluster
	// shift moves Tally's clock (the ledger's, the rules', the
	// enforcer's) back from the machine's to the last 12:00 UTC, so that
	// no day or month ends while a test runs, whatever the hour it runs
	// at. Tests read decisions and status at e.now or e.clock, never at
	// time.Now. Back, not forward: a rule written at Tally's now is in
	// force at the machine's.
	shift time.Duration
	skew  atomic.Int64 // added to Tally's clock by the enforcer's clock

	streams *ledgertest.Streams // customer/meter → its one stream
}

func newEnv(t *testing.T) *env {
	t.Helper()
	e := &env{t: t, pool: pgtest.New(t), shift: ledgertest.ToNoon(time.Now())}
	e.kafka = kafkatest.New(t, kafkatest.Options{Topics: []kafkatest.Topic{
		{Name: decisionsTopic, Partitions: 1}, {Name: ingestTopic, Partitions: 2},
	}})
	l, err := ledger.New(ledger.Config{Clock: e.clock})
	if err != nil {
		t.Fatal(err)
	}
	e.streams = ledgertest.New(e.pool, l)
	return e
}

// dailyCustomer stores customer with a calendar of UTC days.
func (e *env) dailyCustomer(customer string) {
	e.t.Helper()
	sch, err := json.Marshal(periods.NewSchedule(periods.Calendar{Cadence: periods.Daily, AnchorTime: "00:00", Zone: "UTC"}))
	if err != nil {
		e.t.Fatal(err)
	}
	if _, err := e.pool.Exec(context.Background(), `INSERT INTO customers (id, schedule) VALUES ($1, $2)`, customer, sch); err != nil {
		e.t.Fatal(err)
	}
}

// clock is Tally's clock: the ledger's and the rules'.
func (e *env) clock() time.Time { return time.Now().Add(e.shift) }

// now is the enforcer's clock: Tally's, skewed.
func (e *env) now() time.Time { return e.clock().Add(time.Duration(e.skew.Load())) }

// advance moves the enforcer's clock forward by d.
func (e *env) advance(d time.Duration) { e.skew.Add(int64(d)) }

// use applies qty of usage for customer/meter to the ledger (one record of
// a stream of its own), as ingest would, in one transaction, a second ago.
func (e *env) use(customer, meter string, qty int64) {
	e.t.Helper()
	e.streams.Use(e.t, customer, meter, e.clock().Add(-time.Second), decimal.NewFromInt(qty))
}

// position sets the ingest position of every partition of the meter topic:
// usage complete through at.
func (e *env) position(at time.Time) {
	e.t.Helper()
	ledgertest.Position(e.t, e.pool, ingestTopic, 2, at)
}

// follow keeps the ingest position at the enforcer's now (a caught-up
// ingest) until the returned function is called.
func (e *env) follow() (stop func()) { return ledgertest.Follow(e.t, e.pool, ingestTopic, 2, e.now) }

func (e *env) put(in quota.RuleInput) quota.Rule {
	e.t.Helper()
	if in.Actor == "" {
		in.Actor = "test"
	}
	r, err := quota.PutRuleDBClock(context.Background(), e.pool, in, e.clock)
	if err != nil {
		e.t.Fatalf("PutRule: %v", err)
	}
	return r
}

// enforcer is a running Enforcer.
type enforcer = testrun.Service

func (e *env) config(holder string) quota.Config {
	return quota.Config{
		Pool: e.pool, Brokers: e.kafka.Addrs, IngestTopic: ingestTopic,
		Interval: 50 * time.Millisecond, Republish: 2 * time.Second, LeaseTTL: time.Second,
		Holder: holder, Clock: e.now, Logger: testLogger(e.t),
	}
}

func (e *env) start(cfg quota.Config) *enforcer {
	e.t.Helper()
	reg := prometheus.NewRegistry()
	cfg.Registerer = reg
	enf, err := quota.NewEnforcer(cfg)
	if err != nil {
		e.t.Fatal(err)
	}
	return testrun.Start(e.t, reg, enf.Run)
}

// reader reads the decisions topic from the start, as a gateway would.
type reader struct {
	t *testing.T
	r *kafka.Reader
}

func (e *env) reader() *reader {
	r := kafka.NewReader(kafka.ReaderConfig{
		Brokers: e.kafka.Addrs, Topic: decisionsTopic, Partition: 0,
		MinBytes: 1, MaxBytes: 1 << 20, MaxWait: 50 * time.Millisecond,
	})
	e.t.Cleanup(func() { r.Close() })
	return &reader{t: e.t, r: r}
}

// received is one decision read from Kafka with its raw fields.
type received struct {
	quota.Decision
	key    string
	fields map[string]json.RawMessage
	at     time.Time
}

func (r *reader) next(timeout time.Duration) (received, bool) {
	r.t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	m, err := r.r.ReadMessage(ctx)
	if err != nil {
		if ctx.Err() != nil {
			return received{}, false
		}
		r.t.Fatalf("read decision: %v", err)
	}
	var d received
	d.key, d.at = string(m.Key), time.Now()
	if err := json.Unmarshal(m.Value, &d.Decision); err != nil {
		r.t.Fatalf("decode decision %s: %v", m.Value, err)
	}
	if err := json.Unmarshal(m.Value, &d.fields); err != nil {
		r.t.Fatal(err)
	}
	return d, true
}

// until reads decisions until one satisfies ok, failing after timeout.
func (r *reader) until(timeout time.Duration, what string, ok func(received) bool) received {
	r.t.Helper()
	deadline := time.Now().Add(timeout)
	var seen []string
	for time.Now().Before(deadline) {
		d, got := r.next(time.Until(deadline))
		if !got {
			break
		}
		if ok(d) {
			return d
		}
		seen = append(seen, fmt.Sprintf("%s v%d %s used=%s", d.key, d.RuleVersion, d.State, d.Used))
	}
	r.t.Fatalf("no decision %s within %v; saw %v", what, timeout, seen)
	return received{}
}

func testLogger(t testing.TB) *slog.Logger {
	if os.Getenv("QUOTA_TEST_LOG") != "" {
		return slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelDebug}))
	}
	return slog.New(slog.DiscardHandler)
}

func dec(s string) decimal.Decimal { return decimal.RequireFromString(s) }

// exceededToday gives customer daily a calendar of UTC days, 60 api_calls
// used of a limit of 50, and a leader (a) deciding; it returns the
// decisions' reader, the leader and its first decision: exceeded today.
func (e *env) exceededToday() (*reader, *enforcer, received) {
	e.t.Helper()
	e.dailyCustomer("daily")
	e.follow()
	e.put(quota.RuleInput{Customer: "daily", Meter: "api_calls", Limit: dec("50")})
	e.use("daily", "api_calls", 60)
	rd := e.reader()
	a := e.start(e.config("a"))
	return rd, a, rd.until(10*time.Second, "exceeded today", func(d received) bool { return d.State == quota.Exceeded })
}
