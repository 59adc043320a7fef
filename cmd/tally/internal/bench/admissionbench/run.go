package admissionbench

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"math"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/tally-ledger/tally/internal/pgcpu"
	"github.com/tally-ledger/tally/quota"
)

// Options shape a run. Zero values take the defaults in brackets.
type Options struct {
	// DatabaseURL names a migrated database the run may fill (required);
	// the run opens its own pools on it.
	DatabaseURL string
	Gateways    int           // simulated gateways [10]
	Customers   int           // customers, one budget each [100]
	Rate        int           // requests per second, all customers together [2000]
	Duration    time.Duration // of the replay, per regime: the period [6s]
	Limit       int64         // units per customer for the period [500]
	Skew        float64       // Zipf exponent of demand across customers [0: even; the command's default is 1.1]
	Burst       float64       // rate multiplier in a burst, 1 to 5; 1: no bursts [4]
	FixedGrant  int64         // units per gateway and budget of the fixed-grant regime [50]
	Lookahead   time.Duration // the SDK's Lookahead in the sized regime [the SDK's default, 2s]
	// MaxWait is the SDK's bound on an Admit waiting for Tally [the SDK's
	// default, 250ms]. A debit answered after it may have been taken while
	// its request was refused (docs/gateways-exact.md), which the exact
	// rows then report as consumed beyond admitted: tests on a loaded
	// machine raise it.
	MaxWait     time.Duration
	LagInterval time.Duration // the lagged regime's decision interval [quota.DefaultInterval]
	LagFlush    time.Duration // the lagged regime's metering micro-batch [100ms]
	APIPoolSize int           // Postgres connections of the REST API in the exact regimes [4, tally serve's default]
	// RedisAddr of the Redis the central-counter row uses; "" skips it
	// [127.0.0.1:6379 — set by the command, not defaulted here].
	RedisAddr string
	Seed      uint64 // of the trace [1]
	// Regimes to run, by RegimeKeys [all]; they run in RegimeKeys's order.
	Regimes []string
	// Rounds runs every regime this many times, alternating (every regime
	// once, then again), over the same trace [1]. The report then adds
	// each regime's medians, and its p99 and CPU per request as multiples
	// of the Postgres counter's in the same round: a single replay's p99
	// moves with the machine's load.
	Rounds int
	Logger *slog.Logger
}

func (o *Options) defaults() {
	def := func(v *int, d int) {
		if *v == 0 {
			*v = d
		}
	}
	def(&o.Gateways, 10)
	def(&o.Customers, 100)
	def(&o.APIPoolSize, 4)
	def(&o.Rate, 2000)
	def(&o.Rounds, 1)
	if o.Duration == 0 {
		o.Duration = 6 * time.Second
	}
	if o.Limit == 0 {
		o.Limit = 500
	}
	if o.Burst == 0 {
		o.Burst = 4
	}
	if o.FixedGrant == 0 {
		o.FixedGrant = 50
	}
	if o.LagInterval == 0 {
		o.LagInterval = quota.DefaultInterval
	}
	if o.LagFlush == 0 {
		o.LagFlush = 100 * time.Millisecond
	}
	if o.Seed == 0 {
		o.Seed = 1
	}
	if o.Logger == nil {
		o.Logger = slog.New(slog.DiscardHandler)
	}
}

// warmUp is the start of the replay that steady figures leave out (every
// customer's first grants, new budget rows, new connections).
func (o Options) warmUp() time.Duration { return o.Duration / 6 }

// Validate reports every problem of o (after defaults) at once.
func (o Options) Validate() error {
	o.defaults()
	var errs []error
	bad := func(format string, args ...any) { errs = append(errs, fmt.Errorf(format, args...)) }
	if o.DatabaseURL == "" {
		bad("admissionbench: DatabaseURL is required")
	}
	if o.Gateways < 1 || o.Gateways > 200 {
		bad("gateways: %d must be 1 to 200", o.Gateways)
	}
	if o.Customers < 1 || o.Customers > 10_000 {
		bad("customers: %d must be 1 to 10000", o.Customers)
	}
	if o.Rate < 1 {
		bad("rate: %d must be positive", o.Rate)
	}
	if o.Duration < time.Second {
		bad("duration: %s must be at least 1s", o.Duration)
	}
	if o.Limit < 1 {
		bad("limit: %d must be positive", o.Limit)
	}
	if !(o.Skew >= 0) || math.IsInf(o.Skew, 1) { // NaN and Inf too
		bad("skew: %g must be a number, 0 or more", o.Skew)
	}
	if !(o.Burst >= 1 && o.Burst <= 5) { // NaN too
		bad("burst: %g must be 1 to 5 (bursts take a fifth of the time)", o.Burst)
	}
	if o.FixedGrant < 1 {
		bad("fixed-grant: %d must be positive", o.FixedGrant)
	}
	if o.Rounds < 1 || o.Rounds > 20 {
		bad("rounds: %d must be 1 to 20", o.Rounds)
	}
	for _, k := range o.Regimes {
		if !slices.Contains(RegimeKeys, k) {
			bad("regimes: %q is not one of %s", k, strings.Join(RegimeKeys, ", "))
		}
	}
	if o.Lookahead < 0 || o.LagInterval < 0 || o.LagFlush < 0 {
		bad("lookahead, lag-interval and lag-flush must not be negative")
	}
	return errors.Join(errs...)
}

// Row is one regime's figures.
type Row struct {
	Key     string // one of RegimeKeys
	Regime  string
	Round   int    // 1 to Options.Rounds
	Skipped string // why the regime did not run; empty when it ran
	// Requests = Admitted + Refused + Errors.
	Requests, Admitted, Refused, Errors int64
	// WorstAdmitted is the highest admitted ÷ limit over customers, as
	// admitted units of that customer.
	WorstAdmitted int64
	OverLimit     int64 // Σ max(0, admitted − limit) over customers
	Stranded      int64 // granted, unspent when the replay ended
	FalseDenials  int64
	// Below95 counts requests made while the customer's demand so far was
	// at most 95% of the limit; Below95False the false denials among them.
	Below95, Below95False int64
	// CentralCalls: every call to a central service; GrantCalls: those
	// that asked for capacity (grant requests, counter calls).
	CentralCalls, GrantCalls int64
	// Steady*: from the end of a warm-up (a sixth of the replay) to the
	// end of the replay, before the period's end.
	SteadyCalls, SteadyGrantCalls, SteadyAdmitted int64
	CallDetail                                    string // what the central calls were, where known
	P50, P99                                      time.Duration
	// SteadyP99: of the admissions sent after the warm-up (every
	// customer's first grants, new budget rows, new connections).
	SteadyP99 time.Duration
	// DecisionLag (lagged only): from the admission that reached a
	// customer's limit to the decision that blocks it, p50 and p99.
	DecisionLag [2]time.Duration
	Elapsed     time.Duration // of the replay
	// CPUBusy is the time the host's Cores spent busy during the replay
	// (0 where /proc/stat is not there): gateways, API and Postgres.
	CPUBusy time.Duration
	Cores   int
	// CPUProcess is this process's part of CPUBusy (0 where unknown): the
	// gateways' SDK, the API and the benchmark's loop; the rest is mostly
	// Postgres.
	CPUProcess time.Duration
	// Problems: invariant checks that failed (e.g. spend not reported).
	Problems []string
}

// Result is a run's figures.
type Result struct {
	Options  Options
	Requests int64 // per regime: the trace's length
	// Customers by the trace's demand over the period against the limit.
	Over, Near, Below int // demand > limit, 95–100%, ≤ 95%
	// Firsts: requests that are their customer's first at their gateway
	// (under grants each waits for a grant request: a gateway holds
	// nothing for a customer it has not seen); FirstsSteady: those after
	// the warm-up, of Steady requests.
	Firsts, FirstsSteady, Steady int64
	Rows                         []Row
}

// system is one regime: how a gateway admits, and what it leaves at the end.
type system interface {
	admit(ctx context.Context, gateway int, customer int, cost int64) (bool, error)
	// calls: central calls so far, and those of them that asked for
	// capacity (grant requests; every call of a central counter).
	calls() (all, grant int64)
	// end runs when the replay is over, with what each customer was
	// admitted: it returns what is stranded and stops the regime (releasing
	// what it holds); problems are invariant checks that failed.
	end(ctx context.Context, admitted []int64) (stranded int64, problems []string, err error)
}

// regime builds a system over its own budgets.
type regime struct {
	key, name string
	start     func(ctx context.Context, o Options) (system, error)
}

// errSkip marks a regime that cannot run here (no Redis); its message says why.
type errSkip struct{ why string }

func (e errSkip) Error() string { return e.why }

// Run replays one trace under every regime, one after another, and returns
// their figures.
func Run(ctx context.Context, o Options) (Result, error) {
	if err := o.Validate(); err != nil {
		return Result{}, err
	}
	o.defaults()
	tr := newTrace(o)
	res := Result{Options: o, Requests: tr.requests, Firsts: tr.firsts, FirstsSteady: tr.firstsSteady, Steady: tr.steady}
	for _, d := range tr.demand {
		switch {
		case d > o.Limit:
			res.Over++
		case d*100 > o.Limit*95:
			res.Near++
		default:
			res.Below++
		}
	}
	for round := 1; round <= o.Rounds; round++ {
		for _, r := range regimes() {
			if len(o.Regimes) > 0 && !slices.Contains(o.Regimes, r.key) {
				continue
			}
			o.Logger.Info("admission bench: regime", "regime", r.name, "round", round)
			sys, err := r.start(ctx, o)
			var skip errSkip
			if errors.As(err, &skip) {
				res.Rows = append(res.Rows, Row{Key: r.key, Regime: r.name, Round: round, Skipped: skip.why})
				continue
			}
			if err != nil {
				return res, fmt.Errorf("%s: %w", r.name, err)
			}
			row, err := replay(ctx, o, tr, sys)
			row.Key, row.Regime, row.Round = r.key, r.name, round
			if err != nil {
				return res, fmt.Errorf("%s: %w", r.name, err)
			}
			res.Rows = append(res.Rows, row)
		}
	}
	return res, nil
}

// replay drives sys with the trace in real time, one goroutine per gateway
// (a request is sent at its time, or at once when the gateway is behind),
// and counts.
func replay(ctx context.Context, o Options, tr trace, sys system) (Row, error) {
	offered := make([]atomic.Int64, o.Customers)
	admitted := make([]atomic.Int64, o.Customers)
	inflight := make([]atomic.Int64, o.Customers)
	var row Row
	var adm, ref, errs, falseDen, below, belowFalse atomic.Int64
	lat := make([][]time.Duration, o.Gateways)
	steadyLat := make([][]time.Duration, o.Gateways)
	var firstErr error
	var errOnce sync.Once
	busy0, _, cpuOK := machineCPU()
	proc0 := pgcpu.Process() // the gateways' SDK, the API and this loop
	start := time.Now()
	// Steady demand (§10): calls and admissions from the end of a warm-up
	// (the first grants) to the end of the replay (before the releases of
	// the period's end).
	warm := o.warmUp()
	var warmCalls, warmGrant, warmAdm atomic.Int64
	warmed := make(chan struct{})
	go func() {
		defer close(warmed)
		select {
		case <-time.After(warm):
			warmAdm.Store(adm.Load())
			all, grant := sys.calls()
			warmCalls.Store(all)
			warmGrant.Store(grant)
		case <-ctx.Done():
		}
	}()
	var wg sync.WaitGroup
	for g := range o.Gateways {
		wg.Go(func() {
			l := make([]time.Duration, 0, len(tr.gateways[g]))
			var ls []time.Duration
			for _, a := range tr.gateways[g] {
				if ctx.Err() != nil {
					return
				}
				if d := a.at - time.Since(start); d > 0 {
					time.Sleep(d)
				}
				c := int(a.customer)
				isBelow := offered[c].Add(a.cost)*100 <= o.Limit*95
				inflight[c].Add(a.cost)
				t0 := time.Now()
				ok, err := sys.admit(ctx, g, c, a.cost)
				took := time.Since(t0)
				l = append(l, took)
				if t0.Sub(start) >= warm {
					ls = append(ls, took)
				}
				if isBelow {
					below.Add(1)
				}
				switch {
				case err != nil:
					errs.Add(1)
					errOnce.Do(func() { firstErr = err })
				case ok:
					admitted[c].Add(a.cost)
					adm.Add(1)
				default:
					ref.Add(1)
					// Requests in flight elsewhere count as admitted (read
					// before admitted, so one that lands meanwhile counts
					// twice, never zero times): a refusal is false only if
					// there was room even so.
					if inflight[c].Load()+admitted[c].Load() <= o.Limit {
						falseDen.Add(1)
						if isBelow {
							belowFalse.Add(1)
						}
					}
				}
				inflight[c].Add(-a.cost)
			}
			lat[g], steadyLat[g] = l, ls
		})
	}
	wg.Wait()
	<-warmed
	row.Elapsed = time.Since(start)
	if busy1, cores, ok := machineCPU(); ok && cpuOK {
		row.CPUBusy, row.Cores = busy1-busy0, cores
		if proc0 > 0 {
			row.CPUProcess = pgcpu.Process() - proc0
		}
	}
	calls, grant := sys.calls()
	row.SteadyCalls, row.SteadyGrantCalls = calls-warmCalls.Load(), grant-warmGrant.Load()
	row.SteadyAdmitted = adm.Load() - warmAdm.Load()
	if err := ctx.Err(); err != nil {
		_, _, _ = sys.end(context.WithoutCancel(ctx), make([]int64, o.Customers))
		return row, err
	}
	final := make([]int64, o.Customers)
	for c := range final {
		final[c] = admitted[c].Load()
		row.WorstAdmitted = max(row.WorstAdmitted, final[c]) // one limit for all: the highest ratio
		row.OverLimit += max(0, final[c]-o.Limit)
	}
	stranded, problems, err := sys.end(ctx, final)
	if err != nil {
		return row, err
	}
	row.Stranded, row.Problems = stranded, problems
	row.CentralCalls, row.GrantCalls = sys.calls()
	row.Requests, row.Admitted, row.Refused, row.Errors = tr.requests, adm.Load(), ref.Load(), errs.Load()
	row.FalseDenials, row.Below95, row.Below95False = falseDen.Load(), below.Load(), belowFalse.Load()
	if row.Errors > 0 {
		row.Problems = append(row.Problems, fmt.Sprintf("%d admissions failed, the first: %v", row.Errors, firstErr))
	}
	if sum := row.Admitted + row.Refused + row.Errors; sum != row.Requests {
		row.Problems = append(row.Problems, fmt.Sprintf("admitted + refused + failed = %d, not the %d requests sent", sum, row.Requests))
	}
	all := slices.Concat(lat...)
	slices.Sort(all)
	row.P50, row.P99 = pct(all, 0.50), pct(all, 0.99)
	steady := slices.Concat(steadyLat...)
	slices.Sort(steady)
	row.SteadyP99 = pct(steady, 0.99)
	if lr, ok := sys.(interface{ lag() [2]time.Duration }); ok {
		row.DecisionLag = lr.lag()
	}
	if d, ok := sys.(interface{ detail() string }); ok {
		row.CallDetail = d.detail()
	}
	return row, nil
}

// pct is the p-th quantile of sorted ds (nearest rank).
func pct(ds []time.Duration, p float64) time.Duration {
	if len(ds) == 0 {
		return 0
	}
	i := int(float64(len(ds))*p+0.5) - 1
	return ds[min(max(i, 0), len(ds)-1)]
}
