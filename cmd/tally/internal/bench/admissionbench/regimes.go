package admissionbench

import (
	"cmp"
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/redis/go-redis/v9"
	"github.com/shopspring/decimal"

	"github.com/tally-ledger/tally/admission"
	"github.com/tally-ledger/tally/admit"
	"github.com/tally-ledger/tally/api"
	"github.com/tally-ledger/tally/ledger"
	"github.com/tally-ledger/tally/quota"
	"github.com/tally-ledger/tally/tokens"
)

const meter = "requests"

// RegimeKeys name the regimes, in the order they run.
var RegimeKeys = []string{"lagged", "fixed", "sized", "postgres", "postgres-http", "redis"}

func regimes() []regime {
	return []regime{
		{"lagged", "lagged decisions", startLagged},
		{"fixed", "exact, fixed grant", func(ctx context.Context, o Options) (system, error) { return startGrants(ctx, o, true) }},
		{"sized", "exact, sized by demand", func(ctx context.Context, o Options) (system, error) { return startGrants(ctx, o, false) }},
		{"postgres", "central counter, Postgres", startPostgresCounter},
		{"postgres-http", "central counter, Postgres via HTTP", startHTTPCounter},
		{"redis", "central counter, Redis", startRedisCounter},
	}
}

// runID keeps the budgets, holders and keys of one run apart from any other
// run's in the same database or Redis.
func runID() string {
	b := make([]byte, 4)
	_, _ = rand.Read(b)
	return hex.EncodeToString(b)
}

// lagged is today's path: admit unless the latest decision says exceeded.
type lagged struct {
	o         Options
	pool      *pgxpool.Pool
	pending   []atomic.Int64 // admitted, not yet metered
	metered   []atomic.Int64 // admitted so far (the gateways' own count)
	crossedAt []atomic.Int64 // unix nanos of the admission that reached the limit
	exceeded  []atomic.Bool  // the decision the gateways hold
	evals     atomic.Int64
	stop      context.CancelFunc
	wg        sync.WaitGroup
	mu        sync.Mutex
	lags      []time.Duration
	loopErr   error
}

func startLagged(ctx context.Context, o Options) (system, error) {
	pool, err := pgxpool.New(ctx, o.DatabaseURL)
	if err != nil {
		return nil, err
	}
	for _, q := range []string{qUsageTable, qUsageClear} {
		if _, err := pool.Exec(ctx, q); err != nil {
			pool.Close()
			return nil, fmt.Errorf("usage table: %w", err)
		}
	}
	l := &lagged{o: o, pool: pool, pending: make([]atomic.Int64, o.Customers), metered: make([]atomic.Int64, o.Customers),
		crossedAt: make([]atomic.Int64, o.Customers), exceeded: make([]atomic.Bool, o.Customers)}
	lctx, cancel := context.WithCancel(context.WithoutCancel(ctx))
	l.stop = cancel
	l.wg.Go(func() { l.every(lctx, o.LagFlush, l.flush) })
	l.wg.Go(func() { l.every(lctx, o.LagInterval, l.decide) })
	return l, nil
}

func (l *lagged) admit(_ context.Context, _ int, c int, cost int64) (bool, error) {
	if l.exceeded[c].Load() {
		return false, nil
	}
	if n := l.metered[c].Add(cost); n >= l.o.Limit && n-cost < l.o.Limit {
		l.crossedAt[c].Store(time.Now().UnixNano())
	}
	l.pending[c].Add(cost)
	return true, nil
}

func (l *lagged) every(ctx context.Context, d time.Duration, f func(context.Context) error) {
	t := time.NewTicker(d)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
			if err := f(ctx); err != nil && ctx.Err() == nil {
				l.mu.Lock()
				l.loopErr = errors.Join(l.loopErr, err)
				l.mu.Unlock()
				return
			}
		}
	}
}

// flush meters what was admitted since the last flush, in one statement.
func (l *lagged) flush(ctx context.Context) error {
	var customers []int32
	var deltas []int64
	for c := range l.pending {
		if d := l.pending[c].Swap(0); d > 0 {
			customers, deltas = append(customers, int32(c)), append(deltas, d)
		}
	}
	if len(customers) == 0 {
		return nil
	}
	_, err := l.pool.Exec(ctx, qUsageFlush, pgx.NamedArgs{"customers": customers, "deltas": deltas})
	return err
}

// decide is one evaluation of the decision loop: customers whose metered
// usage reached the limit are blocked from now on.
func (l *lagged) decide(ctx context.Context) error {
	l.evals.Add(1)
	rows, err := l.pool.Query(ctx, qUsageExceeded, pgx.NamedArgs{"limit": l.o.Limit})
	if err != nil {
		return err
	}
	over, err := pgx.CollectRows(rows, pgx.RowTo[int32])
	if err != nil {
		return err
	}
	now := time.Now()
	for _, c := range over {
		if !l.exceeded[c].Swap(true) {
			l.mu.Lock()
			l.lags = append(l.lags, now.Sub(time.Unix(0, l.crossedAt[c].Load())))
			l.mu.Unlock()
		}
	}
	return nil
}

func (l *lagged) calls() (int64, int64) { return l.evals.Load(), 0 }

func (l *lagged) end(_ context.Context, admitted []int64) (int64, []string, error) {
	l.stop()
	l.wg.Wait()
	l.pool.Close()
	var problems []string
	for c, a := range admitted {
		if m := l.metered[c].Load(); m != a {
			problems = append(problems, fmt.Sprintf("customer %d: metered %d, admitted %d", c, m, a))
		}
	}
	return 0, problems, l.loopErr
}

func (l *lagged) lag() [2]time.Duration {
	l.mu.Lock()
	defer l.mu.Unlock()
	s := slices.Clone(l.lags)
	slices.Sort(s)
	return [2]time.Duration{pct(s, 0.5), pct(s, 0.99)}
}

// apiServer is Tally's REST API over loopback, on pool, with an admin
// token of its own.
type apiServer struct {
	url, admin string
	reg        *prometheus.Registry // the API's metrics
	srv        *http.Server
	served     chan error
	stop       context.CancelFunc
	done       chan error
}

func serveAPI(ctx context.Context, pool *pgxpool.Pool, log *slog.Logger) (_ *apiServer, err error) {
	led, err := ledger.New(ledger.Config{Logger: log})
	if err != nil {
		return nil, err
	}
	s := &apiServer{admin: runID() + runID() + runID() + runID() + runID(), reg: prometheus.NewRegistry()}
	// Every gateway comes from 127.0.0.1 here: the per-address limit is off,
	// as behind a proxy.
	h, err := api.New(api.Config{Pool: pool, Ledger: led, AdminToken: s.admin,
		Logger: log, Registry: s.reg, AddressRate: -1, TokenRate: -1})
	if err != nil {
		return nil, err
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, err
	}
	actx, cancel := context.WithCancel(context.WithoutCancel(ctx))
	s.stop, s.done = cancel, make(chan error, 1)
	go func() { s.done <- h.Run(actx) }()
	s.url = "http://" + ln.Addr().String()
	s.srv, s.served = &http.Server{Handler: h, ReadHeaderTimeout: 5 * time.Second}, make(chan error, 1)
	go func() { s.served <- s.srv.Serve(ln) }()
	return s, nil
}

// newPool opens a pool of at most conns connections on url.
func newPool(ctx context.Context, url string, conns int) (*pgxpool.Pool, error) {
	cfg, err := pgxpool.ParseConfig(url)
	if err != nil {
		return nil, err
	}
	cfg.MaxConns = int32(conns)
	return pgxpool.NewWithConfig(ctx, cfg)
}

// close shuts the server down and stops the API's background work.
func (s *apiServer) close(ctx context.Context) {
	_ = s.srv.Shutdown(ctx)
	<-s.served
	s.stop()
	<-s.done
}

// grants is exact admission: the admit SDK in every gateway, against the
// REST API over loopback and the budgets in Postgres.
type grants struct {
	pool       *pgxpool.Pool
	api        *apiServer
	store      *admission.Store
	clients    []*admit.Client
	transports []*http.Transport
	requests   callCounts
	names      []string
	seen       []atomic.Bool // by gateway × customer: admitted there before
	// unreachable is, by customer, the cost of the requests on_unreachable
	// answered (Tally slower than MaxWait): a debit or grant they waited
	// for may have been taken all the same (docs/gateways-exact.md).
	unreachable []atomic.Int64
	dir         string
	// summary is detail's line, written by end once every gateway has
	// given its grants back and before the API's pool closes: the API's
	// registry reads Postgres when gathered.
	summary string
}

func startGrants(ctx context.Context, o Options, fixed bool) (_ system, err error) {
	g := &grants{}
	defer func() {
		if err != nil {
			_, _, _ = g.end(context.WithoutCancel(ctx), nil)
		}
	}()
	if g.pool, err = newPool(ctx, o.DatabaseURL, o.APIPoolSize); err != nil {
		return nil, err
	}
	if g.store, err = admission.New(g.pool, admission.Config{}); err != nil {
		return nil, err
	}
	if g.api, err = serveAPI(ctx, g.pool, o.Logger); err != nil {
		return nil, err
	}

	id := runID()
	kind := "sized"
	if fixed {
		kind = "fixed"
	}
	g.names, g.seen = make([]string, o.Customers), make([]atomic.Bool, o.Gateways*o.Customers)
	g.unreachable = make([]atomic.Int64, o.Customers)
	for c := range g.names {
		g.names[c] = fmt.Sprintf("%s-%s-c%04d", kind, id, c)
		if _, err := quota.PutRuleDB(ctx, g.pool, quota.RuleInput{Customer: g.names[c], Meter: meter,
			Limit: decimal.NewFromInt(o.Limit), Admission: quota.Exact, Actor: "tally bench admission"}); err != nil {
			return nil, fmt.Errorf("exact rule: %w", err)
		}
	}
	if g.dir, err = os.MkdirTemp("", "tally-bench-admission-"); err != nil {
		return nil, err
	}
	for i := range o.Gateways {
		holder := fmt.Sprintf("%s-%s-gw%02d", kind, id, i)
		_, token, err := tokens.CreateGateway(ctx, g.pool, holder, "tally bench admission", time.Now())
		if err != nil {
			return nil, fmt.Errorf("gateway token: %w", err)
		}
		tr := http.DefaultTransport.(*http.Transport).Clone()
		tr.MaxIdleConnsPerHost = 16
		g.transports = append(g.transports, tr)
		cfg := admit.Config{URL: g.api.url, Token: token, Holder: holder,
			Dir: filepath.Join(g.dir, holder), Logger: o.Logger,
			HTTPClient: &http.Client{Timeout: 5 * time.Second, Transport: counting{tr, &g.requests}}, MaxWait: o.MaxWait}
		if fixed {
			// Demand sizing off: every gateway takes grants of
			// FixedGrant units.
			cfg.MinGrant, cfg.Lookahead = o.FixedGrant, time.Nanosecond
		} else {
			cfg.Lookahead = o.Lookahead
		}
		c, err := admit.New(cfg)
		if err != nil {
			return nil, err
		}
		g.clients = append(g.clients, c)
	}
	return g, nil
}

// callCounts counts the HTTP requests gateways send to Tally, by kind.
type callCounts struct {
	all, issued, refused, renewed, released, bypasses atomic.Int64
	debited, debitRefused                             atomic.Int64
	mu                                                sync.Mutex
	grantLatency                                      []time.Duration // of POST /v1/grants, as the gateway saw it
	debitLatency                                      []time.Duration // of POST /v1/grants/debits
	admissions                                        []admitted      // every Admit, as the caller saw it
}

// admitted is one Admit: how it was decided and how long it took, and
// whether it was its customer's first at its gateway.
type admitted struct {
	how   admit.How
	took  time.Duration
	first bool
}

// counting is a gateway's transport, counting into n.
type counting struct {
	rt http.RoundTripper
	n  *callCounts
}

func (c counting) RoundTrip(r *http.Request) (*http.Response, error) {
	c.n.all.Add(1)
	t0 := time.Now()
	resp, err := c.rt.RoundTrip(r)
	if err != nil {
		return resp, err
	}
	p := r.URL.Path
	switch took := time.Since(t0); p {
	case "/v1/grants":
		c.n.mu.Lock()
		c.n.grantLatency = append(c.n.grantLatency, took)
		c.n.mu.Unlock()
	case debitPath:
		c.n.mu.Lock()
		c.n.debitLatency = append(c.n.debitLatency, took)
		c.n.mu.Unlock()
	}
	switch {
	case p == "/v1/grants" && resp.StatusCode == http.StatusCreated:
		c.n.issued.Add(1)
	case p == "/v1/grants" && resp.StatusCode == http.StatusConflict:
		c.n.refused.Add(1)
	case p == debitPath && resp.StatusCode == http.StatusCreated:
		c.n.debited.Add(1)
	case p == debitPath && resp.StatusCode == http.StatusConflict:
		c.n.debitRefused.Add(1)
	case strings.HasSuffix(p, "/renew"):
		c.n.renewed.Add(1)
	case strings.HasSuffix(p, "/release"):
		c.n.released.Add(1)
	case p == "/v1/bypasses":
		c.n.bypasses.Add(1)
	}
	return resp, err
}

func (g *grants) detail() string { return g.summary }

// describe is the regime's detail line, from the SDK's calls, the API's
// histograms and its pool.
func (g *grants) describe() string {
	n := &g.requests
	n.mu.Lock()
	lat, dlat := slices.Clone(n.grantLatency), slices.Clone(n.debitLatency)
	slow := tail(n.admissions)
	n.mu.Unlock()
	slices.Sort(lat)
	slices.Sort(dlat)
	// The API's pool: how often a request waited for one of its
	// connections, and for how long on average over every acquire.
	ps := g.pool.Stat()
	return fmt.Sprintf("%d calls: %d grants issued, %d refused (budget exhausted), %d debits taken, %d refused, %d renewals, %d releases, %d bypass reports; grant request p50 %s, p90 %s, p99 %s (mean %s, of which the API's handler %s); debit p50 %s, p90 %s, p99 %s (mean %s, the API's handler %s); %s; the API's %d connections: %d acquires, %d of them waited, %s per acquire on average; %s",
		n.all.Load(), n.issued.Load(), n.refused.Load(), n.debited.Load(), n.debitRefused.Load(), n.renewed.Load(), n.released.Load(), n.bypasses.Load(),
		dur(pct(lat, 0.5)), dur(pct(lat, 0.9)), dur(pct(lat, 0.99)), dur(mean(lat)), dur(handlerMean(g.api.reg, "tally_grant_issue_duration_seconds")),
		dur(pct(dlat, 0.5)), dur(pct(dlat, 0.9)), dur(pct(dlat, 0.99)), dur(mean(dlat)), dur(handlerMean(g.api.reg, "tally_debit_duration_seconds")),
		phases(g.api.reg),
		ps.MaxConns(), ps.AcquireCount(), ps.EmptyAcquireCount(), dur(ps.AcquireDuration()/time.Duration(max(ps.AcquireCount(), 1))), slow)
}

func (g *grants) admit(ctx context.Context, gw int, c int, cost int64) (bool, error) {
	t0 := time.Now()
	d, err := g.clients[gw].Admit(ctx, g.names[c], meter, cost)
	took := time.Since(t0)
	if d.Unreachable {
		g.unreachable[c].Add(cost)
	}
	first := !g.seen[gw*len(g.names)+c].Swap(true)
	n := &g.requests
	n.mu.Lock()
	n.admissions = append(n.admissions, admitted{d.How, took, first})
	n.mu.Unlock()
	return d.Admitted, err
}

// tail says how the admissions at or above their p99 were decided: what
// sets the p99. "grant" there is an Admit that waited for a grant request
// (one served from a grant held takes microseconds); "first" is the
// share of them that were their customer's first at their gateway (the
// rest waited for a top-up).
func tail(as []admitted) string {
	if len(as) == 0 {
		return "no admissions"
	}
	took := make([]time.Duration, len(as))
	for i, a := range as {
		took[i] = a.took
	}
	slices.Sort(took)
	p99 := pct(took, 0.99)
	by := map[admit.How]int{}
	n, first := 0, 0
	for _, a := range as {
		if a.took >= p99 {
			by[a.how]++
			n++
			if a.first && a.how == admit.FromGrant {
				first++
			}
		}
	}
	hows := slices.Collect(maps.Keys(by))
	slices.SortFunc(hows, func(a, b admit.How) int { return cmp.Or(by[b]-by[a], int(a)-int(b)) })
	parts := make([]string, len(hows))
	for i, h := range hows {
		parts[i] = fmt.Sprintf("%s %.0f%%", h, 100*float64(by[h])/float64(n))
		if h == admit.FromGrant {
			parts[i] += fmt.Sprintf(" (%.0f%% first at their gateway, %.0f%% top-ups)",
				100*float64(first)/float64(n), 100*float64(by[h]-first)/float64(n))
		}
	}
	return fmt.Sprintf("the %d admissions at or above the p99 (%s): %s", n, dur(p99), strings.Join(parts, ", "))
}

func mean(ds []time.Duration) time.Duration {
	if len(ds) == 0 {
		return 0
	}
	var sum time.Duration
	for _, d := range ds {
		sum += d
	}
	return sum / time.Duration(len(ds))
}

// handlerMean is the mean of the API's histogram name (seconds, over
// every label): how long its handlers took, without the HTTP round trip.
func handlerMean(reg *prometheus.Registry, name string) time.Duration {
	return histMean(reg, name, nil)
}

// histMean is the mean of the histogram name (seconds) over the series
// whose labels include every one of match.
func histMean(reg *prometheus.Registry, name string, match map[string]string) time.Duration {
	mfs, err := reg.Gather()
	if err != nil {
		return 0
	}
	var sum float64
	var n uint64
	for _, mf := range mfs {
		if mf.GetName() != name {
			continue
		}
	series:
		for _, m := range mf.GetMetric() {
			for _, l := range m.GetLabel() {
				if v, ok := match[l.GetName()]; ok && v != l.GetValue() {
					continue series
				}
			}
			sum += m.GetHistogram().GetSampleSum()
			n += m.GetHistogram().GetSampleCount()
		}
	}
	if n == 0 {
		return 0
	}
	return time.Duration(sum / float64(n) * float64(time.Second))
}

// phases says where, in Tally, the grant requests' and debits' time went
// on average (tally_admission_phase_seconds): planning, queueing for an
// issue transaction, waiting for a connection, the transaction.
func phases(reg *prometheus.Registry) string {
	at := func(path, phase string) string {
		return dur(histMean(reg, "tally_admission_phase_seconds", map[string]string{"path": path, "phase": phase}))
	}
	return fmt.Sprintf("in Tally, a grant request's mean plan %s, queue for an issue transaction %s, wait for a connection %s, transaction %s; a debit's plan %s, connection %s, transaction %s",
		at("grant", "plan"), at("grant", "queue"), at("grant", "connection"), at("grant", "postgres"),
		at("debit", "plan"), at("debit", "connection"), at("debit", "postgres"))
}

// debitPath is where a gateway sends debits.
const debitPath = "/v1/grants/debits"

func (g *grants) calls() (int64, int64) {
	n := &g.requests
	return n.all.Load(), n.issued.Load() + n.refused.Load() + n.debited.Load() + n.debitRefused.Load()
}

// consumed reads each customer's budget: consumed and live.
func (g *grants) consumed(ctx context.Context) (consumed, live []decimal.Decimal, err error) {
	consumed, live = make([]decimal.Decimal, len(g.names)), make([]decimal.Decimal, len(g.names))
	for c, name := range g.names {
		bs, err := g.store.Budgets(ctx, name)
		if err != nil {
			return nil, nil, err
		}
		for _, b := range bs { // newest period first
			if b.Meter == meter {
				consumed[c], live[c] = b.Consumed, b.Live
				break
			}
		}
	}
	return consumed, live, nil
}

// end reads what is stranded before the gateways release, then closes them
// (each releases its grants with their final spent) and checks that every
// unit admitted was reported spent and nothing else was kept.
func (g *grants) end(ctx context.Context, admitted []int64) (stranded int64, problems []string, err error) {
	if admitted != nil {
		var consumed []decimal.Decimal
		if consumed, _, err = g.consumed(ctx); err == nil {
			for c, v := range consumed {
				stranded += v.IntPart() - admitted[c]
			}
		}
	}
	cctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), time.Minute)
	defer cancel()
	for _, c := range g.clients {
		if cerr := c.Close(cctx); cerr != nil {
			err = errors.Join(err, cerr)
		}
	}
	if admitted != nil && err == nil {
		consumed, live, rerr := g.consumed(ctx)
		if rerr != nil {
			err = rerr
		}
		for c := range consumed {
			// Exact, except by what on_unreachable answered: a request
			// whose debit or grant came after MaxWait may have been taken
			// while it was refused (or admitted as a bypass, which draws
			// nothing), as a central counter's would be.
			slack := decimal.NewFromInt(g.unreachable[c].Load())
			if consumed[c].Sub(decimal.NewFromInt(admitted[c])).Abs().GreaterThan(slack) || live[c].GreaterThan(slack) {
				problems = append(problems, fmt.Sprintf("%s: after every release consumed %s (live %s), admitted %d (%s answered by on_unreachable)",
					g.names[c], consumed[c], live[c], admitted[c], slack))
			}
		}
	}
	if admitted != nil && g.api != nil {
		g.summary = g.describe()
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
	return stranded, problems, err
}

// pgCounter is a central counter in Postgres, one statement per request.
type pgCounter struct {
	pool  *pgxpool.Pool
	n     atomic.Int64
	limit int64
}

func startPostgresCounter(ctx context.Context, o Options) (system, error) {
	pool, err := newPool(ctx, o.DatabaseURL, o.Gateways) // a connection per gateway, as separate processes would have
	if err != nil {
		return nil, err
	}
	for _, q := range []string{qCounterTable, qCounterClear} {
		if _, err := pool.Exec(ctx, q); err != nil {
			pool.Close()
			return nil, fmt.Errorf("counter table: %w", err)
		}
	}
	if _, err := pool.Exec(ctx, qCounterFill, pgx.NamedArgs{"limit": o.Limit, "customers": o.Customers}); err != nil {
		pool.Close()
		return nil, fmt.Errorf("counter table: %w", err)
	}
	return &pgCounter{pool: pool, limit: o.Limit}, nil
}

func (p *pgCounter) admit(ctx context.Context, _ int, c int, cost int64) (bool, error) {
	p.n.Add(1)
	var used int64
	err := p.pool.QueryRow(ctx, qCounterTake, pgx.NamedArgs{"customer": c, "cost": cost}).Scan(&used)
	if errors.Is(err, pgx.ErrNoRows) {
		return false, nil
	}
	return err == nil, err
}

func (p *pgCounter) calls() (int64, int64) { n := p.n.Load(); return n, n }

func (p *pgCounter) end(ctx context.Context, admitted []int64) (int64, []string, error) {
	defer p.pool.Close()
	rows, err := p.pool.Query(ctx, qCounterUsed)
	if err != nil {
		return 0, nil, err
	}
	type cu struct{ Customer, Used int64 }
	used, err := pgx.CollectRows(rows, pgx.RowToStructByPos[cu])
	if err != nil {
		return 0, nil, err
	}
	var problems []string
	for _, u := range used {
		if u.Customer < int64(len(admitted)) && u.Used != admitted[u.Customer] {
			problems = append(problems, fmt.Sprintf("customer %d: counter %d, admitted %d", u.Customer, u.Used, admitted[u.Customer]))
		}
	}
	return 0, problems, nil
}

// redisCounter is a central counter in Redis, one script per request.
type redisCounter struct {
	client *redis.Client
	script *redis.Script
	keys   []string
	n      atomic.Int64
	limit  int64
}

func startRedisCounter(ctx context.Context, o Options) (system, error) {
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
	r := &redisCounter{client: client, script: redis.NewScript(redisTake), limit: o.Limit}
	id := runID()
	for c := range o.Customers {
		r.keys = append(r.keys, fmt.Sprintf("tally-bench-admission:%s:%d", id, c))
	}
	if err := r.script.Load(ctx, client).Err(); err != nil {
		_ = client.Close()
		return nil, err
	}
	return r, nil
}

func (r *redisCounter) admit(ctx context.Context, _ int, c int, cost int64) (bool, error) {
	r.n.Add(1)
	v, err := r.script.Run(ctx, r.client, r.keys[c:c+1], cost, r.limit).Int64()
	return err == nil && v >= 0, err
}

func (r *redisCounter) calls() (int64, int64) { n := r.n.Load(); return n, n }

func (r *redisCounter) end(ctx context.Context, admitted []int64) (int64, []string, error) {
	defer r.client.Close()
	var problems []string
	vals, err := r.client.MGet(ctx, r.keys...).Result()
	if err == nil {
		for c, v := range vals {
			var used int64
			if s, ok := v.(string); ok {
				_, _ = fmt.Sscan(s, &used)
			}
			if c < len(admitted) && used != admitted[c] {
				problems = append(problems, fmt.Sprintf("customer %d: counter %d, admitted %d", c, used, admitted[c]))
			}
		}
	}
	return 0, problems, errors.Join(err, r.client.Del(ctx, r.keys...).Err())
}
