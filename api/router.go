package api

import (
	"context"
	"fmt"
	"net/http"
	"runtime/debug"
	"strings"
	"time"

	"github.com/go-chi/chi/v5"
	"github.com/go-chi/chi/v5/middleware"
	"github.com/prometheus/client_golang/prometheus/promhttp"
)

// routes builds the router. Every route here must be in openapi.json
// (TestOpenAPICoversRoutes walks this tree).
func (a *API) routes() http.Handler {
	r := chi.NewRouter()
	// GetHead routes a HEAD request as GET (the body written is dropped by
	// net/http): load balancers health-check with HEAD.
	r.Use(assignRequestID, secureHeaders, a.observe, a.recoverer, a.shed, a.limits, middleware.GetHead)
	noRoute := func(r *http.Request) error {
		return notFound(fmt.Sprintf("no route for %s %s; see /openapi.json", quote(r.Method), quote(r.URL.Path)))
	}
	r.NotFound(a.handle(func(w http.ResponseWriter, r *http.Request) error { return noRoute(r) }))
	r.MethodNotAllowed(a.handle(func(w http.ResponseWriter, r *http.Request) error {
		allowed := AllowMethods(w, r)
		if len(allowed) == 0 {
			return noRoute(r)
		}
		return &Problem{Type: TypeMethod, Title: "Method not allowed", Status: http.StatusMethodNotAllowed,
			Detail: fmt.Sprintf("%s is not allowed on this path; allowed: %v", quote(r.Method), allowed)}
	}))

	r.Get("/healthz", a.healthz)
	r.Get("/readyz", a.handle(a.readyz))
	r.Get("/openapi.json", serveOpenAPI)
	r.With(a.authenticate, requireAdmin).Get("/metrics",
		promhttp.HandlerFor(a.registry, promhttp.HandlerOpts{Registry: a.registry}).ServeHTTP)

	r.Route("/v1", func(r chi.Router) {
		r.Use(a.authenticate)
		r.Get("/customers/{customer}", a.handle(a.getCustomer))
		r.With(requireAdmin).Put("/customers/{customer}", a.handle(a.putCustomer))
		r.Get("/customers/{customer}/usage", a.handle(a.getUsage))
		r.With(requireAdmin).Post("/adjustments", a.handle(a.postAdjustment))

		r.Get("/customers/{customer}/periods", a.handle(a.listPeriods))
		r.Get("/customers/{customer}/periods/{period}/statement", a.handle(a.getStatement))
		r.With(requireAdmin).Post("/customers/{customer}/periods/{period}/close", a.handle(a.closePeriod))
		r.Get("/customers/{customer}/quotas", a.handle(a.getQuotas))
		r.With(requireAdmin).Put("/customers/{customer}/quotas/{meter}", a.handle(a.putQuota))

		r.Get("/customers/{customer}/grants", a.handle(a.listGrants))
		r.Get("/customers/{customer}/budgets", a.handle(a.listBudgets))
		r.Get("/customers/{customer}/rate-budgets", a.handle(a.listRateBudgets))
		r.Group(func(r chi.Router) {
			r.Use(requireGrantManager)
			r.Post("/grants", a.handle(a.postGrant))
			r.Post("/grants/{id}/renew", a.handle(a.renewGrant))
			r.Post("/grants/{id}/release", a.handle(a.releaseGrant))
			r.Post("/grants/release", a.handle(a.releaseGrants))
			r.Post("/grants/debits", a.handle(a.postDebit))
			r.Post("/bypasses", a.handle(a.postBypasses))
		})

		r.Group(func(r chi.Router) {
			r.Use(requireAdmin)
			r.Get("/ingest/status", a.handle(a.getIngestStatus))
			r.Get("/dead-letters", a.handle(a.listDeadLetters))
			r.Get("/dead-letters/{id}", a.handle(a.getDeadLetter))
			r.Post("/dead-letters/{id}/replay", a.handle(a.replayDeadLetter))
			r.Get("/reconciliations", a.handle(a.listReconciliations))
			r.Get("/reconciliations/{id}", a.handle(a.getReconciliation))
			r.Post("/reconciliations", a.handle(a.postReconciliation))
			r.Get("/pools", a.handle(a.listPools))
			r.Get("/pools/{name}", a.handle(a.getPool))
			r.Put("/pools/{name}", a.handle(a.putPool))
			r.Put("/pools/{name}/quotas/{meter}", a.handle(a.putPoolQuota))
			r.Put("/global/quotas/{meter}", a.handle(a.putGlobalQuota))
			r.Get("/tokens", a.handle(a.listTokens))
			r.Post("/tokens", a.handle(a.createToken))
			r.Post("/tokens/{id}/revoke", a.handle(a.revokeToken))
			r.Post("/holders/{holder}/retire", a.handle(a.retireHolder))
		})

		// Alerts (docs/design.md §15), admin only.
		r.Group(func(r chi.Router) {
			r.Use(requireAdmin)
			r.Get("/alerts", a.handle(a.listAlerts))
			r.Get("/alerts/{name}", a.handle(a.getAlert))
			r.Put("/alerts/{name}", a.handle(a.putAlert))
			r.Delete("/alerts/{name}", a.handle(a.deleteAlert))
			r.Get("/webhooks", a.handle(a.listWebhooks))
			r.Get("/webhooks/{name}", a.handle(a.getWebhook))
			r.Put("/webhooks/{name}", a.handle(a.putWebhook))
			r.Delete("/webhooks/{name}", a.handle(a.deleteWebhook))
			r.Post("/webhooks/{name}/rotate-secret", a.handle(a.rotateWebhookSecret))
			r.Get("/alert-events", a.handle(a.listAlertEvents))
			r.Post("/alert-events/{id}/redeliver", a.handle(a.redeliverAlertEvent))
		})

		// Meter declarations (docs/design.md §16), admin only.
		r.Group(func(r chi.Router) {
			r.Use(requireAdmin)
			r.Get("/meters", a.handle(a.listMeters))
			r.Get("/meters/{meter}", a.handle(a.getMeter))
			r.Put("/meters/{meter}", a.handle(a.putMeter))
		})
	})
	return r
}

// handle adapts a handler that returns an error to http.HandlerFunc; the
// error goes to writeError, the one mapping to problem+json. Path
// parameters are decoded and checked first (pathParams).
func (a *API) handle(h func(http.ResponseWriter, *http.Request) error) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		if err := pathParams(r); err != nil {
			a.writeError(w, r, err)
			return
		}
		if err := h(w, r); err != nil {
			a.writeError(w, r, err)
		}
	}
}

const reconcilePath = "/v1/reconciliations"

// limits bounds the request: query length, body size, and time.
func (a *API) limits(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if len(r.URL.RawQuery) > a.maxQuery {
			a.writeError(w, r, &Problem{Type: TypeURITooLong, Title: "Query string too long", Status: http.StatusRequestURITooLong,
				Detail: fmt.Sprintf("the query string must be at most %d bytes", a.maxQuery)})
			return
		}
		if n := headerBytes(r); n > MaxHeaderBytes {
			a.writeError(w, r, &Problem{Type: TypeHeadersTooLarge, Title: "Request headers too large", Status: http.StatusRequestHeaderFieldsTooLarge,
				Detail: fmt.Sprintf("the request's headers are %d bytes; at most %d", n, MaxHeaderBytes)})
			return
		}
		if r.ContentLength > a.maxBody {
			a.writeError(w, r, &http.MaxBytesError{Limit: a.maxBody})
			return
		}
		r.Body = http.MaxBytesReader(w, r.Body, a.maxBody)
		timeout := a.reqTimeout
		if r.Method == http.MethodPost && r.URL.Path == reconcilePath {
			timeout = a.recTimeout // a synchronous run: see postReconciliation
		}
		ctx, cancel := context.WithTimeout(r.Context(), timeout)
		defer cancel()
		next.ServeHTTP(w, r.WithContext(ctx))
	})
}

// recoverer turns a panic into a logged 500 problem.
func (a *API) recoverer(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		defer func() {
			if v := recover(); v != nil {
				if v == http.ErrAbortHandler {
					panic(v)
				}
				a.writeError(w, r, fmt.Errorf("panic: %v\n%s", v, debug.Stack()))
			}
		}()
		next.ServeHTTP(w, r)
	})
}

// AllowMethods sets the Allow header of a 405 answer to r (RFC 9110
// §15.5.6) to the methods the chi router that routed r accepts on r's
// path, HEAD wherever GET (the router uses middleware.GetHead), and
// returns them. It returns none when no route serves the path: chi routes
// a method it does not know to its MethodNotAllowed handler whatever the
// path, and that answer is a 404. The API's and the console's 405s use it.
func AllowMethods(w http.ResponseWriter, r *http.Request) []string {
	rctx := chi.RouteContext(r.Context())
	var out []string
	if rctx == nil || rctx.Routes == nil {
		return out
	}
	path := r.URL.RawPath
	if path == "" {
		path = r.URL.Path
	}
	for _, m := range []string{http.MethodGet, http.MethodPut, http.MethodPost, http.MethodPatch, http.MethodDelete} {
		if rctx.Routes.Match(chi.NewRouteContext(), m, path) {
			out = append(out, m)
			if m == http.MethodGet {
				out = append(out, http.MethodHead) // middleware.GetHead
			}
		}
	}
	for _, m := range out {
		w.Header().Add("Allow", m)
	}
	return out
}

func requestID(r *http.Request) string { return middleware.GetReqID(r.Context()) }

// validRequestID reports whether a client-sent request id is a short
// token that may be logged.
func validRequestID(s string) bool {
	if len(s) > 64 {
		return false
	}
	for i := 0; i < len(s); i++ {
		c := s[i]
		if !(c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || strings.IndexByte("._:/+=-", c) >= 0) {
			return false
		}
	}
	return true
}

// MaxHeaderBytes bounds a request's headers (names, values and their
// separators): over it, 431 headers-too-large. The server lets through up
// to 4 × as much so that the answer is a problem, not net/http's plain text.
const MaxHeaderBytes = 16 << 10

// headerBytes is the size of r's headers as they were sent.
func headerBytes(r *http.Request) int {
	n := 0
	for k, vs := range r.Header {
		for _, v := range vs {
			n += len(k) + len(v) + 4 // ": " and CRLF
		}
	}
	return n
}

// NewServer returns an http.Server for handler with the limits a public
// listener needs: header size and read/write/idle timeouts (so slow clients
// cannot hold connections open). Bodies are limited by the handler.
func NewServer(addr string, handler http.Handler) *http.Server {
	return &http.Server{
		Addr:              addr,
		Handler:           handler,
		ReadHeaderTimeout: 5 * time.Second,
		ReadTimeout:       30 * time.Second,
		WriteTimeout:      30 * time.Second,
		IdleTimeout:       120 * time.Second,
		MaxHeaderBytes:    4 * MaxHeaderBytes,
	}
}
