// Package floodbench is the benchmark behind `tally bench flood`: ingest
// under a flood of made-up API tokens, against the same request load to
// /healthz, which touches no database. It is a measuring tool, not an API.
//
// It drives a running Tally (ingest, API and enforcer in this process, so
// the heap figures are the server's) and a load generator in a separate
// process (like hey or wrk, which cannot send a new token on every request):
//
//  1. the API's saturation: made-up well-formed customer tokens, each a
//     Postgres query, on Conns keep-alive connections as fast as answered;
//  2. Rounds rounds, alternating, of Records records ingested while the
//     generator sends at half the saturation rate either the same made-up
//     tokens (flood) or as many requests to /healthz (CPU-only); the
//     medians' ratio is the figure (target: flood ≥ 0.8 × CPU-only);
//  3. Methods requests, each with a method name never used before, and the
//     heap and number of HTTP series before and after (target: flat).
package floodbench

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/segmentio/kafka-go"
	"github.com/shopspring/decimal"

	"github.com/tally-ledger/tally/ingest"
	"github.com/tally-ledger/tally/ingest/wire"
)

// Config shapes a run. Every field is required.
type Config struct {
	Records    int           // records ingested per measurement
	PerMessage int           // records per Kafka message, ≤ wire.MaxRecords
	Partitions int           // partitions of the ingest topic; 8 customers each
	Rounds     int           // rounds of the two measurements, interleaved
	Conns      int           // connections of the load generator
	Methods    int           // requests with distinct method names in the memory check (0: skip)
	Saturation time.Duration // how long to measure the API's saturation rate
	Warmup     time.Duration // load before each ingest measurement starts

	// The Tally under test: its base URL and admin token, its database
	// (migrated; the ingest positions are read from it) and the broker its
	// ingest reads ingest.DefaultTopic from.
	URL        string
	AdminToken string
	Pool       *pgxpool.Pool
	Broker     string
	// LoadCommand runs the load generator: a program and its arguments, to
	// which the LoadSpec is appended as JSON. It calls GenerateLoad and
	// prints the LoadResult as JSON.
	LoadCommand []string
	// Out receives each figure as it is measured (nil: discarded).
	Out io.Writer
}

// Validate reports a shape that cannot be run.
func (c Config) Validate() error {
	if c.Records < 1 || c.PerMessage < 1 || c.PerMessage > wire.MaxRecords || c.Partitions < 1 || c.Rounds < 1 || c.Conns < 1 || c.Methods < 0 {
		return errors.New("bench flood: need --records ≥ 1, 1 ≤ --per-message ≤ 10000, --partitions ≥ 1, --rounds ≥ 1, --conns ≥ 1, --methods ≥ 0")
	}
	return nil
}

// Report is what a run measured.
type Report struct {
	SaturationRate float64    // refusals (401) per second at saturation
	Saturation     LoadResult // the saturation run
	LoadRate       float64    // requests/s of the load in the rounds: half the saturation rate
	Rounds         []Round
	FloodMedian    float64 // records/s, median over the flood rounds
	CPUMedian      float64 // records/s, median over the CPU-only rounds
	Memory         *Memory // nil when Methods is 0
}

// Ratio is the figure: ingest under the flood over ingest under CPU-only load.
func (r Report) Ratio() float64 { return r.FloodMedian / r.CPUMedian }

// Memory is the heap and the HTTP series across requests with distinct
// method names: before, after a first hundredth, and at the end.
type Memory struct {
	First, Rest LoadResult
	Seconds     float64
	Heap        [3]uint64 // bytes in use
	Series      [3]int    // tally_http_request* series
}

// Run measures: it waits for the enforcer, measures saturation, then the
// interleaved rounds, then memory.
func Run(ctx context.Context, c Config) (Report, error) {
	if err := c.Validate(); err != nil {
		return Report{}, err
	}
	if c.URL == "" || c.AdminToken == "" || c.Pool == nil || c.Broker == "" || len(c.LoadCommand) == 0 {
		return Report{}, errors.New("floodbench: URL, AdminToken, Pool, Broker and LoadCommand are required")
	}
	if c.Out == nil {
		c.Out = io.Discard
	}
	customers := c.Partitions * 8
	admin := &http.Client{Timeout: 30 * time.Second}
	if err := setUp(ctx, c, admin, customers); err != nil {
		return Report{}, err
	}
	var r Report
	var err error
	if r.Saturation, r.SaturationRate, err = saturate(ctx, c); err != nil {
		return r, err
	}
	r.LoadRate = r.SaturationRate / 2
	if r.Rounds, r.FloodMedian, r.CPUMedian, err = interleave(ctx, c, r.LoadRate, customers); err != nil {
		return r, err
	}
	if c.Methods > 0 {
		if r.Memory, err = memory(ctx, c, admin); err != nil {
			return r, err
		}
	}
	return r, nil
}

// setUp gives every customer a quota the run never reaches and waits until
// the enforcer holds its lease and evaluates.
func setUp(ctx context.Context, c Config, admin *http.Client, customers int) error {
	for i := range customers {
		if err := adminPut(ctx, admin, c.URL+fmt.Sprintf("/v1/customers/bench-%03d/quotas/api_calls", i), c.AdminToken,
			`{"limit":"1000000000000"}`); err != nil {
			return err
		}
	}
	for deadline := time.Now().Add(60 * time.Second); ; time.Sleep(100 * time.Millisecond) {
		m, err := scrape(ctx, admin, c.URL, c.AdminToken)
		if err != nil {
			return err
		}
		if m["tally_quota_leader"] == 1 && m["tally_quota_evaluation_seconds_count"] > 0 {
			return nil
		}
		if time.Now().After(deadline) {
			return errors.New("the enforcer did not start evaluating in 60s")
		}
	}
}

// saturate measures the rate of refusals (401) the API gives: each is a
// token checked against Postgres. Shed requests (503) cost it next to
// nothing and are not counted.
func saturate(ctx context.Context, c Config) (LoadResult, float64, error) {
	sat, err := runLoad(ctx, c.LoadCommand, LoadSpec{URL: c.URL, Kind: "random-token", Conns: c.Conns, Duration: c.Saturation})
	if err != nil {
		return sat, 0, err
	}
	rate := float64(sat.ByStatus["401"]) / sat.Seconds
	if rate == 0 {
		return sat, 0, fmt.Errorf("the API refused no made-up token in %s: %s", c.Saturation, sat.statuses())
	}
	fmt.Fprintf(c.Out, "API saturation, made-up tokens, %d connections: %.0f refusals (401)/s (%s in %.1fs); load rate = %.0f requests/s\n",
		c.Conns, rate, sat.statuses(), sat.Seconds, rate/2)
	return sat, rate, nil
}

// interleave runs c.Rounds rounds of a CPU-only and a flood measurement and
// compares their medians.
func interleave(ctx context.Context, c Config, rate float64, customers int) (rounds []Round, floodMedian, cpuMedian float64, err error) {
	var floodRates, cpuRates []float64
	var phase int
	for round := range c.Rounds {
		for _, kind := range []string{"healthz", "random-token"} {
			phase++
			label := map[string]string{"healthz": "CPU-only (/healthz)", "random-token": "flood (made-up tokens)"}[kind]
			r, err := measure(ctx, c, kind, rate, phase, customers)
			if err != nil {
				return rounds, 0, 0, err
			}
			r.Round = round + 1
			rounds = append(rounds, r)
			fmt.Fprintf(c.Out, "round %d %-24s ingest %8.0f records/s; load %6.0f req/s sent, %s; enforcer %.2f evaluations/s, max lag %.1fs\n",
				round+1, label, r.IngestRate, r.Load.sentPerSecond(), r.Load.statuses(), r.EvalsPerSecond, r.MaxLag)
			if kind == "healthz" {
				cpuRates = append(cpuRates, r.IngestRate)
			} else {
				floodRates = append(floodRates, r.IngestRate)
			}
		}
	}
	mf, mc := medianF(floodRates), medianF(cpuRates)
	fmt.Fprintf(c.Out, "\nmedians of %d rounds: ingest with flood %.0f records/s, with CPU-only load %.0f records/s\n", c.Rounds, mf, mc)
	fmt.Fprintf(c.Out, "  ingest flood / CPU-only = %.2f   (target ≥ 0.80)\n", mf/mc)
	return rounds, mf, mc, nil
}

// memory measures the heap and the HTTP series across distinct method
// names: after a first hundredth (the first "other" method adds its series
// once) and at the end.
func memory(ctx context.Context, c Config, admin *http.Client) (*Memory, error) {
	var m Memory
	var err error
	if m.Heap[0], m.Series[0], err = heapAndSeries(ctx, admin, c.URL, c.AdminToken); err != nil {
		return nil, err
	}
	warm := max(1, c.Methods/100)
	t0 := time.Now()
	if m.First, err = runLoad(ctx, c.LoadCommand, LoadSpec{URL: c.URL, Kind: "methods", Conns: min(c.Conns, 32), Count: warm, First: 0}); err != nil {
		return nil, err
	}
	if m.Heap[1], m.Series[1], err = heapAndSeries(ctx, admin, c.URL, c.AdminToken); err != nil {
		return nil, err
	}
	if m.Rest, err = runLoad(ctx, c.LoadCommand, LoadSpec{URL: c.URL, Kind: "methods", Conns: min(c.Conns, 32), Count: c.Methods - warm, First: int64(warm)}); err != nil {
		return nil, err
	}
	if m.Heap[2], m.Series[2], err = heapAndSeries(ctx, admin, c.URL, c.AdminToken); err != nil {
		return nil, err
	}
	m.Seconds = time.Since(t0).Seconds()
	mib := func(b uint64) float64 { return float64(b) / (1 << 20) }
	n1, n := m.First.Sent, m.First.Sent+m.Rest.Sent
	fmt.Fprintf(c.Out, "\n%d requests, each with a method name never sent before (%s; %s), in %.1fs:\n",
		n, m.First.statuses(), m.Rest.statuses(), m.Seconds)
	fmt.Fprintf(c.Out, "  heap in use: %.1f MiB before, %.1f MiB after %d, %.1f MiB after %d\n", mib(m.Heap[0]), mib(m.Heap[1]), n1, mib(m.Heap[2]), n)
	fmt.Fprintf(c.Out, "  HTTP series: %d before, %d after %d, %d after %d\n", m.Series[0], m.Series[1], n1, m.Series[2], n)
	return &m, nil
}

func adminPut(ctx context.Context, c *http.Client, url, token, body string) error {
	req, err := http.NewRequestWithContext(ctx, http.MethodPut, url, strings.NewReader(body))
	if err != nil {
		return err
	}
	req.Header.Set("Authorization", "Bearer "+token)
	req.Header.Set("Content-Type", "application/json")
	res, err := c.Do(req)
	if err != nil {
		return err
	}
	defer res.Body.Close()
	if res.StatusCode >= 300 {
		b, _ := io.ReadAll(res.Body)
		return fmt.Errorf("PUT %s: %d %s", url, res.StatusCode, b)
	}
	return nil
}

// Round is one ingest measurement under one kind of load.
type Round struct {
	Round          int        // from 1
	Kind           string     // "healthz" (CPU-only) or "random-token" (flood)
	IngestRate     float64    // records/s, first produce to last offset stored
	Load           LoadResult // what the load generator sent meanwhile
	EvalsPerSecond float64    // the enforcer's evaluations per second
	MaxLag         float64    // the enforcer's largest lag seen, seconds
}

// measure starts the load, waits c.Warmup, produces c.Records new records
// and times them from the first produce to the last offset stored, sampling
// the enforcer's metrics meanwhile; then stops the load.
func measure(ctx context.Context, c Config, kind string, rate float64, phase, customers int) (Round, error) {
	pool, broker, base, adminToken := c.Pool, c.Broker, c.URL, c.AdminToken
	msgs := floodMessages(c.Records, c.PerMessage, customers, fmt.Sprintf("flood-%d", phase))
	var before int64
	if err := pool.QueryRow(ctx, "SELECT coalesce(sum(next_offset), 0) FROM ingest_partitions WHERE topic = $1", ingest.DefaultTopic).Scan(&before); err != nil {
		return Round{}, err
	}
	lctx, stopLoad := context.WithCancel(ctx)
	defer stopLoad()
	loadDone := make(chan struct{})
	var load LoadResult
	var loadErr error
	go func() {
		defer close(loadDone)
		load, loadErr = runLoad(lctx, c.LoadCommand, LoadSpec{URL: base, Kind: kind, Conns: c.Conns, Rate: rate, Duration: time.Hour})
	}()
	select {
	case <-time.After(c.Warmup):
	case <-loadDone:
		return Round{}, fmt.Errorf("load generator: %v", loadErr)
	}
	admin := &http.Client{Timeout: 10 * time.Second}
	evals0, _, _ := enforcerMetrics(ctx, admin, base, adminToken)
	var maxLag atomic.Value
	maxLag.Store(0.0)
	sampleCtx, stopSample := context.WithCancel(ctx)
	var sampled sync.WaitGroup
	sampled.Add(1)
	go func() {
		defer sampled.Done()
		for sampleCtx.Err() == nil {
			if _, lag, err := enforcerMetrics(sampleCtx, admin, base, adminToken); err == nil && lag > maxLag.Load().(float64) {
				maxLag.Store(lag)
			}
			select {
			case <-sampleCtx.Done():
			case <-time.After(500 * time.Millisecond):
			}
		}
	}()
	t0 := time.Now()
	tr := &kafka.Transport{}
	defer tr.CloseIdleConnections()
	w := &kafka.Writer{Addr: kafka.TCP(broker), Topic: ingest.DefaultTopic, Transport: tr, Balancer: &kafka.Murmur2Balancer{},
		RequiredAcks: kafka.RequireAll, BatchTimeout: 5 * time.Millisecond, BatchSize: 100, BatchBytes: 3 << 20}
	err := w.WriteMessages(ctx, msgs...)
	if cerr := w.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		stopSample()
		return Round{}, fmt.Errorf("produce: %w", err)
	}
	for {
		var next int64
		if err := pool.QueryRow(ctx, "SELECT coalesce(sum(next_offset), 0) FROM ingest_partitions WHERE topic = $1", ingest.DefaultTopic).Scan(&next); err != nil {
			stopSample()
			return Round{}, err
		}
		if next >= before+int64(len(msgs)) {
			break
		}
		select {
		case <-ctx.Done():
			stopSample()
			return Round{}, ctx.Err()
		case <-time.After(5 * time.Millisecond):
		}
	}
	took := time.Since(t0)
	stopSample()
	sampled.Wait()
	evals1, _, _ := enforcerMetrics(ctx, admin, base, adminToken)
	stopLoad()
	<-loadDone
	if loadErr != nil {
		return Round{}, fmt.Errorf("load generator: %w", loadErr)
	}
	return Round{Kind: kind, IngestRate: float64(c.Records) / took.Seconds(), Load: load,
		EvalsPerSecond: (evals1 - evals0) / took.Seconds(), MaxLag: maxLag.Load().(float64)}, nil
}

// floodMessages are total new records from producer, in messages of perMessage.
func floodMessages(total, perMessage, customers int, producer string) []kafka.Message {
	seqs := make([]int64, customers)
	totals := make([]decimal.Decimal, customers)
	now := time.Now().UTC().Add(-time.Minute)
	var out []kafka.Message
	for i, left := 0, total; left > 0; i, left = i+1, left-perMessage {
		c := i % customers
		b := wire.Batch{Schema: wire.Schema, BatchID: uuid.Must(uuid.NewV7()), Producer: producer, Epoch: 1, SentAt: now}
		for range min(perMessage, left) {
			seqs[c]++
			q := decimal.New(int64(seqs[c]%1000+1), -2)
			totals[c] = totals[c].Add(q)
			b.Records = append(b.Records, wire.Record{OperationID: uuid.Must(uuid.NewV7()), Customer: fmt.Sprintf("bench-%03d", c),
				Meter: "api_calls", Seq: seqs[c], Total: totals[c], Quantity: decimal.NewNullDecimal(q), OccurredAt: now})
		}
		v, err := wire.Encode(b)
		if err != nil {
			panic(err) // only valid batches are built
		}
		out = append(out, kafka.Message{Key: []byte(fmt.Sprintf("bench-%03d", c)), Value: v})
	}
	return out
}

// scrape reads /metrics with the admin token (retrying a shed request).
func scrape(ctx context.Context, c *http.Client, base, token string) (map[string]float64, error) {
	for attempt := 0; ; attempt++ {
		req, err := http.NewRequestWithContext(ctx, http.MethodGet, base+"/metrics", nil)
		if err != nil {
			return nil, err
		}
		req.Header.Set("Authorization", "Bearer "+token)
		res, err := c.Do(req)
		if err != nil {
			return nil, err
		}
		if res.StatusCode == http.StatusServiceUnavailable || res.StatusCode == http.StatusTooManyRequests {
			res.Body.Close()
			if attempt == 20 {
				return nil, fmt.Errorf("/metrics: %d", res.StatusCode)
			}
			time.Sleep(100 * time.Millisecond)
			continue
		}
		m := map[string]float64{}
		sc := bufio.NewScanner(res.Body)
		sc.Buffer(make([]byte, 1<<20), 1<<20)
		for sc.Scan() {
			line := sc.Text()
			if strings.HasPrefix(line, "#") {
				continue
			}
			i := strings.LastIndexByte(line, ' ')
			if i < 0 {
				continue
			}
			v, err := strconv.ParseFloat(line[i+1:], 64)
			if err != nil {
				continue
			}
			name := line[:i]
			if strings.HasPrefix(name, "tally_http_request") {
				m["http_series"]++
			}
			m[name] = v
		}
		res.Body.Close()
		return m, sc.Err()
	}
}

func enforcerMetrics(ctx context.Context, c *http.Client, base, token string) (evals, lag float64, err error) {
	m, err := scrape(ctx, c, base, token)
	if err != nil {
		return 0, 0, err
	}
	return m["tally_quota_evaluation_seconds_count"], m["tally_quota_lag_seconds"], nil
}

// heapAndSeries is this process's heap in use after a collection and the
// number of tally_http_request* series.
func heapAndSeries(ctx context.Context, c *http.Client, base, token string) (uint64, int, error) {
	runtime.GC()
	var ms runtime.MemStats
	runtime.ReadMemStats(&ms)
	m, err := scrape(ctx, c, base, token)
	if err != nil {
		return 0, 0, err
	}
	return ms.HeapInuse, int(m["http_series"]), nil
}

func medianF(xs []float64) float64 {
	s := slices.Clone(xs)
	slices.Sort(s)
	return s[len(s)/2]
}
