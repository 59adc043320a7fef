package api

import (
	"bytes"
	"context"
	"crypto/rand"
	"crypto/sha256"
	"crypto/subtle"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"math"
	"net"
	"net/http"
	"net/netip"
	"strconv"
	"sync"
	"time"

	"github.com/go-chi/chi/v5/middleware"
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
	return (r.Method == http.MethodGet || r.Method == http.MethodHead) && (r.URL.Path == "/healthz" || r.URL.Path == "/readyz")
}

// shed answers at once, rather than queueing, when the client's address is
// over its rate or has too many bodies arriving (429), when a body does not
// arrive within BodyTimeout (408), or when the process already serves
// MaxInFlight requests (503); 429 and 503 carry Retry-After. Bodies are read whole
// before a slot is taken: a client trickling its body holds no slot, so
// no one can stall the grant path by sending slowly. The admin token and
// gateway tokens this process verified (trusted) are never refused by the
// per-address bounds: those exist for floods of made-up tokens and
// unauthenticated work; their callers have a per-token limit instead.
func (a *API) shed(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if exempt(r) {
			next.ServeHTTP(w, r)
			return
		}
		trusted := a.trustedCaller(r)
		addr := clientAddress(r)
		if !trusted {
			if ok, wait := a.addrLimits.Allow(addr, time.Now()); !ok {
				a.metrics.shed.WithLabelValues("address_rate").Inc()
				a.tooMany(w, r, wait, "this client address sends too many requests")
				return
			}
		}
		if !a.readBody(w, r, addr, trusted) {
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

// trustedCaller reports whether r carries the admin token or a gateway
// token this process has verified and still trusts (tokens.Store.KnownGateway: a
// revocation heard ends that, on every route, authenticated or not):
// checked in memory only (a hash compare, a cache), so that a made-up
// token costs nothing here. It only exempts r from the per-address
// bounds; authenticate still checks the token.
func (a *API) trustedCaller(r *http.Request) bool {
	tok, ok := bearer(r)
	if !ok {
		return false
	}
	h := sha256.Sum256([]byte(tok))
	if subtle.ConstantTimeCompare(h[:], a.adminHash[:]) == 1 {
		return true
	}
	_, ok = a.tokens.KnownGateway(tok)
	return ok
}

// readBody reads r's body whole, at most MaxBodyBytes, within BodyTimeout,
// and puts it back in memory; with trusted false it counts against the
// address's bound of bodies arriving at once. It answers the refusal
// itself and then reports false. A refusal closes the connection: the
// rest of a body that did not come is not waited for.
func (a *API) readBody(w http.ResponseWriter, r *http.Request, addr string, trusted bool) bool {
	if r.Body == nil || r.Body == http.NoBody {
		return true
	}
	if r.ContentLength > a.maxBody {
		w.Header().Set("Connection", "close")
		a.writeError(w, r, &http.MaxBytesError{Limit: a.maxBody})
		return false
	}
	if !trusted {
		if !a.bodies.acquire(addr) {
			a.metrics.shed.WithLabelValues("address_bodies").Inc()
			w.Header().Set("Connection", "close")
			a.tooMany(w, r, time.Second, "this client address has too many request bodies arriving at once")
			return false
		}
		defer a.bodies.release(addr)
	}
	rc := http.NewResponseController(w)
	_ = rc.SetReadDeadline(time.Now().Add(a.bodyTimeout)) // not every ResponseWriter can: then only the server's ReadTimeout bounds it
	body, err := io.ReadAll(http.MaxBytesReader(w, r.Body, a.maxBody))
	if err != nil {
		w.Header().Set("Connection", "close")
		if ne, ok := errors.AsType[net.Error](err); ok && ne.Timeout() {
			a.metrics.shed.WithLabelValues("body_timeout").Inc()
			a.writeError(w, r, &Problem{Type: TypeBodyTimeout, Title: "Request body too slow", Status: http.StatusRequestTimeout,
				Detail: fmt.Sprintf("the request body must arrive within %s", a.bodyTimeout)})
			return false
		}
		a.writeError(w, r, err) // too large (413), or the client went away
		return false
	}
	// The body is in; the handler's time is bounded by RequestTimeout, and
	// a deadline left behind would end the connection's next reads.
	_ = rc.SetReadDeadline(time.Time{})
	r.Body = io.NopCloser(bytes.NewReader(body))
	r.ContentLength = int64(len(body))
	return true
}

// addressBodies counts, per client address, the request bodies being
// received: entries exist only while a body is, so the map is bounded by
// the connections open.
type addressBodies struct {
	max int // ≤ 0: no bound
	mu  sync.Mutex
	m   map[string]int
}

func (b *addressBodies) acquire(addr string) bool {
	if b.max <= 0 {
		return true
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.m[addr] >= b.max {
		return false
	}
	b.m[addr]++
	return true
}

func (b *addressBodies) release(addr string) {
	if b.max <= 0 {
		return
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.m[addr]--; b.m[addr] <= 0 {
		delete(b.m, addr)
	}
}

// tooMany answers 429 with Retry-After (whole seconds, at least 1).
func (a *API) tooMany(w http.ResponseWriter, r *http.Request, wait time.Duration, detail string) {
	w.Header().Set("Retry-After", strconv.FormatInt(retryAfterSeconds(wait), 10))
	a.writeError(w, r, &Problem{Type: TypeRateLimited, Title: "Too many requests", Status: http.StatusTooManyRequests,
		Detail: detail + "; retry after the number of seconds in Retry-After"})
}

// retryAfterSeconds is wait in whole seconds for Retry-After: at least 1,
// at most an hour.
func retryAfterSeconds(wait time.Duration) int64 {
	return max(1, min(int64(math.Ceil(wait.Seconds())), 3600))
}

// ClientAddress is the address r's per-address limits count against: the
// connection's peer, never a header, which the client writes. IPv6 peers
// are grouped by /64, the block one subscriber usually holds.
func ClientAddress(r *http.Request) string { return clientAddress(r) }

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
