package ingest_test

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/segmentio/kafka-go"
	"github.com/shopspring/decimal"
	"go.uber.org/goleak"

	"github.com/tally-ledger/tally/ingest"
	"github.com/tally-ledger/tally/ingest/wire"
	"github.com/tally-ledger/tally/internal/kafkatest"
	"github.com/tally-ledger/tally/internal/pgtest"
	"github.com/tally-ledger/tally/internal/testrun"
	"github.com/tally-ledger/tally/ledger"
)

func TestMain(m *testing.M) {
	if os.Getenv(childEnv) != "" {
		os.Exit(childMain())
	}
	goleak.VerifyTestMain(m)
}

const topic = "tally.meter-batches"

// env is one test's Kafka cluster and database.
type env struct {
	t      testing.TB
	kafka  *kafkatest.Cluster
	dbURL  string
	pool   *pgxpool.Pool
	parts  int
	offMon *ingest.OffsetWatch
}

func newEnv(t testing.TB, partitions int) *env {
	t.Helper()
	return newEnvWith(t, kafkatest.New(t, kafkatest.Options{Topics: []kafkatest.Topic{{Name: topic, Partitions: int32(partitions)}}}), partitions)
}

// newEnvWith is newEnv on a cluster the test manages itself.
func newEnvWith(t testing.TB, k *kafkatest.Cluster, partitions int) *env {
	t.Helper()
	dbURL := pgtest.NewURL(t)
	pool, err := pgxpool.New(context.Background(), dbURL)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pool.Close)
	e := &env{t: t, dbURL: dbURL, pool: pool, parts: partitions, kafka: k}
	e.offMon = ingest.WatchOffsets(pool, 10*time.Millisecond)
	t.Cleanup(e.offMon.Stop)
	return e
}

// testConfig is a Config with timings fit for tests.
func testConfig(brokers []string, pool *pgxpool.Pool, log *slog.Logger) ingest.Config {
	l, err := ledger.New(ledger.Config{Logger: log})
	if err != nil {
		panic(err)
	}
	return ingest.Config{
		Brokers: brokers, Topic: topic, Group: "tally-ingest",
		Pool: pool, Ledger: l, Logger: log, Registry: prometheus.NewRegistry(),
		MaxBatchRecords: 500, MaxBatchWait: 50 * time.Millisecond,
		RetryMin: 10 * time.Millisecond, RetryMax: 300 * time.Millisecond,
		TxTimeout: 10 * time.Second, PositionInterval: 200 * time.Millisecond,
		HeartbeatInterval: 100 * time.Millisecond, SessionTimeout: 1500 * time.Millisecond,
		FetchMaxWait: 500 * time.Millisecond,
	}
}

// member is a running consumer.
type member = testrun.Service

func (e *env) start(mod ...func(*ingest.Config)) *member {
	e.t.Helper()
	cfg := testConfig(e.kafka.Addrs, e.pool, testLogger(e.t))
	reg := prometheus.NewRegistry()
	cfg.Registry = reg
	for _, f := range mod {
		f(&cfg)
	}
	c, err := ingest.NewConsumer(cfg)
	if err != nil {
		e.t.Fatal(err)
	}
	return testrun.Start(e.t, reg, c.Run)
}

// testLogger logs WARN and above through t (ERROR lines are expected in
// some tests; they are not failures by themselves).
func testLogger(t testing.TB) *slog.Logger {
	return slog.New(slog.NewTextHandler(tWriter{t}, &slog.HandlerOptions{Level: slog.LevelWarn}))
}

type tWriter struct{ t testing.TB }

func (w tWriter) Write(b []byte) (int, error) {
	defer func() { _ = recover() }() // a late log line after the test ended
	w.t.Log(strings.TrimRight(string(b), "\n"))
	return len(b), nil
}

// --- a model of producers -------------------------------------------------

// streamModel produces the batches of one (producer, epoch, customer, meter)
// stream and knows its running total.
type streamModel struct {
	producer string
	epoch    int64
	customer string
	meter    string
	seq      int64
	total    decimal.Decimal
}

// next returns a batch of n new records. Quantities have up to 3 digits
// after the point, so any float arithmetic would show.
func (s *streamModel) next(rng *rand.Rand, n int) wire.Batch {
	b := wire.Batch{Schema: wire.Schema, BatchID: uuid.Must(uuid.NewV7()), Producer: s.producer, Epoch: s.epoch,
		SentAt: time.Now().UTC()}
	for range n {
		s.seq++
		q := decimal.New(rng.Int64N(100000), -3)
		s.total = s.total.Add(q)
		b.Records = append(b.Records, wire.Record{
			OperationID: uuid.Must(uuid.NewV7()), Customer: s.customer, Meter: s.meter, Seq: s.seq,
			Total: s.total, Quantity: decimal.NewNullDecimal(q), OccurredAt: time.Now().UTC().Add(-time.Minute).Truncate(time.Microsecond),
		})
	}
	return b
}

func encode(t testing.TB, b wire.Batch) kafka.Message {
	t.Helper()
	v, err := wire.Encode(b)
	if err != nil {
		t.Fatalf("encode: %v", err)
	}
	return kafka.Message{Key: []byte(b.Records[0].Customer), Value: v}
}

// models returns n customers' streams.
func models(n int) []*streamModel {
	var out []*streamModel
	for i := range n {
		out = append(out, &streamModel{producer: "gw-1", epoch: 1, customer: fmt.Sprintf("cust-%02d", i), meter: "api_calls"})
	}
	return out
}

// --- checks ----------------------------------------------------------------

// waitCaughtUp waits until every partition's stored next offset equals its
// high watermark.
func (e *env) waitCaughtUp(timeout time.Duration) {
	e.t.Helper()
	want := map[int]int64{}
	for p := range e.parts {
		want[p] = e.kafka.HighWatermark(e.t, topic, p)
	}
	deadline := time.Now().Add(timeout)
	for {
		got := map[int]int64{}
		rows, err := e.pool.Query(context.Background(), "SELECT partition, next_offset FROM ingest_partitions WHERE topic = $1", topic)
		if err == nil {
			for rows.Next() {
				var p int
				var n int64
				if err := rows.Scan(&p, &n); err == nil {
					got[p] = n
				}
			}
			rows.Close()
		}
		ok := true
		for p, w := range want {
			if got[p] != w {
				ok = false
			}
		}
		if ok {
			return
		}
		if time.Now().After(deadline) {
			e.t.Fatalf("not caught up after %v: stored %v, high watermarks %v", timeout, got, want)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// checkLedger asserts that every stream's billed sum equals its model's last
// total, exactly, and that no other usage exists.
func (e *env) checkLedger(streams []*streamModel) {
	e.t.Helper()
	ctx := context.Background()
	rows, err := e.pool.Query(ctx, `SELECT customer, meter, sum(billed)::text, count(*) FROM records GROUP BY customer, meter`)
	if err != nil {
		e.t.Fatal(err)
	}
	got := map[string]string{}
	counts := map[string]int64{}
	for rows.Next() {
		var c, m, sum string
		var n int64
		if err := rows.Scan(&c, &m, &sum, &n); err != nil {
			e.t.Fatal(err)
		}
		got[c+"/"+m] = sum
		counts[c+"/"+m] = n
	}
	rows.Close()
	for _, s := range streams {
		k := s.customer + "/" + s.meter
		g, err := decimal.NewFromString(got[k])
		if s.seq == 0 {
			if got[k] != "" {
				e.t.Errorf("%s: billed %s, want nothing", k, got[k])
			}
			continue
		}
		if err != nil || !g.Equal(s.total) {
			e.t.Errorf("%s: billed %q, want exactly %s", k, got[k], s.total)
		}
		if counts[k] != s.seq {
			e.t.Errorf("%s: %d records, want %d", k, counts[k], s.seq)
		}
		delete(got, k)
	}
	for k, v := range got {
		e.t.Errorf("unexpected usage %s = %s", k, v)
	}
}

// checkCounters asserts conservation per partition and returns the totals.
func (e *env) checkCounters() ingest.Counters {
	e.t.Helper()
	st, err := ingest.Status(context.Background(), e.pool, topic)
	if err != nil {
		e.t.Fatal(err)
	}
	var total ingest.Counters
	for _, s := range st {
		if !s.Counters.Balanced() {
			e.t.Errorf("partition %d: counters not balanced: %+v", s.Partition, s.Counters)
		}
		c := s.Counters
		total.MessagesIn += c.MessagesIn
		total.MessagesRejected += c.MessagesRejected
		total.RecordsIn += c.RecordsIn
		total.Applied += c.Applied
		total.Duplicate += c.Duplicate
		total.Conflict += c.Conflict
		total.LateFill += c.LateFill
		total.Rejected += c.Rejected
	}
	return total
}

// check asserts that no stored offset went backwards.
func (e *env) checkOffsets() {
	e.t.Helper()
	e.offMon.Sample()
	if r := e.offMon.Regressions(); len(r) > 0 {
		e.t.Errorf("stored offsets regressed: %v", r)
	}
}

var errTimeout = errors.New("timeout")

// eventually polls f until it returns nil or d passes.
func eventually(d time.Duration, f func() error) error {
	deadline := time.Now().Add(d)
	for {
		err := f()
		if err == nil {
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("%w: %v", errTimeout, err)
		}
		time.Sleep(50 * time.Millisecond)
	}
}
