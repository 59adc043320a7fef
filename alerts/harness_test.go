package alerts_test

import (
	"context"
	"encoding/json"
	"io"
	"log/slog"
	"net"
	"net/http"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/segmentio/kafka-go"
	"github.com/shopspring/decimal"
	"go.uber.org/goleak"

	"github.com/tally-ledger/tally/alerts"
	"github.com/tally-ledger/tally/internal/kafkatest"
	"github.com/tally-ledger/tally/internal/ledgertest"
	"github.com/tally-ledger/tally/internal/pgtest"
	"github.com/tally-ledger/tally/internal/testrun"
	"github.com/tally-ledger/tally/ledger"
	"github.com/tally-ledger/tally/periods"
	"github.com/tally-ledger/tally/quota"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

const ingestTopic = quota.DefaultIngestTopic

// env is one test's database, Kafka, ledger and clock.
type env struct {
	t       *testing.T
	pool    *pgxpool.Pool
	kafka   *kafkatest.Cluster
	led     *ledger.Ledger
	streams *ledgertest.Streams
	// shift moves Tally's clock (the ledger's, the ingest position's, the
	// enforcer's, the evaluator's, the rules') back from the machine's to
	// the last 12:00 UTC, so that no day or month ends while a test runs,
	// whatever the hour it runs at. Deliveries keep Postgres's clock
	// (they are due when written, whatever the evaluator's), webhooks the
	// machine's, as the dispatcher does.
	shift time.Duration
	skew  atomic.Int64 // the evaluator's clock from Tally's
}

func newEnv(t *testing.T) *env {
	t.Helper()
	e := &env{t: t, pool: pgtest.New(t), shift: ledgertest.ToNoon(time.Now())}
	e.kafka = kafkatest.New(t, kafkatest.Options{Topics: []kafkatest.Topic{
		{Name: quota.DefaultTopic, Partitions: 1}, {Name: ingestTopic, Partitions: 1}, {Name: alerts.DefaultTopic, Partitions: 1},
	}})
	var err error
	if e.led, err = ledger.New(ledger.Config{Clock: e.clock}); err != nil {
		t.Fatal(err)
	}
	e.streams = ledgertest.New(e.pool, e.led)
	ledgertest.Follow(t, e.pool, ingestTopic, 1, e.clock)
	return e
}

// dbNow is Postgres's clock (now()).
func (e *env) dbNow() time.Time {
	e.t.Helper()
	var now time.Time
	if err := e.pool.QueryRow(context.Background(), `SELECT now()`).Scan(&now); err != nil {
		e.t.Fatal(err)
	}
	return now
}

// clock is Tally's clock: the ledger's, the enforcer's and the ingest
// position's.
func (e *env) clock() time.Time { return time.Now().Add(e.shift) }

// now is the evaluator's clock: Tally's, skewed.
func (e *env) now() time.Time { return e.clock().Add(time.Duration(e.skew.Load())) }

// periods is a periods.Store on Tally's clock.
func (e *env) periods() periods.Store { return periods.Store{Clock: e.clock} }

// use books qty of customer's meter now.
func (e *env) use(customer, meter string, qty int64) {
	e.t.Helper()
	e.streams.Use(e.t, customer, meter, e.clock().Add(-time.Second), decimal.NewFromInt(qty))
}

// adjust books a signed adjustment (a credit when negative).
func (e *env) adjust(customer, meter string, qty int64, at time.Time) ledger.AdjustmentResult {
	e.t.Helper()
	var res ledger.AdjustmentResult
	err := pgx.BeginFunc(context.Background(), e.pool, func(tx pgx.Tx) error {
		var err error
		res, err = e.led.Adjust(context.Background(), tx, ledger.Adjustment{OperationID: uuid.New(), Customer: customer,
			Meter: meter, Quantity: decimal.NewFromInt(qty), OccurredAt: at, Reason: "test", Actor: "test"})
		return err
	})
	if err != nil {
		e.t.Fatalf("adjust: %v", err)
	}
	return res
}

// quota sets customer's rule for meter to limit.
func (e *env) quota(customer, meter string, limit int64) {
	e.t.Helper()
	_, err := quota.PutRuleDBClock(context.Background(), e.pool, quota.RuleInput{Customer: customer, Meter: meter,
		Limit: decimal.NewFromInt(limit), Actor: "test"}, e.clock)
	if err != nil {
		e.t.Fatal(err)
	}
}

func (e *env) rule(name string, body string) alerts.Rule {
	e.t.Helper()
	var in alerts.RuleInput
	if err := json.Unmarshal([]byte(body), &in); err != nil {
		e.t.Fatal(err)
	}
	in.Name, in.Actor = name, "test"
	r, _, err := alerts.PutRule(context.Background(), e.pool, in, e.clock())
	if err != nil {
		e.t.Fatalf("put rule: %v", err)
	}
	return r
}

func (e *env) webhook(name, url string) string {
	e.t.Helper()
	_, secret, _, err := alerts.PutWebhook(context.Background(), e.pool, alerts.WebhookInput{Name: name, URL: url, AllowPrivate: true}, time.Now())
	if err != nil {
		e.t.Fatal(err)
	}
	return secret
}

// tally is one Tally process's enforcer, evaluator and dispatcher.
type tally struct {
	reg  *prometheus.Registry
	enf  *quota.Enforcer
	eval *alerts.Evaluator
	disp *alerts.Dispatcher
	stop func()
}

type startOptions struct {
	noDispatcher bool
	leaseTTL     time.Duration
	holder       string
	retryFor     time.Duration
}

func (e *env) start(o startOptions) *tally {
	e.t.Helper()
	if o.leaseTTL == 0 {
		o.leaseTTL = 3 * time.Second
	}
	logs := testrun.Logs(e.t)
	log := slog.New(slog.NewTextHandler(logs, nil))
	enf, err := quota.NewEnforcer(quota.Config{Pool: e.pool, Brokers: e.kafka.Addrs, Interval: 200 * time.Millisecond,
		LeaseTTL: o.leaseTTL, Holder: o.holder, Logger: log, Clock: e.clock})
	if err != nil {
		e.t.Fatal(err)
	}
	tl := &tally{enf: enf, reg: prometheus.NewRegistry()}
	if !o.noDispatcher {
		tl.disp, err = alerts.NewDispatcher(alerts.DispatcherConfig{Pool: e.pool, Brokers: e.kafka.Addrs, Registerer: tl.reg,
			Timeout: 500 * time.Millisecond, Claim: 2 * time.Second, Poll: 100 * time.Millisecond,
			BackoffBase: 50 * time.Millisecond, BackoffMax: 400 * time.Millisecond, AllowPrivate: true, Logger: log})
		if err != nil {
			e.t.Fatal(err)
		}
	}
	cfg := alerts.EvaluatorConfig{Pool: e.pool, Leader: enf, Kafka: true, Clock: e.now, Logger: log, Interval: 200 * time.Millisecond, Registerer: tl.reg,
		RetryFor: o.retryFor}
	if tl.disp != nil {
		cfg.Committed = tl.disp.Wake
	}
	if tl.eval, err = alerts.NewEvaluator(cfg); err != nil {
		e.t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	run := func(f func(context.Context) error) {
		wg.Add(1)
		go func() {
			defer wg.Done()
			if err := f(ctx); err != nil {
				e.t.Errorf("run: %v", err)
			}
		}()
	}
	run(enf.Run)
	run(tl.eval.Run)
	if tl.disp != nil {
		run(tl.disp.Run)
	}
	var once sync.Once
	tl.stop = func() { once.Do(func() { cancel(); wg.Wait() }) }
	e.t.Cleanup(tl.stop)
	return tl
}

// dispatch runs a dispatcher of cfg, its pool, brokers, logger and
// registry filled in, until stop returns (also at the test's end).
func (e *env) dispatch(cfg alerts.DispatcherConfig) (stop func()) {
	e.t.Helper()
	cfg.Pool, cfg.Brokers, cfg.AllowPrivate = e.pool, e.kafka.Addrs, true
	cfg.Logger, cfg.Registerer = slog.New(slog.NewTextHandler(testrun.Logs(e.t), nil)), prometheus.NewRegistry()
	d, err := alerts.NewDispatcher(cfg)
	if err != nil {
		e.t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() {
		defer close(done)
		if err := d.Run(ctx); err != nil {
			e.t.Errorf("dispatcher: %v", err)
		}
	}()
	var once sync.Once
	stop = func() { once.Do(func() { cancel(); <-done }) }
	e.t.Cleanup(stop)
	return stop
}

// received is one request the receiver got.
type received struct {
	id, sig string
	body    []byte
	at      time.Time
	status  int
}

// receiver is a real HTTP server on a fixed address that can be down,
// answer 500, or hang past the dispatcher's timeout.
type receiver struct {
	t    *testing.T
	addr string
	mode atomic.Value // "ok", "500", "hang"
	mu   sync.Mutex
	reqs []received
	srv  *http.Server
	done chan struct{}
}

func newReceiver(t *testing.T) *receiver {
	r := &receiver{t: t}
	r.mode.Store("ok")
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	r.addr = ln.Addr().String()
	r.serve(ln)
	t.Cleanup(r.down)
	return r
}

func (r *receiver) url() string { return "http://" + r.addr + "/hook" }

func (r *receiver) serve(ln net.Listener) {
	r.srv = &http.Server{Handler: http.HandlerFunc(r.handle), ReadHeaderTimeout: 5 * time.Second}
	r.done = make(chan struct{})
	go func() {
		defer close(r.done)
		_ = r.srv.Serve(ln)
	}()
}

func (r *receiver) handle(w http.ResponseWriter, req *http.Request) {
	body, _ := io.ReadAll(req.Body)
	mode := r.mode.Load().(string)
	status := http.StatusNoContent
	switch mode {
	case "500":
		status = http.StatusInternalServerError
	case "hang":
		select {
		case <-req.Context().Done():
		case <-time.After(3 * time.Second):
		}
		status = 0
	}
	r.mu.Lock()
	r.reqs = append(r.reqs, received{id: req.Header.Get("Tally-Event-Id"), sig: req.Header.Get("Tally-Signature"),
		body: body, at: time.Now(), status: status})
	r.mu.Unlock()
	if status != 0 {
		w.WriteHeader(status)
	}
}

// down closes the listener: connections are refused.
func (r *receiver) down() {
	if r.srv == nil {
		return
	}
	_ = r.srv.Close()
	<-r.done
	r.srv = nil
}

// up listens again on the same address.
func (r *receiver) up() {
	ln, err := net.Listen("tcp", r.addr)
	if err != nil {
		r.t.Fatalf("receiver up: %v", err)
	}
	r.serve(ln)
}

// delivered is, in arrival order, every request answered 2xx.
func (r *receiver) delivered() []received {
	r.mu.Lock()
	defer r.mu.Unlock()
	var out []received
	for _, q := range r.reqs {
		if q.status >= 200 && q.status < 300 {
			out = append(out, q)
		}
	}
	return out
}

func (r *receiver) all() []received {
	r.mu.Lock()
	defer r.mu.Unlock()
	return append([]received(nil), r.reqs...)
}

// eventsOf decodes bodies.
func eventsOf(t *testing.T, rs []received) []alerts.Event {
	out := make([]alerts.Event, len(rs))
	for i, q := range rs {
		if err := json.Unmarshal(q.body, &out[i]); err != nil {
			t.Fatalf("body %q: %v", q.body, err)
		}
	}
	return out
}

// stored is every event in the database, in seq order.
func (e *env) stored() []alerts.Event {
	e.t.Helper()
	rows, err := e.pool.Query(context.Background(), `SELECT body FROM alert_events ORDER BY seq`)
	if err != nil {
		e.t.Fatal(err)
	}
	bodies, err := pgx.CollectRows(rows, pgx.RowTo[string])
	if err != nil {
		e.t.Fatal(err)
	}
	out := make([]alerts.Event, len(bodies))
	for i, b := range bodies {
		if err := json.Unmarshal([]byte(b), &out[i]); err != nil {
			e.t.Fatal(err)
		}
	}
	return out
}

// waitFor polls cond until it holds or d passes.
func waitFor(t *testing.T, d time.Duration, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(d)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out after %v waiting for %s", d, what)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// body is event id's stored body.
func (e *env) body(id string) string {
	e.t.Helper()
	var b string
	if err := e.pool.QueryRow(context.Background(), `SELECT body FROM alert_events WHERE id = $1`, id).Scan(&b); err != nil {
		e.t.Fatal(err)
	}
	return b
}

// readKafka reads n messages of tally.alerts from the start.
func (e *env) readKafka(t *testing.T, n int) []kafka.Message {
	t.Helper()
	r := kafka.NewReader(kafka.ReaderConfig{Brokers: e.kafka.Addrs, Topic: alerts.DefaultTopic, Partition: 0, MaxWait: 100 * time.Millisecond})
	defer r.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	var out []kafka.Message
	for len(out) < n {
		m, err := r.ReadMessage(ctx)
		if err != nil {
			t.Fatalf("read %s: %v after %d messages", alerts.DefaultTopic, err, len(out))
		}
		out = append(out, m)
	}
	return out
}

func ptr[T any](v T) *T { return &v }

func decimalOf(s string) decimal.Decimal { return decimal.RequireFromString(s) }

// metric reads one series, written as in the text format
// (`name{a="x",b="y"}`), of a counter or gauge; -1 when absent.
func metric(reg *prometheus.Registry, series string) float64 {
	name, labels, _ := strings.Cut(strings.TrimSuffix(series, "}"), "{")
	mfs, err := reg.Gather()
	if err != nil {
		return -1
	}
	for _, mf := range mfs {
		if mf.GetName() != name {
			continue
		}
		for _, m := range mf.GetMetric() {
			var ls []string
			for _, l := range m.GetLabel() {
				ls = append(ls, l.GetName()+`="`+l.GetValue()+`"`)
			}
			if strings.Join(ls, ",") != labels {
				continue
			}
			switch {
			case m.Counter != nil:
				return m.GetCounter().GetValue()
			case m.Gauge != nil:
				return m.GetGauge().GetValue()
			}
		}
	}
	return -1
}

// histogram reads the sample count and sum of a histogram without
// labels; ok false when absent.
func histogram(reg *prometheus.Registry, name string) (count uint64, sum float64, ok bool) {
	mfs, err := reg.Gather()
	if err != nil {
		return 0, 0, false
	}
	for _, mf := range mfs {
		if mf.GetName() == name && len(mf.GetMetric()) == 1 && mf.GetMetric()[0].Histogram != nil {
			h := mf.GetMetric()[0].GetHistogram()
			return h.GetSampleCount(), h.GetSampleSum(), true
		}
	}
	return 0, 0, false
}

// daily gives customer a calendar of UTC days.
func (e *env) daily(customer string) {
	e.t.Helper()
	if _, _, err := e.periods().SetCalendar(context.Background(), e.pool, customer, periods.Calendar{Cadence: periods.Daily}); err != nil {
		e.t.Fatal(err)
	}
}
