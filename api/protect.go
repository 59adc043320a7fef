package api

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"math"
	"net/http"
	"net/netip"
	"strconv"
	"sync"
	"time"

	"github.com/go-chi/chi/v5/middleware"
	"golang.org/x/time/rate"
)

// knownMethods are the methods a metric label or a log's method field may
// name; any other is "other". A client can send any token as a method (net/http
// accepts them up to the request line's limit), so a raw method as a label
// would add series without bound.
var knownMethods = map[string]string{
	http.MethodGet: http.MethodGet, http.MethodHead: http.MethodHead, http.MethodPost: http.MethodPost,
	http.MethodPut: http.MethodPut, http.MethodPatch: http.MethodPatch, http.MethodDelete: http.MethodDelete,
	http.MethodOptions: http.MethodOptions, http.MethodConnect: http.MethodConnect, http.MethodTrace: http.MethodTrace,
}

// methodLabel is r's method if it is a standard one, else "other".
func methodLabel(method string) string {
	if m, ok := knownMethods[method]; ok {
		return m
	}
	return "other"
}

// clientRequestIDHeader is where a client may send an id of its own
// (e.g. a trace id): it is logged as client_request_id, never used as the
// request's id, so a client can neither choose the id its requests are
// logged under nor collide with another request's.
const clientRequestIDHeader = "X-Request-Id"

// assignRequestID gives every request a random id (96 bits, hex): it
// reveals neither the host nor how many requests came before. It is
// stored where chi's middleware.GetReqID finds it.
func assignRequestID(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		var b [12]byte
		_, _ = rand.Read(b[:]) // never fails (crypto/rand)
		ctx := context.WithValue(r.Context(), middleware.RequestIDKey, hex.EncodeToString(b[:]))
		next.ServeHTTP(w, r.WithContext(ctx))
	})
}

// clientRequestID is the id the client sent, if it is a short token (one
// that is not is dropped: logs only carry ids a client cannot abuse).
func clientRequestID(r *http.Request) string {
	if id := r.Header.Get(clientRequestIDHeader); id != "" && validRequestID(id) {
		return id
	}
	return ""
}

// secureHeaders sets the headers every response of a JSON API sends
// (OWASP REST Security Cheat Sheet): no content sniffing, no framing, no
// referrer, no active content if a browser ever renders a response, and
// no caching unless a handler allows it (openapi.json does).
func secureHeaders(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		h := w.Header()
		h.Set("X-Content-Type-Options", "nosniff")
		h.Set("X-Frame-Options", "DENY")
		h.Set("Content-Security-Policy", "default-src 'none'; frame-ancestors 'none'")
		h.Set("Referrer-Policy", "no-referrer")
		h.Set("Cross-Origin-Resource-Policy", "same-origin")
		h.Set("Cache-Control", "no-store")
		next.ServeHTTP(w, r)
	})
}

// exempt reports whether r is a probe: /healthz and /readyz are never
// shed or rate-limited, so an orchestrator does not restart or drain a
// process because someone else floods it (both are cheap: /readyz's
// answer is reused for a second).
func exempt(r *http.Request) bool {
	return r.Method == http.MethodGet && (r.URL.Path == "/healthz" || r.URL.Path == "/readyz")
}

// shed answers at once, rather than queueing, when the client's address is
// over its rate (429) or the process already serves MaxInFlight requests
// (503), both with Retry-After.
func (a *API) shed(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if exempt(r) {
			next.ServeHTTP(w, r)
			return
		}
		if ok, wait := a.addrLimits.allow(clientAddress(r), time.Now()); !ok {
			a.metrics.shed.WithLabelValues("address_rate").Inc()
			a.tooMany(w, r, wait, "this client address sends too many requests")
			return
		}
		if a.inFlight != nil {
			select {
			case a.inFlight <- struct{}{}:
				defer func() { <-a.inFlight }()
			default:
				a.metrics.shed.WithLabelValues("in_flight").Inc()
				w.Header().Set("Retry-After", "1")
				a.writeError(w, r, &Problem{Type: TypeOverloaded, Title: "Overloaded", Status: http.StatusServiceUnavailable,
					Detail: "the server is serving as many requests as it may; retry after the number of seconds in Retry-After"})
				return
			}
		}
		next.ServeHTTP(w, r)
	})
}

// tooMany answers 429 with Retry-After (whole seconds, at least 1).
func (a *API) tooMany(w http.ResponseWriter, r *http.Request, wait time.Duration, detail string) {
	secs := int64(math.Ceil(wait.Seconds()))
	w.Header().Set("Retry-After", strconv.FormatInt(max(1, min(secs, 3600)), 10))
	a.writeError(w, r, &Problem{Type: TypeRateLimited, Title: "Too many requests", Status: http.StatusTooManyRequests,
		Detail: detail + "; retry after the number of seconds in Retry-After"})
}

// clientAddress is the connection's peer address: never a header, which
// the client writes. IPv6 peers are grouped by /64, the block one
// subscriber usually holds.
func clientAddress(r *http.Request) string {
	ap, err := netip.ParseAddrPort(r.RemoteAddr)
	if err != nil {
		return r.RemoteAddr
	}
	ip := ap.Addr().Unmap()
	if ip.Is6() {
		if p, err := ip.Prefix(64); err == nil {
			return p.String()
		}
	}
	return ip.String()
}

// rateLimits is a token bucket (golang.org/x/time/rate) per key, in a
// bounded map: when it is full, half is freed (see evict).
type rateLimits struct {
	rate  rate.Limit
	burst int
	max   int

	mu sync.Mutex
	m  map[string]*rate.Limiter
}

// newRateLimits returns nil (no limit) for a rate ≤ 0.
func newRateLimits(perSecond float64, burst, maxKeys int) *rateLimits {
	if perSecond <= 0 {
		return nil
	}
	return &rateLimits{rate: rate.Limit(perSecond), burst: max(1, burst), max: maxKeys, m: map[string]*rate.Limiter{}}
}

// allow takes one token from key's bucket, or says how long until one is there.
func (l *rateLimits) allow(key string, now time.Time) (bool, time.Duration) {
	if l == nil {
		return true, 0
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	lim, ok := l.m[key]
	if !ok {
		if len(l.m) >= l.max {
			l.evict(now)
		}
		lim = rate.NewLimiter(l.rate, l.burst)
		l.m[key] = lim
	}
	if lim.AllowN(now, 1) {
		return true, 0
	}
	missing := 1 - lim.TokensAt(now)
	return false, time.Duration(missing / float64(l.rate) * float64(time.Second))
}

func (l *rateLimits) evict(now time.Time) {
	// Dropping a bucket gives its key a full one. First the buckets that
	// are full (nothing lost), then those that would allow the next
	// request anyway (at most a burst given away), and only then others:
	// a flood of new keys does not reset the keys that are being limited.
	for _, floor := range []float64{float64(l.burst), 1, math.Inf(-1)} {
		for k, lim := range l.m { // random order
			if len(l.m) <= l.max/2 {
				return
			}
			if lim.TokensAt(now) >= floor {
				delete(l.m, k)
			}
		}
	}
}

func (l *rateLimits) len() int {
	l.mu.Lock()
	defer l.mu.Unlock()
	return len(l.m)
}
