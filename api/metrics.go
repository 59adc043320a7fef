package api

import (
	"log/slog"
	"net/http"
	"strconv"
	"time"

	"github.com/go-chi/chi/v5"
	"github.com/go-chi/chi/v5/middleware"
	"github.com/prometheus/client_golang/prometheus"
)

// httpMetrics are labelled by route pattern (never by raw path, which holds
// customer ids and would be unbounded), method and status.
type httpMetrics struct {
	requests               *prometheus.CounterVec
	duration               *prometheus.HistogramVec
	usageHits, usageMisses prometheus.Counter
	usageWatchUp           prometheus.Gauge
	usageWatchDropped      prometheus.Counter
	notifyQueueUsage       prometheus.Gauge
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
	for _, c := range []prometheus.Collector{m.requests, m.duration, usage, m.usageWatchUp, m.usageWatchDropped, m.notifyQueueUsage} {
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
			}
			a.metrics.requests.WithLabelValues(route, r.Method, strconv.Itoa(status)).Inc()
			a.metrics.duration.WithLabelValues(route, r.Method).Observe(d.Seconds())
			level := slog.LevelInfo
			if status >= 500 {
				level = slog.LevelError
			}
			a.log.LogAttrs(r.Context(), level, "http request",
				slog.String("request_id", id),
				slog.String("method", r.Method),
				slog.String("path", r.URL.Path),
				slog.String("route", route),
				slog.Int("status", status),
				slog.Int("bytes", ww.BytesWritten()),
				slog.Duration("duration", d),
				slog.String("remote", r.RemoteAddr),
			)
		}()
		next.ServeHTTP(ww, r)
	})
}
