package console

import (
	"context"
	"crypto/rand"
	"embed"
	"errors"
	"fmt"
	"html/template"
	"io/fs"
	"log/slog"
	"math"
	"net/http"
	"net/url"
	"strings"
	"time"

	"github.com/go-chi/chi/v5"
	"github.com/go-chi/chi/v5/middleware"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/tally-ledger/tally/api"
	"github.com/tally-ledger/tally/ingest"
	"github.com/tally-ledger/tally/internal/ratelimit"
	"github.com/tally-ledger/tally/periods"
)

// Prefix is where the console is served.
const Prefix = "/console"

// Config configures the console. Zero values take the documented defaults.
type Config struct {
	// API is the REST API of the same process: tokens, usage and replay
	// go through it. Required.
	API *api.API
	// Pool is read through ingest, periods, quota, reconcile and
	// admission. Required (the API's pool is a fine choice).
	Pool *pgxpool.Pool
	// Topic is the ingest topic shown on the overview. Default
	// ingest.DefaultTopic. Use the API's.
	Topic string
	// Grace is the period grace, as the API's. Default periods.DefaultGrace;
	// periods.NoGrace for none.
	Grace time.Duration
	// Clock is now. Default time.Now. Use the API's.
	Clock func() time.Time
	// Logger receives errors. Default: discard.
	Logger *slog.Logger
	// Registerer receives the console's metrics. Default: none.
	Registerer prometheus.Registerer
	// SessionTTL is how long a session lasts after sign-in. Default 8h.
	SessionTTL time.Duration
	// MaxSessions bounds the sessions kept. When it is full of sessions
	// that have not expired, a sign-in is refused (503): one token's
	// sign-ins never end another's sessions. Default 10000.
	MaxSessions int
	// MaxSessionsPerToken bounds one token's sessions; its next sign-in
	// ends its own oldest. Default 20.
	MaxSessionsPerToken int
	// SignInsPerToken and SignInsPerAddress limit sign-in attempts per
	// minute (bursts of as many) with one token, right or wrong, and from
	// one client address (as the API counts addresses); beyond, the
	// sign-in is answered 429 with Retry-After. Only forms that pass the
	// CSRF check count. Default 10 and 30; negative: off; NaN and ±Inf
	// are refused.
	SignInsPerToken   float64
	SignInsPerAddress float64
	// RequestTimeout bounds the work of one page. Default 10s.
	RequestTimeout time.Duration
	// SecureCookies marks the cookies Secure on every request, not only
	// on those that arrived over TLS: set it when a proxy in front
	// terminates TLS.
	SecureCookies bool
}

// Validate reports every missing or wrong setting at once.
func (c Config) Validate() error {
	var errs []error
	if c.API == nil {
		errs = append(errs, errors.New("console: API is required"))
	}
	if c.Pool == nil {
		errs = append(errs, errors.New("console: Pool is required"))
	}
	if c.SessionTTL < 0 || c.MaxSessions < 0 || c.MaxSessionsPerToken < 0 || c.RequestTimeout < 0 {
		errs = append(errs, errors.New("console: SessionTTL, MaxSessions, MaxSessionsPerToken and RequestTimeout must not be negative"))
	}
	for _, rate := range []struct {
		name string
		v    float64
	}{{"SignInsPerToken", c.SignInsPerToken}, {"SignInsPerAddress", c.SignInsPerAddress}} {
		if math.IsNaN(rate.v) || math.IsInf(rate.v, 0) {
			errs = append(errs, fmt.Errorf("console: %s is %v; it must be a finite number of sign-ins per minute (0: the default, negative: off)", rate.name, rate.v))
		}
	}
	return errors.Join(errs...)
}

//go:embed templates/*.html
var templateFS embed.FS

//go:embed assets
var assetFS embed.FS

// Console serves the web console under Prefix.
type Console struct {
	api      *api.API
	pool     *pgxpool.Pool
	topic    string
	grace    time.Duration
	now      func() time.Time
	log      *slog.Logger
	timeout  time.Duration
	secure   bool // cookies Secure on every request
	sessions *sessions
	// csrfKey signs the sign-in form's CSRF values: the server chooses
	// them, and a value it did not issue is refused.
	csrfKey [32]byte
	// signInTokens and signInAddrs limit sign-ins (nil: off).
	signInTokens, signInAddrs *ratelimit.Limits
	pages                     map[string]*template.Template
	metrics                   metrics
	handler                   http.Handler
}

// New returns the console.
func New(cfg Config) (*Console, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	c := &Console{api: cfg.API, pool: cfg.Pool, topic: cfg.Topic, grace: cfg.Grace, now: cfg.Clock,
		log: cfg.Logger, timeout: cfg.RequestTimeout, secure: cfg.SecureCookies}
	if c.topic == "" {
		c.topic = ingest.DefaultTopic
	}
	if c.grace == 0 {
		c.grace = periods.DefaultGrace
	}
	if c.now == nil {
		c.now = time.Now
	}
	if c.log == nil {
		c.log = slog.New(slog.DiscardHandler)
	}
	if c.timeout == 0 {
		c.timeout = 10 * time.Second
	}
	ttl, maxSessions := cfg.SessionTTL, cfg.MaxSessions
	if ttl == 0 {
		ttl = 8 * time.Hour
	}
	if maxSessions == 0 {
		maxSessions = 10000
	}
	perToken := cfg.MaxSessionsPerToken
	if perToken == 0 {
		perToken = 20
	}
	c.sessions = newSessions(ttl, maxSessions, perToken)
	_, _ = rand.Read(c.csrfKey[:]) // never fails (crypto/rand)
	perMinute := func(n, def float64) *ratelimit.Limits {
		if n == 0 {
			n = def
		}
		return ratelimit.New(n/60, int(math.Ceil(n)), 100_000)
	}
	c.signInTokens = perMinute(cfg.SignInsPerToken, 10)
	c.signInAddrs = perMinute(cfg.SignInsPerAddress, 30)
	var err error
	if c.pages, err = parsePages(); err != nil {
		return nil, err
	}
	c.metrics = newMetrics(cfg.Registerer)
	c.handler = c.routes()
	return c, nil
}

// ServeHTTP serves requests under Prefix (mount it at Prefix + "/").
func (c *Console) ServeHTTP(w http.ResponseWriter, r *http.Request) { c.handler.ServeHTTP(w, r) }

func (c *Console) routes() http.Handler {
	r := chi.NewRouter()
	r.Use(secureHeaders, c.limits, homeWithSlash)
	r.NotFound(c.notFound)
	r.MethodNotAllowed(func(w http.ResponseWriter, r *http.Request) {
		if len(api.AllowMethods(w, r)) == 0 {
			c.notFound(w, r) // a method chi does not know, on no page
			return
		}
		c.render(w, r, http.StatusMethodNotAllowed, "error", errorPage{Title: "Method not allowed", Detail: "This page does not take that request."})
	})
	r.Route(Prefix, func(r chi.Router) {
		// GetHead answers HEAD as GET, without the body (net/http drops
		// it): monitors and link checkers ask with HEAD. It is used here,
		// not on the outer router: there HEAD /console/ did not reach its
		// GET route and was refused 405.
		r.Use(middleware.GetHead)
		r.Get("/assets/*", c.asset)
		r.Get("/sign-in", c.signInPage)
		r.Post("/sign-in", c.signIn)
		r.Group(func(r chi.Router) {
			r.Use(c.authenticate)
			r.Post("/sign-out", c.page(c.signOut))
			r.Get("/", c.page(c.overview))
			r.Get("/customers", c.page(c.customers))
			r.Get("/customers/{customer}", c.page(c.customer))
			r.Get("/customers/{customer}/periods/{period}", c.page(c.statement))
			r.Get("/reconciliations", c.page(c.reconciliations))
			r.Get("/reconciliations/{id}", c.page(c.reconciliation))
			r.Get("/dead-letters", c.page(c.deadLetters))
			r.Get("/dead-letters/{id}", c.page(c.deadLetter))
			r.Post("/dead-letters/{id}/replay", c.page(c.replay))
			r.Get("/alerts", c.page(c.alerts))
		})
	})
	return r
}

// pageCosts is what a page costs against the viewer's per-token limit:
// about the reads it makes, so that a page costs what the REST requests
// for the same answers would. Pages not named cost 1.
var pageCosts = map[string]int{
	Prefix + "/":                     5,  // ingest status, dead letters, runs, leader, customers
	Prefix + "/customers/{customer}": 10, // customer, usage, quotas and each rule's history, periods, grants, budgets
	Prefix + "/customers/{customer}/periods/{period}": 2,
	Prefix + "/reconciliations/{id}":                  2,
}

// pageCost is r's page's cost (r is routed).
func pageCost(r *http.Request) int {
	if rc := chi.RouteContext(r.Context()); rc != nil {
		if n, ok := pageCosts[rc.RoutePattern()]; ok {
			return n
		}
	}
	return 1
}

// contentSecurityPolicy allows the console's own stylesheet and forms,
// and nothing else: no script of any kind, nothing from another host, no
// framing.
const contentSecurityPolicy = "default-src 'none'; style-src 'self'; img-src 'self'; form-action 'self'; " +
	"frame-ancestors 'none'; base-uri 'none'"

func secureHeaders(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		h := w.Header()
		h.Set("Content-Security-Policy", contentSecurityPolicy)
		h.Set("X-Content-Type-Options", "nosniff")
		h.Set("X-Frame-Options", "DENY")
		// same-origin, not no-referrer: with no-referrer a browser sends
		// "Origin: null" on the console's own forms.
		h.Set("Referrer-Policy", "same-origin")
		h.Set("Cache-Control", "no-store")
		next.ServeHTTP(w, r)
	})
}

// homeWithSlash sends Prefix itself to Prefix + "/": the session cookie's
// path is Prefix + "/", which a browser does not send for Prefix, so a
// signed-in viewer who typed /console was sent to sign in again, and
// again after signing in.
func homeWithSlash(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path != Prefix {
			next.ServeHTTP(w, r)
			return
		}
		u := url.URL{Path: Prefix + "/", RawQuery: r.URL.RawQuery}
		http.Redirect(w, r, u.String(), http.StatusMovedPermanently)
	})
}

func (c *Console) notFound(w http.ResponseWriter, r *http.Request) {
	c.render(w, r, http.StatusNotFound, "error", errorPage{Title: "Not found", Detail: "There is no console page at this address."})
}

// assets are the stylesheet and the icon.
var assets, _ = fs.Sub(assetFS, "assets")

// asset serves one asset by its name. Anything else under assets/, the
// directory itself included, is the console's 404 page: the directory's
// files are never listed.
func (c *Console) asset(w http.ResponseWriter, r *http.Request) {
	name := chi.URLParam(r, "*")
	if st, err := fs.Stat(assets, name); err != nil || st.IsDir() { // "", "./", "x/" are not valid names
		c.notFound(w, r)
		return
	}
	w.Header().Set("Cache-Control", "public, max-age=300")
	http.ServeFileFS(w, r, assets, name)
}

// maxForm bounds a form body: the largest is sign-in's (a token).
const maxForm = 8 << 10

func (c *Console) limits(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		r.Body = http.MaxBytesReader(w, r.Body, maxForm)
		ctx, cancel := context.WithTimeout(r.Context(), c.timeout)
		defer cancel()
		next.ServeHTTP(w, r.WithContext(ctx))
	})
}

// metrics are the console's Prometheus metrics.
type metrics struct {
	signIns *prometheus.CounterVec // by outcome
	replays *prometheus.CounterVec // by outcome
}

func newMetrics(reg prometheus.Registerer) metrics {
	m := metrics{
		signIns: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "tally_console_sign_ins_total",
			Help: "Console sign-ins by outcome (admin, customer, refused, csrf, limited: over a sign-in limit, full: no room for a session)."}, []string{"outcome"}),
		replays: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "tally_console_replays_total",
			Help: "Dead-letter replays from the console by outcome (replayed, refused_again, error)."}, []string{"outcome"}),
	}
	if reg != nil {
		reg.MustRegister(m.signIns, m.replays)
	}
	return m
}

// Beside serves the console under Prefix, behind the API's guard (access
// log, metrics, rate limits), and everything else with next (the REST
// API), leaving next's paths exactly as they are. The console's headers
// are set outside the guard: its refusals (429, 408, 413, 503) and a
// recovered panic's 500 are console responses too.
func (c *Console) Beside(next http.Handler) http.Handler {
	guarded := secureHeaders(c.api.Guard(Prefix, c))
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path == Prefix || strings.HasPrefix(r.URL.Path, Prefix+"/") {
			guarded.ServeHTTP(w, r)
			return
		}
		next.ServeHTTP(w, r)
	})
}
