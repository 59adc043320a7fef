package cli

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"runtime"
	"strconv"
	"strings"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	"github.com/spf13/cobra"
	"github.com/spf13/pflag"
	"golang.org/x/sync/errgroup"

	"github.com/tally-ledger/tally/admission"
	"github.com/tally-ledger/tally/api"
	"github.com/tally-ledger/tally/console"
	"github.com/tally-ledger/tally/ingest"
	"github.com/tally-ledger/tally/internal/notify"
	"github.com/tally-ledger/tally/ledger"
	"github.com/tally-ledger/tally/migrations"
	"github.com/tally-ledger/tally/periods"
	"github.com/tally-ledger/tally/quota"
)

const defaultListen = "127.0.0.1:8080"

// checkAdminToken refuses an admin token the REST API would refuse, as a
// usage error, before anything starts: found by the API itself, after
// Postgres, Kafka and the enforcer started, the one line that says what to
// change was lost among their shutdown lines. hint, when set, is added.
func checkAdminToken(token, hint string) error {
	if len(token) >= api.MinAdminTokenLength {
		return nil
	}
	if hint != "" {
		hint = "; " + hint
	}
	return usageError(fmt.Errorf("the REST API needs an admin token of at least %d characters in TALLY_ADMIN_TOKEN (try: export TALLY_ADMIN_TOKEN=$(openssl rand -hex 32))%s",
		api.MinAdminTokenLength, hint))
}

func newServeCmd() *cobra.Command {
	var (
		o                             runOptions
		dbURL, brokers                string
		runIngest, runAPI, runEnforce bool
		noConsole, consoleSecure      bool
		sizes                         poolSizes
		limits                        apiLimits
	)
	cmd := &cobra.Command{
		Use:   "serve [--ingest] [--api] [--enforce]",
		Short: "Run Tally's long-running parts against a real Kafka and Postgres",
		Long: `Run the Kafka ingest, the REST API and the quota enforcer against
TALLY_KAFKA_BROKERS and TALLY_DATABASE_URL. With none of --ingest, --api,
--enforce, all three run.

  --ingest   consume meter batches from --topic into the ledger. Several
             processes with the same --group share the topic's partitions
             (leases in Postgres, a fair share each; one that dies pauses
             only its own partitions: within a second when its process
             died, about --session-timeout when its host or link did).
  --api      serve the REST API on --listen (needs TALLY_ADMIN_TOKEN), and
             the web console at /console/ (sign in with a token; see
             docs/console.md) unless --no-console.
  --enforce  evaluate quota rules and publish decisions to
             --decisions-topic; one process publishes at a time (a lease).
             The leader also evaluates alert rules, and every --enforce
             process delivers their events (--alerts-topic, webhooks).

serve never migrates: it refuses to start when the schema is behind (run
tally migrate first). /metrics (admin token with --api), /healthz and
/readyz are served on --listen by every process; /readyz answers 503 with
what it is not ready for (database down, no partition leases yet, stalled
partitions). SIGINT/SIGTERM finish or roll back in-flight work, release the
partition leases and the enforcer lease; a second signal ends the process
at once.`,
		Example: `  TALLY_ADMIN_TOKEN=$(openssl rand -hex 32) tally serve
  tally serve --ingest --group tally-ingest        # one of several ingest processes`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			ctx := cmd.Context()
			flags := cmd.Flags()
			if !flags.Changed("ingest") && !flags.Changed("api") && !flags.Changed("enforce") {
				runIngest, runAPI, runEnforce = true, true, true
			}
			o.ingest, o.api, o.enforce = runIngest, runAPI, runEnforce
			o.noConsole, o.consoleSecure = noConsole, consoleSecure
			if !o.ingest && !o.api && !o.enforce {
				return usageError(errors.New("nothing to run: give --ingest, --api or --enforce (or none of them for all three)"))
			}
			if err := periods.ValidateGrace(o.grace); err != nil {
				return usageError(err)
			}
			if err := admission.ValidateMaxSkew(o.maxSkew); err != nil {
				return usageError(fmt.Errorf("--grant-max-skew (TALLY_GRANT_MAX_SKEW): %w", err))
			}
			if o.api {
				if err := checkAdminToken(o.adminToken, ""); err != nil {
					return err
				}
			}
			var brokersErr error
			if o.ingest || o.enforce {
				o.brokers, brokersErr = parseBrokers(brokers, brokersFlag)
			}
			if err := errors.Join(brokersErr, checkServeFlags(o, limits)); err != nil {
				return usageError(err)
			}
			o.log = newLogger()
			pools, err := openPools(ctx, dbURL, o, sizes)
			if err != nil {
				return err
			}
			defer pools.close()
			if err := checkSchema(ctx, pools.any()); err != nil {
				return err
			}
			o.pool, o.apiPool, o.enforcePool = pools.ingest, pools.api, pools.enforce
			limits.addressRate, limits.tokenRate = flagRate(limits.addressRate), flagRate(limits.tokenRate)
			limits.gatewayRate = flagRate(limits.gatewayRate)
			if limits.addressBodies == 0 {
				limits.addressBodies = -1 // 0 on the command line: no bound
			}
			o.apiLimits = limits
			return run(ctx, o)
		},
	}
	f := cmd.Flags()
	f.BoolVar(&runIngest, "ingest", false, "run the Kafka ingest")
	f.BoolVar(&runAPI, "api", false, "run the REST API")
	f.BoolVar(&runEnforce, "enforce", false, "run the quota enforcer")
	f.BoolVar(&noConsole, "no-console", false, "with the API: do not serve the web console at /console/")
	envDefault(f, "no-console", "TALLY_NO_CONSOLE")
	f.BoolVar(&consoleSecure, "console-secure-cookies", false, "mark the console's cookies Secure on plain HTTP too (a proxy in front terminates TLS)")
	envDefault(f, "console-secure-cookies", "TALLY_CONSOLE_SECURE_COOKIES")
	f.StringVar(&dbURL, "database-url", defaultDatabaseURL, "Postgres connection URL")
	envDefault(f, "database-url", "TALLY_DATABASE_URL")
	addBrokersFlag(f, &brokers, "for --ingest and --enforce")
	f.StringVar(&o.topic, "topic", ingest.DefaultTopic, "topic of metering batches")
	envDefault(f, "topic", "TALLY_TOPIC")
	f.StringVar(&o.decisionsTopic, "decisions-topic", defaultDecisionsTopic, "topic the quota enforcer publishes decisions to")
	envDefault(f, "decisions-topic", "TALLY_DECISIONS_TOPIC")
	f.StringVar(&o.group, "group", ingest.DefaultGroup, "ingest processes of one group share the topic's partitions (also the Kafka group offsets are committed to, for lag dashboards)")
	envDefault(f, "group", "TALLY_GROUP")
	f.StringVar(&o.listen, "listen", defaultListen, "address of the HTTP listener (API, /metrics, /healthz)")
	envDefault(f, "listen", "TALLY_LISTEN")
	f.StringVar(&o.adminToken, "admin-token", "", "the REST API's admin token (at least 32 characters); prefer the environment variable")
	envDefault(f, "admin-token", "TALLY_ADMIN_TOKEN")
	f.DurationVar(&o.grace, "grace", periods.DefaultGrace, "how long after its end a period takes late usage")
	envDefault(f, "grace", "TALLY_GRACE")
	f.IntVar(&sizes.ingest, "ingest-pool-size", defaultIngestPoolSize(), "Postgres connections of the ingest (its own pool: API load never takes them)")
	envDefault(f, "ingest-pool-size", "TALLY_INGEST_POOL_SIZE")
	f.IntVar(&sizes.api, "api-pool-size", 4, "Postgres connections of the REST API (its own pool)")
	envDefault(f, "api-pool-size", "TALLY_API_POOL_SIZE")
	f.IntVar(&sizes.enforce, "enforce-pool-size", 2, "Postgres connections of the quota enforcer (its own pool)")
	envDefault(f, "enforce-pool-size", "TALLY_ENFORCE_POOL_SIZE")
	f.IntVar(&limits.maxInFlight, "api-max-in-flight", 64, "requests the API serves at once, at least 1; more are answered 503 with Retry-After")
	envDefault(f, "api-max-in-flight", "TALLY_API_MAX_IN_FLIGHT")
	f.Float64Var(&limits.addressRate, "api-rate-per-address", 100, "requests per second from one client address, 0 or more, bursts of twice that (429 beyond; 0: off, e.g. behind a proxy)")
	envDefault(f, "api-rate-per-address", "TALLY_API_RATE_PER_ADDRESS")
	f.Float64Var(&limits.tokenRate, "api-rate-per-token", 20, "requests per second with one customer token, 0 or more, bursts of twice that (429 beyond; 0: off)")
	envDefault(f, "api-rate-per-token", "TALLY_API_RATE_PER_TOKEN")
	f.Float64Var(&limits.gatewayRate, "api-rate-per-gateway", 500, "requests per second with one gateway token, 0 or more, bursts of twice that (429 beyond; 0: off); "+
		"sized for the grant protocol: about one request a second per busy budget a gateway serves")
	envDefault(f, "api-rate-per-gateway", "TALLY_API_RATE_PER_GATEWAY")
	f.IntVar(&limits.addressBodies, "api-bodies-per-address", 8, "request bodies one client address may be sending at once, 0 or more (429 beyond; 0: no bound); "+
		"the admin token and known gateway tokens are not counted")
	envDefault(f, "api-bodies-per-address", "TALLY_API_BODIES_PER_ADDRESS")
	f.DurationVar(&limits.bodyTimeout, "api-body-timeout", 5*time.Second, "time a request body may take to arrive (408 beyond); bodies are read before a request takes an in-flight slot")
	envDefault(f, "api-body-timeout", "TALLY_API_BODY_TIMEOUT")
	addGroupTimingFlags(f, &o.timings)
	f.DurationVar(&o.unownedAfter, "ready-unowned-after", api.DefaultUnownedAfter,
		"/readyz of the API answers 503 while an ingest partition has had no live owner this long (negative: never)")
	envDefault(f, "ready-unowned-after", "TALLY_READY_UNOWNED_AFTER")
	addMaxSkewFlag(f, &o.maxSkew)
	addAlertFlags(f, &o.alerts)
	// Never print a token in --help.
	if fl := f.Lookup("admin-token"); fl.DefValue != "" {
		fl.DefValue = "(set)"
	}
	return cmd
}

const defaultDecisionsTopic = "tally.quota-decisions"

// checkServeFlags refuses, naming the flags, what the components o runs
// would refuse only once started, by the names of their Go fields, or
// would take for their own defaults (a timing of 0).
func checkServeFlags(o runOptions, limits apiLimits) error {
	var errs []error
	if o.ingest {
		hb, st := o.timings.heartbeat, o.timings.session
		if st <= 0 {
			errs = append(errs, fmt.Errorf("--session-timeout (TALLY_SESSION_TIMEOUT) must be positive, got %s", st))
		}
		if hb <= 0 {
			errs = append(errs, fmt.Errorf("--heartbeat-interval (TALLY_HEARTBEAT_INTERVAL) must be positive, got %s", hb))
		}
		if hb > 0 && st > 0 && 2*hb > st {
			// A half survives one lost renewal without an eviction.
			errs = append(errs, fmt.Errorf("--heartbeat-interval (TALLY_HEARTBEAT_INTERVAL) %s must be at most half of --session-timeout (TALLY_SESSION_TIMEOUT) %s", hb, st))
		}
	}
	if o.api && limits.bodyTimeout <= 0 {
		errs = append(errs, fmt.Errorf("--api-body-timeout (TALLY_API_BODY_TIMEOUT) must be positive, got %s", limits.bodyTimeout))
	}
	// api.Config takes 0 for its default and a negative value for no
	// bound: neither is what a careful operator means by 0 or -1 here.
	if o.api && limits.maxInFlight < 1 {
		errs = append(errs, fmt.Errorf("--api-max-in-flight (TALLY_API_MAX_IN_FLIGHT) must be at least 1, got %d", limits.maxInFlight))
	}
	if o.api && limits.addressBodies < 0 {
		errs = append(errs, fmt.Errorf("--api-bodies-per-address (TALLY_API_BODIES_PER_ADDRESS) must be 0 (no bound) or more, got %d", limits.addressBodies))
	}
	for _, r := range []struct {
		flag, env string
		v         float64
	}{
		{"api-rate-per-address", "TALLY_API_RATE_PER_ADDRESS", limits.addressRate},
		{"api-rate-per-token", "TALLY_API_RATE_PER_TOKEN", limits.tokenRate},
		{"api-rate-per-gateway", "TALLY_API_RATE_PER_GATEWAY", limits.gatewayRate},
	} {
		// A negative rate is off for api.Config, and a float flag takes
		// NaN and Inf.
		if o.api && !finiteNonNegative(r.v) {
			errs = append(errs, fmt.Errorf("--%s (%s) must be a number of requests per second, 0 (off) or more, got %v", r.flag, r.env, r.v))
		}
	}
	return errors.Join(errs...)
}

// defaultKafkaPort is the port of a broker given as a bare host: Kafka's,
// 9092. A variable only so that a test can stand a broker of its own
// there without taking the machine's 9092.
var defaultKafkaPort = "9092"

// addBrokersFlag adds --kafka-brokers (TALLY_KAFKA_BROKERS), read with
// parseBrokers; use says what for, when not every part of the command
// needs brokers. Set but empty, the variable names no broker.
func addBrokersFlag(f *pflag.FlagSet, brokers *string, use string) {
	usage := "Kafka bootstrap brokers, comma-separated host:port or host (port " + defaultKafkaPort + ")"
	if use != "" {
		usage += ", " + use
	}
	f.StringVar(brokers, "kafka-brokers", "127.0.0.1:"+defaultKafkaPort, usage)
	envDefaultMayBeEmpty(f, "kafka-brokers", "TALLY_KAFKA_BROKERS")
}

// brokersFlag names --kafka-brokers and its variable in parseBrokers's
// errors.
const brokersFlag = "--kafka-brokers (TALLY_KAFKA_BROKERS)"

// parseBrokers reads the Kafka brokers of every command (--kafka-brokers,
// TALLY_KAFKA_BROKERS), named name in its errors: a comma-separated list
// of at least one broker, each host:port with a port from 1 to 65535, or a
// bare host at the default port (as kafka-go dials one). It returns each
// as host:port.
func parseBrokers(s, name string) ([]string, error) {
	bs := splitBrokers(s)
	if len(bs) == 0 {
		return nil, fmt.Errorf("%s names no broker: give host:port or host, comma-separated", name)
	}
	for i, b := range bs {
		host, port, err := net.SplitHostPort(b)
		if err != nil {
			host, port, err = net.SplitHostPort(b + ":" + defaultKafkaPort)
		}
		if err != nil || host == "" {
			return nil, fmt.Errorf("%s names %q, which is not a host:port or a host", name, b)
		}
		if n, err := strconv.Atoi(port); err != nil || n < 1 || n > 65535 {
			return nil, fmt.Errorf("%s names %q, whose port is not a number from 1 to 65535", name, b)
		}
		bs[i] = net.JoinHostPort(host, port)
	}
	return bs, nil
}

// splitBrokers splits a comma-separated list of brokers, leaving out empty
// ones.
func splitBrokers(s string) []string {
	var out []string
	for _, b := range strings.Split(s, ",") {
		if b = strings.TrimSpace(b); b != "" {
			out = append(out, b)
		}
	}
	return out
}

// checkSchema refuses a database whose schema is older than this binary.
func checkSchema(ctx context.Context, pool *pgxpool.Pool) error {
	current, latest, err := migrations.Status(ctx, pool)
	if err != nil {
		return fmt.Errorf("database schema: %w", err)
	}
	if current < latest {
		return fmt.Errorf("database schema is at version %d, this binary needs %d: run `tally migrate` first", current, latest)
	}
	return nil
}

// poolSizes are the connections of each component's pool. Each component
// has its own (a bulkhead): a flood of API requests waits for the API's
// connections and never for those that apply usage or publish decisions.
type poolSizes struct{ ingest, api, enforce int }

func defaultIngestPoolSize() int { return max(4, runtime.NumCPU()) } // pgxpool's own default

type pools struct{ ingest, api, enforce *pgxpool.Pool }

// openPools opens one pool per component o runs, each with its size and an
// application_name (tally-ingest, tally-api, tally-enforce: pg_stat_activity
// shows whose a connection is) unless the URL names one.
func openPools(ctx context.Context, dbURL string, o runOptions, sizes poolSizes) (p *pools, err error) {
	p = &pools{}
	defer func() {
		if err != nil {
			p.close()
		}
	}()
	open := func(name string, size int) (*pgxpool.Pool, error) {
		if size < 1 {
			return nil, usageError(fmt.Errorf("--%s-pool-size must be at least 1, got %d", name, size))
		}
		cfg, err := pgxpool.ParseConfig(dbURL)
		if err != nil {
			return nil, fmt.Errorf("database: %w", err)
		}
		cfg.MaxConns = int32(size)
		cfg.MinConns = 0
		if _, ok := cfg.ConnConfig.RuntimeParams["application_name"]; !ok {
			cfg.ConnConfig.RuntimeParams["application_name"] = "tally-" + name
		}
		pool, err := pgxpool.NewWithConfig(ctx, cfg)
		if err != nil {
			return nil, fmt.Errorf("database: %w", err)
		}
		return pool, nil
	}
	if o.ingest {
		if p.ingest, err = open("ingest", sizes.ingest); err != nil {
			return p, err
		}
	}
	if o.api {
		if p.api, err = open("api", sizes.api); err != nil {
			return p, err
		}
	}
	if o.enforce {
		if p.enforce, err = open("enforce", sizes.enforce); err != nil {
			return p, err
		}
	}
	return p, nil
}

func (p *pools) any() *pgxpool.Pool {
	for _, pool := range []*pgxpool.Pool{p.ingest, p.api, p.enforce} {
		if pool != nil {
			return pool
		}
	}
	return nil
}

func (p *pools) close() {
	for _, pool := range []*pgxpool.Pool{p.ingest, p.api, p.enforce} {
		if pool != nil {
			pool.Close()
		}
	}
}

// apiLimits are the API's overload answers, as in api.Config: zero values
// take its defaults, a negative rate is off.
type apiLimits struct {
	maxInFlight                         int
	addressRate, tokenRate, gatewayRate float64
	addressBodies                       int
	bodyTimeout                         time.Duration
}

// addMaxSkewFlag adds --grant-max-skew (serve and dev).
func addMaxSkewFlag(f *pflag.FlagSet, d *time.Duration) {
	f.DurationVar(d, "grant-max-skew", admission.DefaultMaxSkew,
		fmt.Sprintf("clock skew tolerated between Tally and a gateway: a grant is reclaimed at valid_until plus this, never earlier (%s to %s)",
			admission.MinMaxSkew, admission.MaxMaxSkew))
	envDefault(f, "grant-max-skew", "TALLY_GRANT_MAX_SKEW")
}

// runOptions says what run starts.
type runOptions struct {
	pool                  *pgxpool.Pool
	brokers               []string
	topic, decisionsTopic string
	group                 string
	listen                string // "" for no HTTP listener
	adminToken            string
	grace                 time.Duration
	timings               groupTimings
	unownedAfter          time.Duration
	maxSkew               time.Duration // of grants; 0: admission.DefaultMaxSkew
	ingest, api, enforce  bool
	noConsole             bool // with api: no web console at /console/
	consoleSecure         bool // the console's cookies are Secure on plain HTTP too (TLS ends at a proxy)
	log                   *slog.Logger
	// ready, when set, is called once the HTTP listener is bound.
	ready func(addr string)
	// also runs beside the components (tally dev's simulated producers).
	also func(ctx context.Context) error

	// pool is the ingest's; apiPool and enforcePool, when nil, are pool
	// too (tally dev runs everything on one).
	apiPool, enforcePool *pgxpool.Pool
	apiLimits            apiLimits
	alerts               alertOptions
}

// run runs the chosen components and the HTTP listener until ctx ends or
// one of them fails; then it stops the others gracefully.
func run(ctx context.Context, o runOptions) error {
	if o.topic == "" {
		o.topic = ingest.DefaultTopic
	}
	if o.decisionsTopic == "" {
		o.decisionsTopic = defaultDecisionsTopic
	}
	if o.group == "" {
		o.group = ingest.DefaultGroup
	}
	if o.apiPool == nil {
		o.apiPool = o.pool
	}
	if o.enforcePool == nil {
		o.enforcePool = o.pool
	}
	reg := prometheus.NewRegistry()
	reg.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	l, err := ledger.New(ledger.Config{Logger: o.log, Registerer: reg})
	if err != nil {
		return err
	}
	g, gctx := errgroup.WithContext(ctx)
	// The HTTP server stops after also has returned: tally dev's demo
	// gateways give their grants back through the API as they stop.
	alsoDone := make(chan struct{})
	if o.also == nil {
		close(alsoDone)
	}

	var readyChecks []func() []string // what /readyz reports beside Postgres
	if o.ingest {
		c, err := ingest.NewConsumer(ingest.Config{
			Brokers: o.brokers, Topic: o.topic, Group: o.group,
			Pool: o.pool, Ledger: l, Logger: o.log, Registry: reg,
			HeartbeatInterval: o.timings.heartbeat, SessionTimeout: o.timings.session,
		})
		if err != nil {
			return err
		}
		readyChecks = append(readyChecks, c.NotReady)
		g.Go(func() error { return c.Run(gctx) })
	}
	// What the API's usage listener wakes when it runs in this process: the
	// quota enforcer, so decisions follow new usage of every meter kind at
	// once (docs/design.md §5, §16), and the alert evaluator.
	var woken []notify.Subscriber
	if o.enforce {
		enf, err := quota.NewEnforcer(quota.Config{
			Pool: o.enforcePool, Brokers: o.brokers, Topic: o.decisionsTopic, IngestTopic: o.topic,
			Logger: o.log, Registerer: reg,
		})
		if err != nil {
			return err
		}
		g.Go(func() error { return enf.Run(gctx) })
		woken = append(woken, enf.Subscriber())
		alertEval, err := startAlerts(gctx, g, o, enf, reg)
		if err != nil {
			return err
		}
		if alertEval != nil {
			woken = append(woken, alertEval.Subscriber())
		}
	}
	if o.listen != "" {
		var handler http.Handler
		if o.api {
			h, err := api.New(api.Config{Pool: o.apiPool, Ledger: l, AdminToken: o.adminToken, Grace: periods.GraceSetting(o.grace),
				Topic: o.topic, Logger: o.log, Registry: reg,
				MaxInFlight: o.apiLimits.maxInFlight, AddressRate: o.apiLimits.addressRate, TokenRate: o.apiLimits.tokenRate,
				GatewayRate: o.apiLimits.gatewayRate, AddressBodies: o.apiLimits.addressBodies, BodyTimeout: o.apiLimits.bodyTimeout,
				UnownedAfter: o.unownedAfter, MaxSkew: o.maxSkew, ReadyChecks: readyChecks,
				WebhookAllowPrivate: o.alerts.allowPrivate, Subscribers: woken})
			if err != nil {
				return err
			}
			g.Go(func() error { return h.Run(gctx) }) // keeps the usage cache coherent
			handler = h
			if !o.noConsole {
				con, err := console.New(console.Config{API: h, Pool: o.apiPool, Topic: o.topic, Grace: periods.GraceSetting(o.grace),
					Logger: o.log, Registerer: reg, SecureCookies: o.consoleSecure})
				if err != nil {
					return err
				}
				handler = con.Beside(h)
			}
		} else {
			// Without the API there is no token to guard /metrics with: it
			// is served as usual for Prometheus; bind --listen accordingly.
			mux := http.NewServeMux()
			mux.Handle("GET /metrics", promhttp.HandlerFor(reg, promhttp.HandlerOpts{Registry: reg}))
			mux.HandleFunc("GET /healthz", func(w http.ResponseWriter, _ *http.Request) {
				w.Header().Set("Content-Type", "text/plain; charset=utf-8")
				_, _ = io.WriteString(w, "ok\n")
			})
			readyPool := o.pool
			if !o.ingest {
				readyPool = o.enforcePool
			}
			mux.Handle("GET /readyz", api.ReadyHandler(readyPool, o.log, readyChecks...))
			handler = mux
		}
		ln, err := net.Listen("tcp", o.listen)
		if err != nil {
			return fmt.Errorf("listen %s: %w", o.listen, err)
		}
		srv := api.NewServer(ln.Addr().String(), handler)
		// Requests outlive the components' context by the drain at most:
		// a request still running then (a synchronous reconciliation run)
		// is cancelled and ends as its code ends a cancelled one, while
		// the pools are still open, rather than being cut off by them.
		reqCtx, cancelRequests := context.WithCancel(context.WithoutCancel(ctx))
		defer cancelRequests()
		srv.BaseContext = func(net.Listener) context.Context { return reqCtx }
		g.Go(func() error {
			if err := srv.Serve(ln); !errors.Is(err, http.ErrServerClosed) {
				return fmt.Errorf("http: %w", err)
			}
			return nil
		})
		g.Go(func() error {
			<-gctx.Done()
			<-alsoDone
			sctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), httpDrain)
			defer cancel()
			err := srv.Shutdown(sctx)
			cancelRequests()
			if !errors.Is(err, context.DeadlineExceeded) {
				return err
			}
			o.log.Warn("http: requests still running after the drain were cancelled", "drain", httpDrain)
			sctx, cancel = context.WithTimeout(context.WithoutCancel(ctx), httpCancelled)
			defer cancel()
			if err := srv.Shutdown(sctx); err != nil {
				return fmt.Errorf("http: requests still running %v after they were cancelled: %w", httpCancelled, err)
			}
			return nil
		})
		o.log.Info("listening", "addr", ln.Addr().String(), "api", o.api)
		if o.ready != nil {
			o.ready(ln.Addr().String())
		}
	} else if o.ready != nil {
		o.ready("")
	}
	if o.also != nil {
		g.Go(func() error {
			defer close(alsoDone)
			return o.also(gctx)
		})
	}
	return g.Wait()
}

// httpDrain is how long a stopping process lets requests in flight
// finish; httpCancelled how long it then waits for the cancelled ones.
const (
	httpDrain     = 10 * time.Second
	httpCancelled = 5 * time.Second
)

// flagRate maps a rate flag, where 0 is off, to api.Config, where off is
// negative and 0 the default.
func flagRate(r float64) float64 {
	if r == 0 {
		return -1
	}
	return r
}

// groupTimings are the ingest members' lease timings (zero: ingest's
// defaults).
type groupTimings struct {
	heartbeat, session time.Duration
}

func addGroupTimingFlags(f *pflag.FlagSet, t *groupTimings) {
	f.DurationVar(&t.session, "session-timeout", ingest.DefaultSessionTimeout,
		"ingest: a member's lease in Postgres; a dead process's partitions move at once (its session ends with it), a dead host's or cut link's once the lease runs out")
	envDefault(f, "session-timeout", "TALLY_SESSION_TIMEOUT")
	f.DurationVar(&t.heartbeat, "heartbeat-interval", ingest.DefaultHeartbeatInterval,
		"ingest: how often a member renews its lease and rebalances partitions (at most half of --session-timeout)")
	envDefault(f, "heartbeat-interval", "TALLY_HEARTBEAT_INTERVAL")
	// Accepted and ignored, so that a deployment that still passes them
	// starts during an upgrade: they were timings of the Kafka consumer
	// group, which ingest no longer joins.
	var ignored time.Duration
	for _, name := range []string{"rebalance-timeout", "join-group-backoff"} {
		f.DurationVar(&ignored, name, 0, "ignored")
		_ = f.MarkDeprecated(name, "ingest shares partitions through leases in Postgres, not a Kafka consumer group; the flag is ignored")
	}
}
