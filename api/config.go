package api

import (
	"crypto/sha256"
	"errors"
	"fmt"
	"log/slog"
	"math"
	"net/http"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/tally-ledger/tally/admission"
	"github.com/tally-ledger/tally/ingest"
	"github.com/tally-ledger/tally/internal/notify"
	"github.com/tally-ledger/tally/internal/ratelimit"
	"github.com/tally-ledger/tally/internal/ttlcache"
	"github.com/tally-ledger/tally/ledger"
	"github.com/tally-ledger/tally/periods"
	"github.com/tally-ledger/tally/tokens"
)

// Config configures the API handler. Zero values take the documented defaults.
type Config struct {
	Pool   *pgxpool.Pool  // required
	Ledger *ledger.Ledger // required: adjustments go through it
	// AdminToken may do everything (TALLY_ADMIN_TOKEN). Required, at least
	// MinAdminTokenLength characters.
	AdminToken string
	// Grace is how long a period stays in grace after its end (docs/design.md §4);
	// periods.NoGrace for none.
	// Default periods.DefaultGrace (24h).
	Grace time.Duration
	// Clock is the API's notion of now (current period, lag, period state).
	// Default time.Now. Use the same clock as the Ledger.
	Clock func() time.Time
	// Logger receives access logs and errors. Default: discard.
	Logger *slog.Logger
	// Registry receives the HTTP metrics and is served at /metrics.
	// Default: a new registry of its own.
	Registry *prometheus.Registry
	// Topic is the ingest topic whose positions /v1/ingest/status reports
	// and usage's as_of and quota lag are read from (TALLY_TOPIC).
	// Default ingest.DefaultTopic.
	Topic string
	// MaxBodyBytes limits request bodies. Default 64 KiB.
	MaxBodyBytes int64
	// MaxQueryBytes limits the raw query string. Default 1 KiB.
	MaxQueryBytes int
	// RequestTimeout bounds the work of one request. Default 10s.
	RequestTimeout time.Duration
	// ReconcileTimeout bounds POST /v1/reconciliations, which runs a
	// reconciliation synchronously (and extends the connection's write
	// deadline to match). Large runs belong to `tally reconcile`.
	// Default 5m.
	ReconcileTimeout time.Duration
	// TokenCacheTTL is how long a process trusts a customer token it has
	// checked while it cannot hear revocations: a revoked token keeps
	// working for at most this long then. While API.Run listens, Postgres
	// notifies every revocation (migration 00007) and the process drops the
	// token at once; a checked token is then trusted for up to a minute,
	// while the listener is heard to keep up (internal/notify: a listener
	// that hangs or died silently is trusted for at most 5 s).
	// Default 5s; negative: check every request.
	TokenCacheTTL time.Duration
	// ScheduleCacheTTL is how long the usage endpoint reuses a customer's
	// calendar history. A calendar change is never effective sooner than
	// ledger.MaxClockSkew after it is made, so a TTL below that never
	// resolves a started period differently. Default 30s; negative: off.
	ScheduleCacheTTL time.Duration
	// UsageCacheTTL bounds how long a usage answer read from Postgres is
	// reused. Answers are kept coherent by Postgres's change notifications
	// while API.Run listens (see usage_watch.go): one is forgotten as soon
	// as a commit changes it, so this is only a safety net. Without Run (or
	// where LISTEN does not work, e.g. behind a transaction-pooling proxy)
	// every answer is read afresh.
	// Default 1m; negative: read Postgres on every request.
	UsageCacheTTL time.Duration
	// UnownedAfter: /readyz answers 503 while a partition of Topic has had
	// no live ingest owner (its owner crashed or stopped and no member has
	// claimed it) for at least this long; a crash's failover takes seconds,
	// so only a partition nobody consumes trips it. Default
	// DefaultUnownedAfter; negative: never.
	UnownedAfter time.Duration
	// ReadyChecks are what else this process runs (its ingest member): each
	// returns what it is not ready for, nil when ready; /readyz answers 503
	// with every sentence while any returns one.
	ReadyChecks []func() []string
	// UsageCacheBytes bounds the cache's memory (roughly: the encoded
	// answers); when full, customers chosen at random are dropped until
	// half is free. Default (0 or negative) 64 MiB; the cache itself is
	// turned off with a negative UsageCacheTTL.
	UsageCacheBytes int
	// MaxInFlight bounds the requests served at once (/healthz and /readyz
	// aside). One more is answered 503 with Retry-After at once rather than
	// queued, so a flood cannot pile up goroutines, memory and waits for
	// the pool. Default 64; negative: no bound.
	MaxInFlight int
	// AddressRate limits requests per second from one client address (the
	// connection's peer, never a header; IPv6 by /64), with bursts of
	// AddressBurst; a request over it is answered 429 with Retry-After
	// before any other work (the admin's and known gateways' excepted,
	// see AddressBodies). Behind a proxy every client shares the
	// proxy's address: raise it or turn it off there and limit at the
	// proxy. Default 100/s, burst 200; negative: off; NaN and ±Inf are
	// refused (as are TokenRate's and GatewayRate's).
	AddressRate  float64
	AddressBurst int
	// AddressRate and AddressBodies exist for floods of made-up tokens and
	// unauthenticated work (the console's sign-in): the admin token and
	// gateway tokens this process has verified are never refused by them
	// (a gateway fleet behind one address has its per-token limit).
	//
	// AddressBodies bounds the request bodies being received at once from
	// one client address (other than the admin's and known gateways'); one
	// more is answered 429 at once. Default 8; negative: no bound.
	AddressBodies int
	// BodyTimeout bounds the time a request body may take to arrive. Every
	// body is read whole (at most MaxBodyBytes) before the request takes
	// one of MaxInFlight's slots, so a client trickling its body holds no
	// slot; one not done in time is answered 408. Default 5s.
	BodyTimeout time.Duration
	// TokenRate limits requests per second with one customer token, with
	// bursts of TokenBurst (429 with Retry-After). The admin token is not
	// limited. Default 20/s, burst 40; negative: off.
	TokenRate  float64
	TokenBurst int
	// GatewayRate limits requests per second with one gateway token, with
	// bursts of GatewayBurst (429 with Retry-After), sized for the grant
	// protocol: the admit SDK asks for about one issue and one release per
	// budget per Lookahead (2 s) and one renew per half TTL, so a gateway
	// serving N busy budgets sends about N requests a second, and N at once
	// when it starts. Default 500/s, burst 1000; negative: off.
	GatewayRate  float64
	GatewayBurst int
	// MaxSkew is the clock skew tolerated between Tally and a gateway
	// holding a grant: a grant is reclaimed at valid_until + MaxSkew, never
	// earlier (docs/design.md §12). Default 5 s; between
	// admission.MinMaxSkew and admission.MaxMaxSkew.
	MaxSkew time.Duration
	// FailedTokenTTL is how long a well-formed customer token Postgres
	// does not know is refused without asking again (at most 100,000 are
	// remembered). Default 1m; negative: ask every time.
	FailedTokenTTL time.Duration
	// WebhookAllowPrivate accepts alert webhooks on loopback and private
	// addresses (TALLY_WEBHOOK_ALLOW_PRIVATE; docs/design.md §15).
	WebhookAllowPrivate bool
	// Subscribers are handed the notifications of the API's listening
	// connection too (the alert evaluator of the same process), so that a
	// process keeps one.
	Subscribers []notify.Subscriber
}

// DefaultUnownedAfter is Config.UnownedAfter's default.
const DefaultUnownedAfter = 30 * time.Second

// Validate reports every configuration problem at once.
func (c Config) Validate() error {
	var errs []error
	if c.Pool == nil {
		errs = append(errs, errors.New("api: Pool is required"))
	}
	if c.Ledger == nil {
		errs = append(errs, errors.New("api: Ledger is required"))
	}
	switch {
	case c.AdminToken == "":
		errs = append(errs, errors.New("api: an admin token is required (TALLY_ADMIN_TOKEN)"))
	case len(c.AdminToken) < MinAdminTokenLength:
		errs = append(errs, fmt.Errorf("api: the admin token must be at least %d characters (try: openssl rand -hex 32)", MinAdminTokenLength))
	}
	if err := periods.ValidateGrace(c.Grace); err != nil {
		errs = append(errs, fmt.Errorf("api: %w", err))
	}
	if c.ScheduleCacheTTL >= ledger.MaxClockSkew {
		errs = append(errs, fmt.Errorf("api: ScheduleCacheTTL %s must be below %s", c.ScheduleCacheTTL, ledger.MaxClockSkew))
	}
	if c.MaxSkew != 0 {
		if err := admission.ValidateMaxSkew(c.MaxSkew); err != nil {
			errs = append(errs, fmt.Errorf("api: MaxSkew: %w", err))
		}
	}
	for _, rate := range []struct {
		name string
		v    float64
	}{{"AddressRate", c.AddressRate}, {"TokenRate", c.TokenRate}, {"GatewayRate", c.GatewayRate}} {
		if math.IsNaN(rate.v) || math.IsInf(rate.v, 0) {
			errs = append(errs, fmt.Errorf("api: %s is %v; it must be a finite number of requests per second (0: the default, negative: off)", rate.name, rate.v))
		}
	}
	if c.AddressBurst < 0 || c.TokenBurst < 0 || c.GatewayBurst < 0 {
		errs = append(errs, errors.New("api: rate-limit bursts must not be negative"))
	}
	if c.MaxBodyBytes < 0 || c.MaxQueryBytes < 0 || c.RequestTimeout < 0 || c.ReconcileTimeout < 0 || c.BodyTimeout < 0 {
		errs = append(errs, errors.New("api: limits must not be negative"))
	}
	return errors.Join(errs...)
}

// API holds the handlers' dependencies.
type API struct {
	pool       *pgxpool.Pool
	ledger     *ledger.Ledger
	adminHash  [32]byte
	grace      time.Duration
	now        func() time.Time
	log        *slog.Logger
	registry   *prometheus.Registry
	maxBody    int64
	maxQuery   int
	reqTimeout time.Duration
	recTimeout time.Duration
	topic      string
	unowned    time.Duration // readyz: a partition without an owner this long; < 0 off
	readyAlso  []func() []string
	metrics    *httpMetrics
	tokens     *tokens.Store
	schedules  *ttlcache.Cache[string, cachedSchedule]
	watch      *usageWatch
	listener   *notify.Listener
	handler    http.Handler

	inFlight    chan struct{}     // nil: no bound
	addrLimits  *ratelimit.Limits // nil: off
	tokenLimits *ratelimit.Limits // nil: off
	// gatewayLimits is the per-token limit of gateway tokens; nil: off.
	gatewayLimits *ratelimit.Limits
	bodies        *addressBodies
	bodyTimeout   time.Duration
	ready         readyCache

	maxSkew time.Duration // of grants
	// webhookAllowPrivate: alert webhooks may be on private addresses.
	webhookAllowPrivate bool
	// grantMetrics counts the grant protocol's requests (exact admission).
	grantMetrics *admission.Metrics
	// admission is the one grant store: concurrent grant requests share
	// its transactions (admission.Store's combiner).
	admission *admission.Store
}

// ServeHTTP serves the API.
func (a *API) ServeHTTP(w http.ResponseWriter, r *http.Request) { a.handler.ServeHTTP(w, r) }

// New returns the API. Run it beside the HTTP server to use the usage
// cache.
func New(cfg Config) (*API, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	a := &API{
		pool: cfg.Pool, ledger: cfg.Ledger, adminHash: sha256.Sum256([]byte(cfg.AdminToken)),
		grace: cfg.Grace, now: cfg.Clock, log: cfg.Logger, registry: cfg.Registry,
		maxBody: cfg.MaxBodyBytes, maxQuery: cfg.MaxQueryBytes, reqTimeout: cfg.RequestTimeout,
		recTimeout: cfg.ReconcileTimeout, topic: cfg.Topic, unowned: cfg.UnownedAfter,
		maxSkew: cfg.MaxSkew, webhookAllowPrivate: cfg.WebhookAllowPrivate,
	}
	a.readyAlso = cfg.ReadyChecks
	if a.unowned == 0 {
		a.unowned = DefaultUnownedAfter
	}
	if a.topic == "" {
		a.topic = ingest.DefaultTopic
	}
	if a.recTimeout == 0 {
		a.recTimeout = 5 * time.Minute
	}
	if a.grace == 0 {
		a.grace = periods.DefaultGrace
	}
	if a.now == nil {
		a.now = time.Now
	}
	if a.log == nil {
		a.log = slog.New(slog.DiscardHandler)
	}
	if a.registry == nil {
		a.registry = prometheus.NewRegistry()
	}
	if a.maxBody == 0 {
		a.maxBody = 64 << 10
	}
	if a.maxQuery == 0 {
		a.maxQuery = 1 << 10
	}
	if a.reqTimeout == 0 {
		a.reqTimeout = 10 * time.Second
	}
	schedTTL, usageTTL := cfg.ScheduleCacheTTL, cfg.UsageCacheTTL
	if schedTTL == 0 {
		schedTTL = 30 * time.Second
	}
	a.schedules = ttlcache.New[string, cachedSchedule](schedTTL, 100_000)
	if usageTTL == 0 {
		usageTTL = time.Minute
	}
	usageBytes := cfg.UsageCacheBytes
	if usageBytes <= 0 {
		usageBytes = 64 << 20
	}
	if n := cfg.MaxInFlight; n >= 0 {
		if n == 0 {
			n = 64
		}
		a.inFlight = make(chan struct{}, n)
	}
	addrRate, addrBurst := orDefault(cfg.AddressRate, 100), cfg.AddressBurst
	if addrBurst == 0 {
		addrBurst = max(1, int(2*addrRate))
	}
	a.addrLimits = ratelimit.New(addrRate, addrBurst, 100_000)
	tokRate, tokBurst := orDefault(cfg.TokenRate, 20), cfg.TokenBurst
	if tokBurst == 0 {
		tokBurst = max(1, int(2*tokRate))
	}
	a.tokenLimits = ratelimit.New(tokRate, tokBurst, 100_000)
	gwRate, gwBurst := orDefault(cfg.GatewayRate, 500), cfg.GatewayBurst
	if gwBurst == 0 {
		gwBurst = max(1, int(2*gwRate))
	}
	a.gatewayLimits = ratelimit.New(gwRate, gwBurst, 100_000)
	a.bodies = &addressBodies{max: orDefault(cfg.AddressBodies, 8), m: map[string]int{}}
	a.bodyTimeout = orDefault(cfg.BodyTimeout, 5*time.Second)
	m, err := newHTTPMetrics(a.registry)
	if err != nil {
		return nil, err
	}
	a.metrics = m
	if a.grantMetrics, err = admission.NewMetrics(a.registry, a.pool, a.now, a.log); err != nil {
		return nil, err
	}
	a.listener = notify.New(notify.Config{Pool: a.pool, Channel: usageChannel,
		ApplicationName: "tally-api-usage-watch", Logger: a.log,
		OnState: func(up bool) {
			if up {
				m.usageWatchUp.Set(1)
			} else {
				m.usageWatchUp.Set(0)
			}
		},
		OnDropped:    m.usageWatchDropped.Inc,
		OnQueueUsage: m.notifyQueueUsage.Set,
	})
	a.tokens, err = tokens.New(tokens.Config{DB: a.pool, CacheTTL: cfg.TokenCacheTTL, FailedTTL: cfg.FailedTokenTTL,
		Listener: a.listener, OnCheck: func(c tokens.Check) { m.tokenChecks.WithLabelValues(string(c)).Inc() }})
	if err != nil {
		return nil, err
	}
	a.watch = newUsageWatch(a.topic, a.listener, usageTTL, usageBytes)
	a.listener.Subscribe(a.watch)
	for _, sub := range cfg.Subscribers {
		a.listener.Subscribe(sub)
	}
	if a.admission, err = admission.New(a.pool, admission.Config{Now: a.now, Logger: a.log, MaxSkew: a.maxSkew, Registerer: a.registry}); err != nil {
		return nil, err
	}
	a.handler = a.routes()
	return a, nil
}

// orDefault is v, or def when v is zero.
func orDefault[T comparable](v, def T) T {
	var zero T
	if v == zero {
		return def
	}
	return v
}
