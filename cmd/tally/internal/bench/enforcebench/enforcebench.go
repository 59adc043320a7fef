// Package enforcebench is the end-to-end enforcement benchmark of docs/design.md §10
// ("enforcement lag, produce → decision, at 20k records/s: p99 ≤ 2 s"),
// shared by `tally bench enforce` and its package's BenchmarkEnforceEndToEnd. It
// is a measuring tool, not an API.
//
// It produces meter batches at a fixed rate for many customers, each with a
// quota whose limit its usage crosses at a different time, through the real
// ingest consumer, ledger and enforcer, and reads the decisions topic with a
// kafka-go reader as a gateway would. For every crossing of warn_at × limit
// and of limit it measures the time from writing the record that crossed
// to receiving the first decision in that state, and for the limit the
// overshoot: how much more the producers had sent by then.
package enforcebench

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"slices"
	"sync"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/segmentio/kafka-go"
	"github.com/shopspring/decimal"

	"github.com/tally-ledger/tally/ingest"
	"github.com/tally-ledger/tally/ingest/wire"
	"github.com/tally-ledger/tally/ledger"
	"github.com/tally-ledger/tally/quota"
)

// Options shape a run. Zero values take the defaults in brackets.
type Options struct {
	Pool               *pgxpool.Pool // a migrated, empty database (required)
	Brokers            []string      // (required)
	IngestTopic        string        // [tally.meter-batches], must exist
	DecisionsTopic     string        // [tally.quota-decisions], must exist
	DecisionPartitions int           // partitions of DecisionsTopic [1]
	Customers          int           // one meter and one quota each [100]
	Rate               int           // records per second, all customers together [20000]
	Duration           time.Duration // of producing [20s]
	Tick               time.Duration // one message per customer per tick [50ms]
	Interval           time.Duration // the enforcer's evaluation interval [1s, its default]
	Ingest             func(*ingest.Config)
	Logger             *slog.Logger
	// Alerts also runs an alert rule on every customer at 80% and 100% of
	// its quota, delivered to an in-process webhook receiver, and
	// measures ingest transaction → webhook request (docs/design.md §15).
	Alerts bool
}

// Crossing is one threshold (warn or limit) a customer's usage crossed.
type Crossing struct {
	Customer  string
	State     quota.State
	Threshold int64
	Produced  time.Time // when the record reaching the threshold was written to Kafka
	Decided   time.Time // decided_at of the first decision at or past that state
	Received  time.Time // when the reader got it
	Lag       time.Duration
	Used      decimal.Decimal // in the decision
	Projected decimal.Decimal
	Admitted  int64   // produced total when the decision was received
	AtDecided int64   // produced total at decided_at
	Rate      float64 // the customer's produce rate, records/s
	// With Options.Alerts: when the ledger applied the crossing record
	// (ingested_at, taken in the ingest transaction that committed it) and
	// when the webhook request for this threshold arrived (zero: none).
	Ingested, Webhook time.Time
}

// Result is a run's measurements.
type Result struct {
	Records   int64
	Elapsed   time.Duration
	Crossings []Crossing
	Missing   []string // crossings no decision reported
}

type sent struct {
	total int64
	at    time.Time
}

func (o *Options) defaults() {
	if o.IngestTopic == "" {
		o.IngestTopic = quota.DefaultIngestTopic
	}
	if o.DecisionsTopic == "" {
		o.DecisionsTopic = quota.DefaultTopic
	}
	if o.DecisionPartitions == 0 {
		o.DecisionPartitions = 1
	}
	if o.Customers == 0 {
		o.Customers = 100
	}
	if o.Rate == 0 {
		o.Rate = 20000
	}
	if o.Duration == 0 {
		o.Duration = 20 * time.Second
	}
	if o.Tick == 0 {
		o.Tick = 50 * time.Millisecond
	}
	if o.Interval == 0 {
		o.Interval = quota.DefaultInterval
	}
	if o.Logger == nil {
		o.Logger = slog.New(slog.DiscardHandler)
	}
}

// Run runs the benchmark and stops everything it started before returning.
func Run(ctx context.Context, o Options) (Result, error) {
	o.defaults()
	const meter = "api_calls"
	perTick := int64(o.Rate) * int64(o.Tick) / int64(time.Second) / int64(o.Customers)
	if o.Pool == nil || len(o.Brokers) == 0 || perTick < 1 || o.Duration < 6*time.Second {
		return Result{}, errors.New("enforcebench: need Pool, Brokers, Rate × Tick ≥ Customers, Duration ≥ 6s")
	}
	custRate := float64(perTick) * float64(time.Second) / float64(o.Tick)
	ctx, cancel := context.WithCancel(ctx)
	var wg sync.WaitGroup
	defer func() { cancel(); wg.Wait() }()

	// Customer i crosses its limit at 3s + i × (Duration − 5s)/Customers.
	name := func(i int) string { return fmt.Sprintf("cust-%04d", i) }
	limits := make([]int64, o.Customers)
	for i := range o.Customers {
		at := 3*time.Second + time.Duration(i)*(o.Duration-5*time.Second)/time.Duration(o.Customers)
		limits[i] = int64(custRate * at.Seconds())
		if _, err := quota.PutRuleDB(ctx, o.Pool, quota.RuleInput{Customer: name(i), Meter: meter,
			Limit: decimal.NewFromInt(limits[i]), Actor: "bench"}); err != nil {
			return Result{}, err
		}
	}

	led, err := ledger.New(ledger.Config{Logger: o.Logger})
	if err != nil {
		return Result{}, err
	}
	icfg := ingest.Config{Brokers: o.Brokers, Topic: o.IngestTopic, Pool: o.Pool, Ledger: led,
		Logger: o.Logger, Registry: prometheus.NewRegistry()}
	if o.Ingest != nil {
		o.Ingest(&icfg)
	}
	consumer, err := ingest.NewConsumer(icfg)
	if err != nil {
		return Result{}, err
	}
	enf, err := quota.NewEnforcer(quota.Config{Pool: o.Pool, Brokers: o.Brokers, Topic: o.DecisionsTopic,
		IngestTopic: o.IngestTopic, Interval: o.Interval, Logger: o.Logger})
	if err != nil {
		return Result{}, err
	}
	wg.Add(2)
	go func() { defer wg.Done(); _ = consumer.Run(ctx) }()
	go func() { defer wg.Done(); _ = enf.Run(ctx) }()
	var hooks *webhookTimes
	if o.Alerts {
		if hooks, err = startAlerts(ctx, &wg, o, enf, meter); err != nil {
			return Result{}, err
		}
	}

	// The gateway: the first decision per (customer, state).
	type seen struct {
		d  quota.Decision
		at time.Time
	}
	var mu sync.Mutex
	first := map[string]seen{}
	var readErr error
	for p := range o.DecisionPartitions {
		rd := kafka.NewReader(kafka.ReaderConfig{Brokers: o.Brokers, Topic: o.DecisionsTopic, Partition: p,
			MinBytes: 1, MaxBytes: 4 << 20, MaxWait: 500 * time.Millisecond})
		wg.Add(1)
		go func() {
			defer wg.Done()
			defer rd.Close()
			for {
				m, err := rd.ReadMessage(ctx)
				if err != nil {
					return
				}
				at := time.Now()
				var d quota.Decision
				err = json.Unmarshal(m.Value, &d)
				mu.Lock()
				if err != nil && readErr == nil {
					readErr = fmt.Errorf("decision %s: %w", m.Value, err)
				}
				key := d.Customer + "|" + string(d.State)
				if _, ok := first[key]; !ok {
					first[key] = seen{d, at}
				}
				mu.Unlock()
			}
		}()
	}

	// Wait until every quota has its first (ok) decision: the pipeline is up.
	for deadline := time.Now().Add(60 * time.Second); ; {
		mu.Lock()
		n := len(first)
		mu.Unlock()
		if n >= o.Customers {
			break
		}
		if time.Now().After(deadline) {
			return Result{}, fmt.Errorf("enforcebench: only %d of %d initial decisions after 60s", n, o.Customers)
		}
		select {
		case <-ctx.Done():
			return Result{}, ctx.Err()
		case <-time.After(50 * time.Millisecond):
		}
	}

	// Produce at the rate: every tick, one message per customer.
	tr := &kafka.Transport{}
	defer tr.CloseIdleConnections()
	w := &kafka.Writer{Addr: kafka.TCP(o.Brokers...), Topic: o.IngestTopic, Transport: tr,
		Balancer: &kafka.Murmur2Balancer{}, RequiredAcks: kafka.RequireAll,
		BatchTimeout: 2 * time.Millisecond, BatchSize: 1000, BatchBytes: 3 << 20, MaxAttempts: 10}
	defer w.Close()
	history := make([][]sent, o.Customers)
	totals := make([]int64, o.Customers)
	var records int64
	start := time.Now()
	next := start
	// Past Duration, go on until every customer reached its limit (a
	// machine too busy to produce at the rate would leave the last
	// customers short of theirs), up to four Durations.
	short := func() bool {
		for i := range o.Customers {
			if totals[i] < limits[i] {
				return true
			}
		}
		return false
	}
	for time.Since(start) < o.Duration || short() && time.Since(start) < 4*o.Duration {
		now := time.Now()
		msgs := make([]kafka.Message, o.Customers)
		for i := range o.Customers {
			b := wire.Batch{Schema: wire.Schema, BatchID: uuid.New(), Producer: "bench", Epoch: 1, SentAt: now,
				Records: make([]wire.Record, perTick)}
			for j := range b.Records {
				totals[i]++
				b.Records[j] = wire.Record{OperationID: uuid.New(), Customer: name(i), Meter: meter, Seq: totals[i],
					Total: decimal.NewFromInt(totals[i]), Quantity: decimal.NewNullDecimal(decimal.NewFromInt(1)), OccurredAt: now}
			}
			v, err := wire.Encode(b)
			if err != nil {
				return Result{}, err
			}
			msgs[i] = kafka.Message{Key: []byte(name(i)), Value: v}
		}
		if err := w.WriteMessages(ctx, msgs...); err != nil {
			return Result{}, fmt.Errorf("produce: %w", err)
		}
		for i := range o.Customers {
			history[i] = append(history[i], sent{totals[i], now})
		}
		records += perTick * int64(o.Customers)
		next = next.Add(o.Tick)
		time.Sleep(time.Until(next))
	}
	elapsed := time.Since(start)
	// Let the last crossings arrive.
	select {
	case <-ctx.Done():
		return Result{}, ctx.Err()
	case <-time.After(3*time.Second + o.Interval):
	}

	producedAt := func(i int, total int64) time.Time {
		h := history[i]
		j, _ := slices.BinarySearchFunc(h, total, func(s sent, t int64) int { return int(s.total - t) })
		if j == len(h) {
			return time.Time{}
		}
		return h[j].at
	}
	admittedBy := func(i int, at time.Time) int64 {
		var n int64
		for _, s := range history[i] {
			if s.at.After(at) {
				break
			}
			n = s.total
		}
		return n
	}
	res := Result{Records: records, Elapsed: elapsed}
	mu.Lock()
	defer mu.Unlock()
	if readErr != nil {
		return Result{}, readErr
	}
	for i := range o.Customers {
		for _, c := range []struct {
			state quota.State
			thr   int64
		}{{quota.Warning, decimal.NewFromInt(limits[i]).Mul(quota.DefaultWarnAt).Ceil().IntPart()}, {quota.Exceeded, limits[i]}} {
			if c.thr > totals[i] {
				continue
			}
			s, ok := first[name(i)+"|"+string(c.state)]
			if x, okx := first[name(i)+"|"+string(quota.Exceeded)]; c.state == quota.Warning && okx && (!ok || x.at.Before(s.at)) {
				// Both thresholds fell within one evaluation: the exceeded
				// decision is the first to cover the warning.
				s, ok = x, true
			}
			if !ok {
				res.Missing = append(res.Missing, name(i)+" "+string(c.state))
				continue
			}
			cr := Crossing{Customer: name(i), State: c.state, Threshold: c.thr, Produced: producedAt(i, c.thr),
				Decided: s.d.DecidedAt, Received: s.at, Used: s.d.Used, Projected: s.d.Projected,
				Admitted: admittedBy(i, s.at), AtDecided: admittedBy(i, s.d.DecidedAt), Rate: custRate}
			if s.d.LagSeconds != nil {
				cr.Lag = s.d.LagSeconds.Duration()
			}
			if hooks != nil {
				if err := hooks.fill(ctx, o.Pool, &cr, meter); err != nil {
					return Result{}, err
				}
			}
			res.Crossings = append(res.Crossings, cr)
		}
	}
	return res, nil
}

func pct(ds []time.Duration, p float64) time.Duration {
	if len(ds) == 0 {
		return 0
	}
	s := slices.Clone(ds)
	slices.Sort(s)
	i := int(p*float64(len(s))+0.999999) - 1
	return s[max(0, min(i, len(s)-1))]
}

// Latency returns the produce → decision-received percentiles p50 and p99.
func (r Result) Latency() (p50, p99 time.Duration) {
	var lat []time.Duration
	for _, c := range r.Crossings {
		lat = append(lat, c.Received.Sub(c.Produced))
	}
	return pct(lat, 0.5), pct(lat, 0.99)
}

// Report writes the figures.
func (r Result) Report(w io.Writer) {
	var lat, dlat []time.Duration
	var overRecv, overDecided, inFlight, bound, estimate []float64
	within, exceeded := 0, 0
	for _, c := range r.Crossings {
		lat = append(lat, c.Received.Sub(c.Produced))
		dlat = append(dlat, c.Decided.Sub(c.Produced))
		if c.State != quota.Exceeded {
			continue
		}
		exceeded++
		overRecv = append(overRecv, float64(c.Admitted-c.Threshold))
		overDecided = append(overDecided, float64(c.AtDecided-c.Threshold))
		// Usage produced but not yet visible to the decision, against the
		// documented bound rate × lag (plus one producer tick: a message
		// carries a tick's worth of records at once).
		unseen := float64(c.AtDecided) - c.Used.InexactFloat64()
		b := c.Rate * c.Lag.Seconds()
		inFlight, bound = append(inFlight, unseen), append(bound, b)
		estimate = append(estimate, c.Projected.Sub(c.Used).InexactFloat64())
		if unseen <= b+c.Rate*0.05+1 {
			within++
		}
	}
	p50, p99 := pct(lat, 0.50), pct(lat, 0.99)
	fmt.Fprintf(w, "produced %d records in %v (%.0f records/s)\n", r.Records, r.Elapsed.Round(time.Millisecond), float64(r.Records)/r.Elapsed.Seconds())
	fmt.Fprintf(w, "produce → decision received by a kafka-go reader: p50 %v p99 %v max %v (n=%d crossings of warn or limit); produce → decided_at: p50 %v p99 %v   (target p99 ≤ 2s)\n",
		p50.Round(time.Millisecond), p99.Round(time.Millisecond), pct(lat, 1).Round(time.Millisecond), len(lat),
		pct(dlat, 0.5).Round(time.Millisecond), pct(dlat, 0.99).Round(time.Millisecond))
	if exceeded > 0 {
		med := func(v []float64) float64 { s := slices.Clone(v); slices.Sort(s); return s[len(s)/2] }
		fmt.Fprintf(w, "overshoot past the limit (records), n=%d: when decided p50 %.0f max %.0f; when the gateway received it p50 %.0f max %.0f\n",
			exceeded, med(overDecided), slices.Max(overDecided), med(overRecv), slices.Max(overRecv))
		fmt.Fprintf(w, "produced but not yet in the decision's used: p50 %.0f max %.0f; rate × lag_seconds p50 %.0f max %.0f; projected − used p50 %.0f max %.0f; within rate × lag (+1 tick) in %d of %d\n",
			med(inFlight), slices.Max(inFlight), med(bound), slices.Max(bound), med(estimate), slices.Max(estimate), within, exceeded)
	}
	r.reportAlerts(w)
	if len(r.Missing) > 0 {
		fmt.Fprintf(w, "no decision for %d crossings: %v\n", len(r.Missing), r.Missing[:min(5, len(r.Missing))])
	}
}
