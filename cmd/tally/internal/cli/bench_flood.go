package cli

import (
	"bufio"
	"context"
	"crypto/rand"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"os"
	"os/exec"
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
	"github.com/spf13/cobra"

	"github.com/tally-ledger/tally/cmd/tally/internal/devstack"
	"github.com/tally-ledger/tally/ingest"
	"github.com/tally-ledger/tally/ingest/wire"
)

type benchFloodOptions struct {
	records, perMessage, partitions int
	rounds, conns, methods          int
	saturation, warmup              time.Duration
	adminURL, dbPrefix              string
	keep, onePool                   bool
}

func newBenchFloodCmd() *cobra.Command {
	o := benchFloodOptions{}
	cmd := &cobra.Command{
		Use:   "flood",
		Short: "Ingest under a flood of made-up API tokens, against the same request load to /healthz",
		Long: `Run tally serve's ingest, API and enforcer (its own code path and pools, with
the per-address rate limit off, as behind a proxy) on an embedded broker and
a fresh database, then:

 1. measure the API's saturation: a load generator (a separate process) on
    --conns keep-alive connections sends requests with a new random
    well-formed customer token each (every one costs a Postgres query) as
    fast as they are answered, for --saturation;
 2. in --rounds rounds, alternating, ingest --records records while the
    generator sends, at half the saturation rate and on --conns
    connections, either the same made-up-token requests (flood) or the same
    number of requests to /healthz, which touches no database (CPU-only
    load of the same size); report records/s, the enforcer's evaluations
    per second and its largest lag, and the medians' ratio (target: flood ≥
    0.8 × CPU-only);
 3. send --methods requests, each with a method name never used before, and
    report the process's heap and its number of HTTP series before and
    after (target: flat).

The database is created on the server of --database-url and dropped
afterwards (unless --keep).`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			return benchFlood(cmd.Context(), cmd.OutOrStdout(), o)
		},
	}
	f := cmd.Flags()
	f.IntVar(&o.records, "records", 100_000, "records ingested per measurement")
	f.IntVar(&o.perMessage, "per-message", 1000, "records per Kafka message")
	f.IntVar(&o.partitions, "partitions", 4, "partitions of the ingest topic")
	f.IntVar(&o.rounds, "rounds", 2, "rounds of the two measurements (flood, CPU-only), interleaved; medians are compared")
	f.IntVar(&o.conns, "conns", 200, "connections of the load generator")
	f.IntVar(&o.methods, "methods", 1_000_000, "requests with distinct method names in the memory check (0: skip)")
	f.DurationVar(&o.saturation, "saturation", 10*time.Second, "how long to measure the API's saturation rate")
	f.DurationVar(&o.warmup, "warmup", 2*time.Second, "load before each ingest measurement starts")
	f.StringVar(&o.adminURL, "database-url", defaultDatabaseURL, "Postgres server to create the benchmark database on")
	envDefault(f, "database-url", "TALLY_DATABASE_URL")
	f.StringVar(&o.dbPrefix, "database-prefix", "tally_bench_flood", "prefix of the benchmark database's name")
	f.BoolVar(&o.keep, "keep", false, "keep the benchmark database")
	f.BoolVar(&o.onePool, "one-pool", false, "run ingest, API and enforcer on one pool (the ingest's), as before they had their own: the comparison without bulkheads")
	cmd.AddCommand(newBenchLoadCmd())
	return cmd
}

func benchFlood(ctx context.Context, out io.Writer, o benchFloodOptions) error {
	if o.records < 1 || o.perMessage < 1 || o.perMessage > wire.MaxRecords || o.partitions < 1 || o.rounds < 1 || o.conns < 1 || o.methods < 0 {
		return errors.New("bench flood: need --records ≥ 1, 1 ≤ --per-message ≤ 10000, --partitions ≥ 1, --rounds ≥ 1, --conns ≥ 1, --methods ≥ 0")
	}
	log := slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelError}))
	k, err := devstack.StartKafka(devstack.KafkaConfig{Addr: "127.0.0.1:0",
		Topics: []string{ingest.DefaultTopic, defaultDecisionsTopic}, Partitions: int32(o.partitions)})
	if err != nil {
		return err
	}
	defer k.Close()
	mpool, dbURL, done, err := benchDB(ctx, o.adminURL, o.dbPrefix, o.keep, log)
	if err != nil {
		return err
	}
	defer done()

	// tally serve, in this process: the same run and pools as the command.
	var tok [32]byte
	_, _ = rand.Read(tok[:])
	ro := runOptions{brokers: []string{k.Addr}, listen: "127.0.0.1:0", adminToken: base64.RawURLEncoding.EncodeToString(tok[:]),
		ingest: true, api: true, enforce: true, log: log, apiLimits: apiLimits{addressRate: -1}}
	sizes := poolSizes{ingest: defaultIngestPoolSize(), api: 4, enforce: 2}
	pools, err := openPools(ctx, dbURL, ro, sizes)
	if err != nil {
		return err
	}
	defer pools.close()
	ro.pool, ro.apiPool, ro.enforcePool = pools.ingest, pools.api, pools.enforce
	poolNote := fmt.Sprintf("pools: ingest %d, api %d, enforce %d", sizes.ingest, sizes.api, sizes.enforce)
	if o.onePool {
		ro.apiPool, ro.enforcePool = pools.ingest, pools.ingest
		poolNote = fmt.Sprintf("ONE pool of %d for ingest, api and enforce", sizes.ingest)
	}
	addrCh := make(chan string, 1)
	ro.ready = func(addr string) { addrCh <- addr }
	sctx, stopServe := context.WithCancel(ctx)
	served := make(chan error, 1)
	go func() { served <- run(sctx, ro) }()
	defer func() { stopServe(); <-served }()
	var base string
	select {
	case a := <-addrCh:
		base = "http://" + a
	case err := <-served:
		return fmt.Errorf("serve: %w", err)
	}
	fmt.Fprintf(out, "tally bench flood: serve on %s (%s; per-address limit off), broker %s, database %s, GOMAXPROCS %d\n",
		base, poolNote, k.Addr, dbName(dbURL), runtime.GOMAXPROCS(0))

	customers := o.partitions * 8
	admin := &http.Client{Timeout: 30 * time.Second}
	for i := range customers {
		if err := adminPut(ctx, admin, base+fmt.Sprintf("/v1/customers/bench-%03d/quotas/api_calls", i), ro.adminToken,
			`{"limit":"1000000000000"}`); err != nil {
			return err
		}
	}

	// The enforcer evaluates once it holds its lease.
	for deadline := time.Now().Add(60 * time.Second); ; time.Sleep(100 * time.Millisecond) {
		m, err := scrape(ctx, admin, base, ro.adminToken)
		if err != nil {
			return err
		}
		if m["tally_quota_leader"] == 1 && m["tally_quota_evaluation_seconds_count"] > 0 {
			break
		}
		if time.Now().After(deadline) {
			return errors.New("the enforcer did not start evaluating in 60s")
		}
	}

	// 1. Saturation.
	sat, err := runLoad(ctx, loadSpec{URL: base, Kind: "random-token", Conns: o.conns, Duration: o.saturation})
	if err != nil {
		return err
	}
	// Saturation is the rate of refusals (401) the API gives: each is a
	// token checked against Postgres. Shed requests (503) cost it next to
	// nothing and are not counted.
	satRate := float64(sat.ByStatus["401"]) / sat.Seconds
	if satRate == 0 {
		return fmt.Errorf("the API refused no made-up token in %s: %s", o.saturation, sat.statuses())
	}
	floodRate := satRate / 2
	fmt.Fprintf(out, "API saturation, made-up tokens, %d connections: %.0f refusals (401)/s (%s in %.1fs); load rate = %.0f requests/s\n",
		o.conns, satRate, sat.statuses(), sat.Seconds, floodRate)

	// 2. Interleaved ingest measurements.
	var floodRates, cpuRates []float64
	var phase int
	for round := range o.rounds {
		for _, kind := range []string{"healthz", "random-token"} {
			phase++
			label := map[string]string{"healthz": "CPU-only (/healthz)", "random-token": "flood (made-up tokens)"}[kind]
			r, err := floodPhase(ctx, out, mpool, k.Addr, base, ro.adminToken, o, kind, floodRate, phase, customers)
			if err != nil {
				return err
			}
			fmt.Fprintf(out, "round %d %-24s ingest %8.0f records/s; load %6.0f req/s sent, %s; enforcer %.2f evaluations/s, max lag %.1fs\n",
				round+1, label, r.ingestRate, r.load.sentPerSecond(), r.load.statuses(), r.evalsPerSecond, r.maxLag)
			if kind == "healthz" {
				cpuRates = append(cpuRates, r.ingestRate)
			} else {
				floodRates = append(floodRates, r.ingestRate)
			}
		}
	}
	mf, mc := medianF(floodRates), medianF(cpuRates)
	fmt.Fprintf(out, "\nmedians of %d rounds: ingest with flood %.0f records/s, with CPU-only load %.0f records/s\n", o.rounds, mf, mc)
	fmt.Fprintf(out, "  ingest flood / CPU-only = %.2f   (target ≥ 0.80)\n", mf/mc)

	// 3. Memory across distinct method names: measured after a first
	// hundredth (the first "other" method adds its series once) and at the end.
	if o.methods > 0 {
		h0, s0, err := heapAndSeries(ctx, admin, base, ro.adminToken)
		if err != nil {
			return err
		}
		warm := max(1, o.methods/100)
		t0 := time.Now()
		res1, err := runLoad(ctx, loadSpec{URL: base, Kind: "methods", Conns: min(o.conns, 32), Count: warm, First: 0})
		if err != nil {
			return err
		}
		h1, s1, err := heapAndSeries(ctx, admin, base, ro.adminToken)
		if err != nil {
			return err
		}
		res2, err := runLoad(ctx, loadSpec{URL: base, Kind: "methods", Conns: min(o.conns, 32), Count: o.methods - warm, First: int64(warm)})
		if err != nil {
			return err
		}
		h2, s2, err := heapAndSeries(ctx, admin, base, ro.adminToken)
		if err != nil {
			return err
		}
		mib := func(b uint64) float64 { return float64(b) / (1 << 20) }
		fmt.Fprintf(out, "\n%d requests, each with a method name never sent before (%s; %s), in %.1fs:\n",
			res1.Sent+res2.Sent, res1.statuses(), res2.statuses(), time.Since(t0).Seconds())
		fmt.Fprintf(out, "  heap in use: %.1f MiB before, %.1f MiB after %d, %.1f MiB after %d\n", mib(h0), mib(h1), res1.Sent, mib(h2), res1.Sent+res2.Sent)
		fmt.Fprintf(out, "  HTTP series: %d before, %d after %d, %d after %d\n", s0, s1, res1.Sent, s2, res1.Sent+res2.Sent)
	}
	return nil
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

type phaseResult struct {
	ingestRate     float64
	load           loadResult
	evalsPerSecond float64
	maxLag         float64
}

// floodPhase starts the load, waits o.warmup, produces o.records new records
// and times them from the first produce to the last offset stored, sampling
// the enforcer's metrics meanwhile; then stops the load.
func floodPhase(ctx context.Context, out io.Writer, pool *pgxpool.Pool, broker, base, adminToken string, o benchFloodOptions,
	kind string, rate float64, phase, customers int) (phaseResult, error) {
	msgs := floodMessages(o.records, o.perMessage, customers, fmt.Sprintf("flood-%d", phase))
	var before int64
	if err := pool.QueryRow(ctx, "SELECT coalesce(sum(next_offset), 0) FROM ingest_partitions WHERE topic = $1", ingest.DefaultTopic).Scan(&before); err != nil {
		return phaseResult{}, err
	}
	lctx, stopLoad := context.WithCancel(ctx)
	defer stopLoad()
	loadDone := make(chan struct{})
	var load loadResult
	var loadErr error
	go func() {
		defer close(loadDone)
		load, loadErr = runLoad(lctx, loadSpec{URL: base, Kind: kind, Conns: o.conns, Rate: rate, Duration: time.Hour})
	}()
	select {
	case <-time.After(o.warmup):
	case <-loadDone:
		return phaseResult{}, fmt.Errorf("load generator: %v", loadErr)
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
		return phaseResult{}, fmt.Errorf("produce: %w", err)
	}
	for {
		var next int64
		if err := pool.QueryRow(ctx, "SELECT coalesce(sum(next_offset), 0) FROM ingest_partitions WHERE topic = $1", ingest.DefaultTopic).Scan(&next); err != nil {
			stopSample()
			return phaseResult{}, err
		}
		if next >= before+int64(len(msgs)) {
			break
		}
		select {
		case <-ctx.Done():
			stopSample()
			return phaseResult{}, ctx.Err()
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
		return phaseResult{}, fmt.Errorf("load generator: %w", loadErr)
	}
	return phaseResult{ingestRate: float64(o.records) / took.Seconds(), load: load,
		evalsPerSecond: (evals1 - evals0) / took.Seconds(), maxLag: maxLag.Load().(float64)}, nil
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

// loadSpec is one run of the load generator, a separate process (like hey
// or wrk, which cannot send a new token on every request).
type loadSpec struct {
	URL   string  `json:"url"`
	Kind  string  `json:"kind"` // random-token, healthz, methods
	Conns int     `json:"conns"`
	Rate  float64 `json:"rate"` // requests/s, open loop; 0: as fast as answered
	// Duration bounds the run; Count (methods) ends it after that many requests.
	Duration time.Duration `json:"duration"`
	Count    int           `json:"count"`
	First    int64         `json:"first"` // methods: the number of the first method name
}

type loadResult struct {
	Sent     int64            `json:"sent"`
	Dropped  int64            `json:"dropped"` // due while every connection was busy
	Errors   int64            `json:"errors"`
	ByStatus map[string]int64 `json:"by_status"`
	Seconds  float64          `json:"seconds"`
}

func (r loadResult) sentPerSecond() float64 { return float64(r.Sent) / r.Seconds }

func (r loadResult) statuses() string {
	keys := make([]string, 0, len(r.ByStatus))
	for k := range r.ByStatus {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	var parts []string
	for _, k := range keys {
		parts = append(parts, fmt.Sprintf("%s×%d", k, r.ByStatus[k]))
	}
	if r.Dropped > 0 {
		parts = append(parts, fmt.Sprintf("not sent (all connections busy)×%d", r.Dropped))
	}
	if r.Errors > 0 {
		parts = append(parts, fmt.Sprintf("errors×%d", r.Errors))
	}
	return strings.Join(parts, " ")
}

// loadExecutable is the program run as the load generator: this one.
var loadExecutable = os.Executable

// runLoad runs the load generator as a child process until spec ends or
// ctx does (then it is interrupted and reports what it did).
func runLoad(ctx context.Context, spec loadSpec) (loadResult, error) {
	exe, err := loadExecutable()
	if err != nil {
		return loadResult{}, err
	}
	b, _ := json.Marshal(spec)
	cmd := exec.Command(exe, "bench", "flood", "load", string(b))
	cmd.Env = append(os.Environ(), "TALLY_BENCH_LOAD=1")
	cmd.Stderr = os.Stderr
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		return loadResult{}, err
	}
	if err := cmd.Start(); err != nil {
		return loadResult{}, err
	}
	stopped := make(chan struct{})
	go func() {
		select {
		case <-ctx.Done():
			_ = cmd.Process.Signal(os.Interrupt)
		case <-stopped:
		}
	}()
	var res loadResult
	derr := json.NewDecoder(stdout).Decode(&res)
	werr := cmd.Wait()
	close(stopped)
	if derr != nil {
		return res, fmt.Errorf("load generator: %v (exit: %v)", derr, werr)
	}
	return res, nil
}

func newBenchLoadCmd() *cobra.Command {
	return &cobra.Command{
		Use:    "load PLAN_JSON",
		Short:  "The load generator of tally bench flood (a separate process)",
		Hidden: true,
		Args:   cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			var spec loadSpec
			if err := json.Unmarshal([]byte(args[0]), &spec); err != nil {
				return err
			}
			res := generateLoad(cmd.Context(), spec)
			return json.NewEncoder(cmd.OutOrStdout()).Encode(res)
		},
	}
}

// generateLoad sends spec's requests on spec.Conns keep-alive connections.
func generateLoad(ctx context.Context, spec loadSpec) loadResult {
	if spec.Duration > 0 {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, spec.Duration)
		defer cancel()
	}
	tr := &http.Transport{MaxIdleConns: spec.Conns, MaxIdleConnsPerHost: spec.Conns, MaxConnsPerHost: spec.Conns, DisableCompression: true}
	defer tr.CloseIdleConnections()
	client := &http.Client{Transport: tr, Timeout: 30 * time.Second}
	var sent, dropped, errs, methodN atomic.Int64
	methodN.Store(spec.First)
	var mu sync.Mutex
	byStatus := map[string]int64{}
	work := make(chan struct{})
	var wg sync.WaitGroup
	do := func() {
		method, path, token := http.MethodGet, "/v1/customers/bench-000/usage", ""
		switch spec.Kind {
		case "healthz":
			path = "/healthz"
		case "random-token":
			var b [32]byte
			_, _ = rand.Read(b[:])
			token = "tly_" + base64.RawURLEncoding.EncodeToString(b[:])
		case "methods":
			method, path = "M"+strconv.FormatInt(methodN.Add(1), 36)+"X", "/v1/customers/bench-000"
		}
		req, err := http.NewRequestWithContext(context.WithoutCancel(ctx), method, spec.URL+path, nil)
		if err != nil {
			errs.Add(1)
			return
		}
		if token != "" {
			req.Header.Set("Authorization", "Bearer "+token)
		}
		sent.Add(1)
		res, err := client.Do(req)
		if err != nil {
			errs.Add(1)
			return
		}
		_, _ = io.Copy(io.Discard, res.Body)
		res.Body.Close()
		mu.Lock()
		byStatus[strconv.Itoa(res.StatusCode)]++
		mu.Unlock()
	}
	for range spec.Conns {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for range work {
				do()
			}
		}()
	}
	start := time.Now()
	if spec.Rate <= 0 { // closed loop: as fast as answered
	loop:
		for n := 0; spec.Count == 0 || n < spec.Count; n++ {
			select {
			case work <- struct{}{}:
			case <-ctx.Done():
				break loop
			}
		}
	} else { // open loop at spec.Rate; a request due while every connection is busy is dropped
		interval := time.Duration(float64(time.Second) / spec.Rate)
		next := time.Now()
	open:
		for n := 0; spec.Count == 0 || n < spec.Count; n++ {
			next = next.Add(interval)
			if d := time.Until(next); d > 0 {
				select {
				case <-time.After(d):
				case <-ctx.Done():
					break open
				}
			} else if ctx.Err() != nil {
				break
			}
			select {
			case work <- struct{}{}:
			default:
				dropped.Add(1)
			}
		}
	}
	close(work)
	wg.Wait()
	return loadResult{Sent: sent.Load(), Dropped: dropped.Load(), Errors: errs.Load(), ByStatus: byStatus, Seconds: time.Since(start).Seconds()}
}
