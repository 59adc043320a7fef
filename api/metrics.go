package api

import (
	"log/slog"
	"net/http"
	"strconv"
	"strings"
	"time"

	"github.com/go-chi/chi/v5"
	"github.com/go-chi/chi/v5/middleware"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/tally-ledger/tally/tokens"
)

// httpMetrics are labelled from fixed sets only: route pattern (never the
// raw path, which holds customer ids), method (the standard ones, else
// "other") and status.
type httpMetrics struct {
	requests               *prometheus.CounterVec
	duration               *prometheus.HistogramVec
	usageHits, usageMisses prometheus.Counter
	usageWatchUp           prometheus.Gauge
	usageWatchDropped      prometheus.Counter
	notifyQueueUsage       prometheus.Gauge
	// shed counts requests answered 408/429/503 before any work, by
	// reason: address_rate, address_bodies, body_timeout, token_rate,
	// gateway_rate, in_flight.
	shed *prometheus.CounterVec
	// tokenChecks counts customer-token checks by where the answer came
	// from: malformed (no query), refused_cached, cached, queried.
	tokenChecks *prometheus.CounterVec
}

func newHTTPMetrics(reg *prometheus.Registry) (*httpMetrics, error) {
	m := &httpMetrics{
		requests: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "tally_http_requests_total",
			Help: "HTTP requests by route pattern, method and status.",
		}, []string{"route", "method", "status"}),
		duration: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name:    "tally_http_request_duration_seconds",
			Help:    "HTTP request latency by route pattern and method.",
			Buckets: []float64{.0005, .001, .0025, .005, .01, .025, .05, .1, .25, .5, 1, 2.5, 10},
		}, []string{"route", "method"}),
	}
	usage := prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "tally_api_usage_cache_total",
		Help: "Usage answers served from the process's cache (hit) or read from Postgres (miss).",
	}, []string{"result"})
	m.usageHits, m.usageMisses = usage.WithLabelValues("hit"), usage.WithLabelValues("miss")
	m.usageWatchUp = prometheus.NewGauge(prometheus.GaugeOpts{
		Name: "tally_api_usage_cache_up",
		Help: "1 while the usage cache hears Postgres's change notifications and may be used; 0 while every answer is read from Postgres.",
	})
	m.usageWatchDropped = prometheus.NewCounter(prometheus.CounterOpts{
		Name: "tally_api_usage_watch_dropped_total",
		Help: "Times the change listener fell behind (hung, or its connection died silently) and its connection was closed so Postgres's notification queue keeps draining.",
	})
	m.notifyQueueUsage = prometheus.NewGauge(prometheus.GaugeOpts{
		Name: "tally_postgres_notify_queue_usage",
		Help: "pg_notification_queue_usage(): the fraction of Postgres's notification queue in use (0 to 1). It grows while some listening connection does not read; near 1, commits that notify fail.",
	})
	m.shed = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "tally_http_shed_total",
		Help: "Requests answered at once instead of being served: 429 (address_rate, address_bodies: too many bodies arriving from one address, token_rate, gateway_rate), 408 (body_timeout: the body did not arrive in time) or 503 (in_flight).",
	}, []string{"reason"})
	m.tokenChecks = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "tally_api_token_checks_total",
		Help: "Customer-token checks by outcome: malformed (refused without a query), refused_cached (refused again without a query), cached, queried.",
	}, []string{"outcome"})
	for _, r := range []string{"address_rate", "address_bodies", "body_timeout", "token_rate", "gateway_rate", "in_flight"} {
		m.shed.WithLabelValues(r)
	}
	for _, o := range []tokens.Check{tokens.Malformed, tokens.RefusedCached, tokens.Cached, tokens.Queried} {
		m.tokenChecks.WithLabelValues(string(o))
	}
	for _, c := range []prometheus.Collector{m.requests, m.duration, usage, m.usageWatchUp, m.shed, m.tokenChecks, m.usageWatchDropped, m.notifyQueueUsage} {
		if err := reg.Register(c); err != nil {
			return nil, err
		}
	}
	return m, nil
}

// observe records metrics and writes one access log line per request, with
// the request id (also returned in the X-Request-Id header).
func (a *API) observe(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		start := time.Now()
		ww := middleware.NewWrapResponseWriter(w, r.ProtoMajor)
		id := middleware.GetReqID(r.Context())
		ww.Header().Set("X-Request-Id", id)
		defer func() {
			d := time.Since(start)
			status := ww.Status()
			if status == 0 {
				status = http.StatusOK
			}
			// The pattern is bounded (it never holds ids); a path no route
			// matched has none.
			route := "unmatched"
			if rctx := chi.RouteContext(r.Context()); rctx != nil && rctx.RoutePattern() != "" {
				route = rctx.RoutePattern()
			} else if l, ok := r.Context().Value(routeLabelKey{}).(string); ok {
				route = l // a guarded in-process handler (Guard)
			}
			method := methodLabel(r.Method)
			a.metrics.requests.WithLabelValues(route, method, strconv.Itoa(status)).Inc()
			a.metrics.duration.WithLabelValues(route, method).Observe(d.Seconds())
			level := slog.LevelInfo
			switch {
			case (status == http.StatusTooManyRequests || status == http.StatusServiceUnavailable) && ww.Header().Get("Retry-After") != "":
				// Shed by a rate limit or MaxInFlight: counted by
				// tally_http_shed_total; a line each at a higher level
				// would let a flood fill the logs.
				level = slog.LevelDebug
			case status >= 500:
				level = slog.LevelError
			case status < 400 && grantPath(route):
				// The grant path answers thousands a second (§12):
				// what it granted, renewed and released is in
				// tally_http_requests_total and the latency histogram;
				// a line each would be most of the log.
				level = slog.LevelDebug
			}
			attrs := []slog.Attr{
				slog.String("request_id", id),
				slog.String("method", method),
				slog.String("path", clip(r.URL.Path, logClip)),
				slog.String("route", route),
				slog.Int("status", status),
				slog.Int("bytes", ww.BytesWritten()),
				slog.Duration("duration", d),
				slog.String("remote", r.RemoteAddr),
			}
			if method != r.Method {
				attrs = append(attrs, slog.String("raw_method", quote(r.Method)))
			}
			if cid := clientRequestID(r); cid != "" {
				attrs = append(attrs, slog.String("client_request_id", cid))
			}
			a.log.LogAttrs(r.Context(), level, "http request", attrs...)
		}()
		next.ServeHTTP(ww, r)
	})
}

// grantPath reports whether route is one of a gateway's grant calls:
// issue, renew, release, and release of several grants.
func grantPath(route string) bool {
	return strings.HasPrefix(route, "/v1/grants")
}
