package admissionbench

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"math"
	"math/rand/v2"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/redis/go-redis/v9"
	"github.com/shopspring/decimal"

	"github.com/tally-ledger/tally/admit"
	"github.com/tally-ledger/tally/quota"
	"github.com/tally-ledger/tally/tokens"
)

// RateOptions shape `tally bench admission --rate` (docs/design.md §17):
// Gateways gateways × one tenant with a rate contract (Amount per Per,
// bursts of Burst) and bursty demand. Zero values take the defaults in
// brackets.
type RateOptions struct {
	DatabaseURL string
	Gateways    int           // [20]
	Amount      int64         // the contract's amount per Per [100]
	Per         time.Duration // [1s]
	Burst       int64         // the contract's burst [200]
	// Demand: every second starts with a burst of BurstDemand requests at
	// each gateway within its first 100 ms [Burst], then Background
	// requests per second over all gateways [4 × Amount].
	BurstDemand int64
	Background  int
	Duration    time.Duration // of the replay, per regime [5s]
	MaxSkew     time.Duration // the rate rule's max_skew [100ms]
	RedisAddr   string        // "" skips the Redis row
	Seed        uint64        // [1]
	Logger      *slog.Logger
}

func (o *RateOptions) defaults() {
	if o.Gateways == 0 {
		o.Gateways = 20
	}
	if o.Amount == 0 {
		o.Amount = 100
	}
	if o.Per == 0 {
		o.Per = time.Second
	}
	if o.Burst == 0 {
		o.Burst = 200
	}
	if o.BurstDemand == 0 {
		o.BurstDemand = o.Burst
	}
	if o.Background == 0 {
		o.Background = int(4 * o.Amount * int64(time.Second) / int64(o.Per))
	}
	if o.Duration == 0 {
		o.Duration = 5 * time.Second
	}
	if o.MaxSkew == 0 {
		o.MaxSkew = 100 * time.Millisecond
	}
	if o.Seed == 0 {
		o.Seed = 1
	}
	if o.Logger == nil {
		o.Logger = slog.New(slog.DiscardHandler)
	}
}

// Validate reports every problem of o (after defaults) at once.
func (o RateOptions) Validate() error {
	o.defaults()
	var errs []error
	bad := func(format string, args ...any) { errs = append(errs, fmt.Errorf(format, args...)) }
	if o.DatabaseURL == "" {
		bad("admissionbench: DatabaseURL is required")
	}
	if o.Gateways < 1 || o.Gateways > 200 {
		bad("gateways: %d must be 1 to 200", o.Gateways)
	}
	if o.Amount < 1 || o.Burst < 1 || o.BurstDemand < 0 || o.Background < 0 {
		bad("rate amount and burst must be positive, demand not negative")
	}
	if o.Per < time.Millisecond || o.Per > time.Hour {
		bad("rate per: %s must be 1ms to 1h", o.Per)
	}
	if o.Duration < time.Second {
		bad("duration: %s must be at least 1s", o.Duration)
	}
	if o.MaxSkew < quota.MinRuleMaxSkew || o.MaxSkew > quota.MaxRuleMaxSkew {
		bad("max-skew: %s must be %s to %s", o.MaxSkew, quota.MinRuleMaxSkew, quota.MaxRuleMaxSkew)
	}
	return errors.Join(errs...)
}

// RateRow is one design's figures.
type RateRow struct {
	Design   string
	Skipped  string // why the row was not measured ("" when it was)
	Requests int64
	Admitted int64
	// FirstSecond is what was admitted in the replay's first second (an
	// admission's instant is when its answer came back).
	FirstSecond int64
	// Bound and Contract: the worst window's admitted ÷ the §17 bound
	// (burst + amount × (t2 − t1 + ttl + max_skew) / per) and ÷ the bare
	// contract (burst + amount × (t2 − t1) / per).
	Bound, Contract float64
	// FalseDenials: refusals while one exact bucket fed with what this
	// design admitted would have held a token.
	FalseDenials int64
	Calls        int64 // central calls (HTTP requests, statements, scripts)
	P50, P99     time.Duration
}

// RateResult is a run.
type RateResult struct {
	Options RateOptions
	Rows    []RateRow
}

// rateArrival is one request: at from the start, at a gateway.
type rateArrival struct {
	at time.Duration
	gw int
}

func rateTrace(o RateOptions) []rateArrival {
	rng := rand.New(rand.NewPCG(o.Seed, 17))
	var out []rateArrival
	for s := time.Duration(0); s < o.Duration; s += time.Second {
		for gw := range o.Gateways {
			for range o.BurstDemand {
				out = append(out, rateArrival{s + time.Duration(rng.Int64N(int64(100*time.Millisecond))), gw})
			}
		}
		for range o.Background {
			if at := s + time.Duration(rng.Int64N(int64(time.Second))); at < o.Duration {
				out = append(out, rateArrival{at, rng.IntN(o.Gateways)})
			}
		}
	}
	slices.SortFunc(out, func(a, b rateArrival) int { return int(a.at - b.at) })
	return out
}

// rateDesign admits one request at a gateway.
type rateDesign interface {
	admit(ctx context.Context, gw int) (bool, error)
	calls() int64
	close(ctx context.Context) error
}

// RunRate replays one trace under every design, one after another.
func RunRate(ctx context.Context, o RateOptions) (RateResult, error) {
	if err := o.Validate(); err != nil {
		return RateResult{}, err
	}
	o.defaults()
	tr := rateTrace(o)
	res := RateResult{Options: o}
	for _, d := range []struct {
		name  string
		start func(context.Context, RateOptions) (rateDesign, error)
	}{
		{"local token bucket per gateway", startLocalBuckets},
		{"central counter, Postgres", startPGBucket},
		{"central counter, Redis", startRedisBucket},
		{"grants through the admit SDK", startRateGrants},
	} {
		sys, err := d.start(ctx, o)
		var skip errSkip
		if errors.As(err, &skip) {
			res.Rows = append(res.Rows, RateRow{Design: d.name, Skipped: skip.why})
			continue
		}
		if err != nil {
			return res, fmt.Errorf("%s: %w", d.name, err)
		}
		row, err := replayRate(ctx, o, tr, sys)
		row.Design = d.name
		if cerr := sys.close(ctx); err == nil {
			err = cerr
		}
		if err != nil {
			return res, fmt.Errorf("%s: %w", d.name, err)
		}
		res.Rows = append(res.Rows, row)
	}
	return res, nil
}

func replayRate(ctx context.Context, o RateOptions, tr []rateArrival, sys rateDesign) (RateRow, error) {
	queues := make([][]rateArrival, o.Gateways)
	for _, a := range tr {
		queues[a.gw] = append(queues[a.gw], a)
	}
	type outcome struct {
		at       time.Duration
		admitted bool
		took     time.Duration
	}
	outs := make([][]outcome, o.Gateways)
	start := time.Now()
	var wg sync.WaitGroup
	var firstErr atomic.Pointer[error]
	for gw := range o.Gateways {
		wg.Go(func() {
			for _, a := range queues[gw] {
				if d := time.Until(start.Add(a.at)); d > 0 {
					time.Sleep(d)
				}
				t0 := time.Now()
				ok, err := sys.admit(ctx, gw)
				if err != nil && !errors.Is(err, context.Canceled) {
					firstErr.CompareAndSwap(nil, &err)
				}
				// Admitted (or refused) when the answer is back.
				took := time.Since(t0)
				outs[gw] = append(outs[gw], outcome{t0.Sub(start) + took, ok, took})
			}
		})
	}
	wg.Wait()
	if p := firstErr.Load(); p != nil {
		return RateRow{}, *p
	}
	var all []outcome
	for _, q := range outs {
		all = append(all, q...)
	}
	slices.SortFunc(all, func(a, b outcome) int { return int(a.at - b.at) })
	row := RateRow{Requests: int64(len(all)), Calls: sys.calls()}
	var lat []time.Duration
	var admitted []time.Duration
	// The ideal: one exact bucket fed with what this design admitted.
	perUS := float64(o.Per.Microseconds())
	tokens, last := float64(o.Burst), time.Duration(0)
	for _, x := range all {
		lat = append(lat, x.took)
		tokens = math.Min(float64(o.Burst), tokens+float64(o.Amount)*float64((x.at-last).Microseconds())/perUS)
		last = x.at
		if x.admitted {
			admitted = append(admitted, x.at)
			tokens--
			if x.at < time.Second {
				row.FirstSecond++
			}
		} else if tokens >= 1 {
			row.FalseDenials++
		}
	}
	row.Admitted = int64(len(admitted))
	slices.Sort(lat)
	row.P50, row.P99 = pct(lat, 0.5), pct(lat, 0.99)
	margin := time.Second + o.MaxSkew // the §17 bound's ttl + max_skew
	row.Bound = worstWindow(admitted, o, margin)
	row.Contract = worstWindow(admitted, o, 0)
	return row, nil
}

// worstWindow is the highest admitted ÷ (burst + amount × (t2 − t1 +
// margin) / per) over the windows between two admissions.
func worstWindow(at []time.Duration, o RateOptions, margin time.Duration) float64 {
	worst := 0.0
	for i := range at {
		for j := i; j < len(at); j++ {
			bound := float64(o.Burst) + float64(o.Amount)*float64((at[j]-at[i]+margin).Microseconds())/float64(o.Per.Microseconds())
			if r := float64(j-i+1) / bound; r > worst {
				worst = r
			}
		}
	}
	return worst
}

// localBuckets: every gateway enforces the whole contract on its own.
type localBuckets struct {
	mu      []sync.Mutex
	tokens  []float64
	last    []time.Time
	o       RateOptions
	perUS   float64
	started time.Time
}

func startLocalBuckets(_ context.Context, o RateOptions) (rateDesign, error) {
	l := &localBuckets{mu: make([]sync.Mutex, o.Gateways), tokens: make([]float64, o.Gateways), last: make([]time.Time, o.Gateways),
		o: o, perUS: float64(o.Per.Microseconds()), started: time.Now()}
	for i := range l.tokens {
		l.tokens[i], l.last[i] = float64(o.Burst), l.started
	}
	return l, nil
}

func (l *localBuckets) admit(_ context.Context, gw int) (bool, error) {
	l.mu[gw].Lock()
	defer l.mu[gw].Unlock()
	now := time.Now()
	l.tokens[gw] = math.Min(float64(l.o.Burst), l.tokens[gw]+float64(l.o.Amount)*float64(now.Sub(l.last[gw]).Microseconds())/l.perUS)
	l.last[gw] = now
	if l.tokens[gw] < 1 {
		return false, nil
	}
	l.tokens[gw]--
	return true, nil
}

func (l *localBuckets) calls() int64                  { return 0 }
func (l *localBuckets) close(_ context.Context) error { return nil }

// pgBucket: one token bucket row in Postgres, one statement per request.
type pgBucket struct {
	pool *pgxpool.Pool
	key  string
	o    RateOptions
	n    atomic.Int64
}

func startPGBucket(ctx context.Context, o RateOptions) (rateDesign, error) {
	pool, err := pgxpool.New(ctx, o.DatabaseURL)
	if err != nil {
		return nil, err
	}
	p := &pgBucket{pool: pool, key: "rate-" + runID(), o: o}
	if _, err := pool.Exec(ctx, qRateBenchTable); err != nil {
		pool.Close()
		return nil, err
	}
	if _, err := pool.Exec(ctx, qRateBenchInsert, p.key, o.Burst); err != nil {
		pool.Close()
		return nil, err
	}
	return p, nil
}

func (p *pgBucket) admit(ctx context.Context, _ int) (bool, error) {
	p.n.Add(1)
	tag, err := p.pool.Exec(ctx, qRateBenchTake, p.key, p.o.Burst, p.o.Amount, p.o.Per.Microseconds())
	return err == nil && tag.RowsAffected() == 1, err
}

func (p *pgBucket) calls() int64 { return p.n.Load() }

func (p *pgBucket) close(ctx context.Context) error {
	_, err := p.pool.Exec(ctx, `DELETE FROM bench_rate_buckets WHERE key = $1`, p.key)
	p.pool.Close()
	return err
}

const qRateBenchTable = `CREATE TABLE IF NOT EXISTS bench_rate_buckets (key text PRIMARY KEY, tokens numeric NOT NULL, at timestamptz NOT NULL)`

const qRateBenchInsert = `INSERT INTO bench_rate_buckets (key, tokens, at) VALUES ($1, $2, clock_timestamp())`

// qRateBenchTake refills the bucket to now and takes a token if it holds one.
const qRateBenchTake = `
UPDATE bench_rate_buckets b
SET tokens = x.t - 1, at = x.now
FROM (SELECT least($2::numeric, tokens + $3::numeric * (extract(epoch FROM clock_timestamp() - at) * 1000000) / $4::numeric) AS t,
             clock_timestamp() AS now
      FROM bench_rate_buckets WHERE key = $1 FOR UPDATE) x
WHERE b.key = $1 AND x.t >= 1`

// redisBucket: one token bucket in Redis, one script per request.
type redisBucket struct {
	client *redis.Client
	script *redis.Script
	key    string
	o      RateOptions
	n      atomic.Int64
}

// redisRateTake refills on Redis's clock and takes a token if it holds one.
const redisRateTake = `
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000000 + tonumber(t[2])
local v = redis.call('HMGET', KEYS[1], 'tokens', 'at')
local tokens = tonumber(v[1]) or tonumber(ARGV[1])
local at = tonumber(v[2]) or now
tokens = math.min(tonumber(ARGV[1]), tokens + tonumber(ARGV[2]) * (now - at) / tonumber(ARGV[3]))
local ok = 0
if tokens >= 1 then tokens = tokens - 1; ok = 1 end
redis.call('HSET', KEYS[1], 'tokens', tostring(tokens), 'at', tostring(now))
return ok`

func startRedisBucket(ctx context.Context, o RateOptions) (rateDesign, error) {
	if o.RedisAddr == "" {
		return nil, errSkip{"skipped: no Redis address given"}
	}
	client := redis.NewClient(&redis.Options{Addr: o.RedisAddr, PoolSize: o.Gateways, DialTimeout: time.Second,
		ReadTimeout: 2 * time.Second, WriteTimeout: 2 * time.Second, MaxRetries: -1, Protocol: 2, DisableIdentity: true})
	pctx, cancel := context.WithTimeout(ctx, 2*time.Second)
	defer cancel()
	if err := client.Ping(pctx).Err(); err != nil {
		_ = client.Close()
		return nil, errSkip{fmt.Sprintf("skipped: no Redis answered at %s (%v)", o.RedisAddr, err)}
	}
	r := &redisBucket{client: client, script: redis.NewScript(redisRateTake), key: "tally-bench-rate:" + runID(), o: o}
	if err := r.script.Load(ctx, client).Err(); err != nil {
		_ = client.Close()
		return nil, err
	}
	return r, nil
}

func (r *redisBucket) admit(ctx context.Context, _ int) (bool, error) {
	r.n.Add(1)
	v, err := r.script.Run(ctx, r.client, []string{r.key}, r.o.Burst, r.o.Amount, r.o.Per.Microseconds()).Int64()
	return err == nil && v == 1, err
}

func (r *redisBucket) calls() int64 { return r.n.Load() }

func (r *redisBucket) close(ctx context.Context) error {
	defer r.client.Close()
	return r.client.Del(ctx, r.key).Err()
}

// rateGrants: the admit SDK in every gateway against the REST API, the
// tenant's rate rule exact.
type rateGrants struct {
	pool       *pgxpool.Pool
	api        *apiServer
	clients    []*admit.Client
	transports []*http.Transport
	requests   callCounts
	tenant     string
	dir        string
}

func startRateGrants(ctx context.Context, o RateOptions) (_ rateDesign, err error) {
	g := &rateGrants{tenant: "rate-" + runID()}
	defer func() {
		if err != nil {
			_ = g.close(context.WithoutCancel(ctx))
		}
	}()
	if g.pool, err = pgxpool.New(ctx, o.DatabaseURL); err != nil {
		return nil, err
	}
	if g.api, err = serveAPI(ctx, g.pool, o.Logger); err != nil {
		return nil, err
	}
	if _, err := quota.PutRuleDB(ctx, g.pool, quota.RuleInput{Customer: g.tenant, Meter: meter, Admission: quota.Exact,
		Rate:    &quota.Rate{Amount: decimal.NewFromInt(o.Amount), Per: quota.DurationText(o.Per), Burst: decimal.NewFromInt(o.Burst)},
		MaxSkew: o.MaxSkew, Actor: "tally bench admission --rate"}); err != nil {
		return nil, fmt.Errorf("rate rule: %w", err)
	}
	if g.dir, err = os.MkdirTemp("", "tally-bench-rate-"); err != nil {
		return nil, err
	}
	for i := range o.Gateways {
		holder := fmt.Sprintf("%s-gw%02d", g.tenant, i)
		_, token, err := tokens.CreateGateway(ctx, g.pool, holder, "tally bench admission --rate", time.Now())
		if err != nil {
			return nil, fmt.Errorf("gateway token: %w", err)
		}
		tr := http.DefaultTransport.(*http.Transport).Clone()
		tr.MaxIdleConnsPerHost = 16
		g.transports = append(g.transports, tr)
		c, err := admit.New(admit.Config{URL: g.api.url, Token: token, Holder: holder,
			Dir: filepath.Join(g.dir, holder), Logger: o.Logger,
			HTTPClient: &http.Client{Timeout: 5 * time.Second, Transport: counting{tr, &g.requests}}})
		if err != nil {
			return nil, err
		}
		g.clients = append(g.clients, c)
	}
	return g, nil
}

func (g *rateGrants) admit(ctx context.Context, gw int) (bool, error) {
	d, err := g.clients[gw].Admit(ctx, g.tenant, meter, 1)
	return d.Admitted, err
}

func (g *rateGrants) calls() int64 { return g.requests.all.Load() }

func (g *rateGrants) close(ctx context.Context) error {
	cctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), time.Minute)
	defer cancel()
	var err error
	for _, c := range g.clients {
		err = errors.Join(err, c.Close(cctx))
	}
	if g.api != nil {
		g.api.close(cctx)
	}
	for _, tr := range g.transports {
		tr.CloseIdleConnections()
	}
	if g.pool != nil {
		g.pool.Close()
	}
	if g.dir != "" {
		_ = os.RemoveAll(g.dir)
	}
	return err
}

// Report prints the table.
func (r RateResult) Report(w io.Writer) {
	o := r.Options
	fmt.Fprintf(w, "%d gateways × one tenant: %d per %s, bursts of %d; demand %d per gateway at each second's start + %d/s; %s per design; bound = burst + amount × (t2 − t1 + 1s + %s) / per\n\n",
		o.Gateways, o.Amount, o.Per, o.Burst, o.BurstDemand, o.Background, o.Duration, o.MaxSkew)
	fmt.Fprintln(w, "| design | admitted (first second) | worst window ÷ §17 bound | ÷ bare contract | false denials | central calls / 1,000 admitted | latency p50 / p99 |")
	fmt.Fprintln(w, "|---|---|---|---|---|---|---|")
	for _, row := range r.Rows {
		if row.Skipped != "" {
			fmt.Fprintf(w, "| %s | %s | | | | | |\n", row.Design, row.Skipped)
			continue
		}
		fmt.Fprintf(w, "| %s | %d (%d) | %.2f | %.2f | %d | %s | %s / %s |\n", row.Design, row.Admitted, row.FirstSecond,
			row.Bound, row.Contract, row.FalseDenials, perThousand(row.Calls, row.Admitted), dur(row.P50), dur(row.P99))
	}
}
