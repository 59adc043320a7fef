package api

import (
	"context"
	"crypto/sha256"
	"crypto/subtle"
	"errors"
	"fmt"
	"net/http"
	"strings"
	"time"

	"github.com/go-chi/chi/v5"
	"github.com/google/uuid"

	"github.com/tally-ledger/tally/tokens"
)

// MinAdminTokenLength is the shortest admin token Config accepts.
const MinAdminTokenLength = 32

// principal is who is calling: the admin, or one customer's token.
type principal struct {
	admin    bool
	customer string
	gateway  string // a gateway token: may manage only this holder's grants
	tokenID  uuid.UUID
}

type principalKey struct{}

func principalFrom(ctx context.Context) principal {
	p, _ := ctx.Value(principalKey{}).(principal)
	return p
}

// canRead reports whether the caller may read customer. A customer token
// reading another customer gets the same 404 as an unknown customer.
func canRead(ctx context.Context, customer string) error {
	p := principalFrom(ctx)
	if p.admin || p.customer == customer {
		return nil
	}
	return customerNotFound(customer)
}

var (
	errForbidden = &Problem{Type: TypeForbidden, Title: "Forbidden", Status: http.StatusForbidden,
		Detail: "customer tokens may only read; this needs the admin token"}
	errForbiddenGateway = &Problem{Type: TypeForbidden, Title: "Forbidden", Status: http.StatusForbidden,
		Detail: "a gateway token manages only its holder's grants, debits and bypasses; this needs the admin token"}
)

// requireAdmin lets only the admin token through (every write).
func requireAdmin(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if p := principalFrom(r.Context()); !p.admin {
			if p.gateway != "" {
				writeProblemRequest(w, r, errForbiddenGateway)
				return
			}
			writeProblemRequest(w, r, errForbidden)
			return
		}
		next.ServeHTTP(w, r)
	})
}

func writeProblemRequest(w http.ResponseWriter, r *http.Request, p *Problem) {
	cp := *p
	cp.RequestID = requestID(r)
	writeProblem(w, &cp)
}

func unauthorized(detail string) *Problem {
	return &Problem{Type: TypeUnauthorized, Title: "Unauthorized", Status: http.StatusUnauthorized, Detail: detail}
}

// authenticate requires "Authorization: Bearer <token>": the admin token
// (compared in constant time) or a customer or gateway token that is not
// revoked (tokens.Store.Verify, which caches both answers).
func (a *API) authenticate(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		tok, ok := bearer(r)
		if !ok {
			detail := "send Authorization: Bearer <token> (" + tokenKinds(r) + ")"
			if n := len(r.Header.Values("Authorization")); n > 1 {
				detail = fmt.Sprintf("send one Authorization header, not %d: Bearer <token> (%s)", n, tokenKinds(r))
			}
			a.writeError(w, r, unauthorized(detail))
			return
		}
		p, err := a.identify(r.Context(), tok)
		if pr, ok := errors.AsType[*Problem](err); ok && pr.Status == http.StatusUnauthorized {
			err = unauthorized(pr.Detail + "; this takes " + tokenKinds(r))
		}
		if err != nil {
			a.writeError(w, r, err)
			return
		}
		if ok, wait := a.chargeToken(p, 1); !ok {
			a.tooMany(w, r, wait, "this token sends too many requests")
			return
		}
		next.ServeHTTP(w, r.WithContext(context.WithValue(r.Context(), principalKey{}, p)))
	})
}

// bearer is r's "Authorization: Bearer <token>" token. A request with
// two Authorization headers has none: which one counts would depend on
// who reads it (RFC 6750 §3.1), so neither does.
func bearer(r *http.Request) (string, bool) {
	h := r.Header.Values("Authorization")
	if len(h) != 1 {
		return "", false
	}
	scheme, tok, ok := strings.Cut(h[0], " ")
	tok = strings.TrimSpace(tok)
	if !ok || !strings.EqualFold(scheme, "Bearer") || tok == "" {
		return "", false
	}
	return tok, true
}

// chargeToken takes cost requests from p's per-token limit: a gateway
// token's (sized for the grant protocol) or a customer token's; the
// admin's is not limited. Refused, it says how long until there is room.
func (a *API) chargeToken(p principal, cost int) (bool, time.Duration) {
	if p.admin {
		return true, 0
	}
	limits, label := a.tokenLimits, "token_rate"
	if p.gateway != "" {
		limits, label = a.gatewayLimits, "gateway_rate"
	}
	ok, wait := limits.AllowN(string(p.tokenID[:]), cost, time.Now())
	if !ok {
		a.metrics.shed.WithLabelValues(label).Inc()
	}
	return ok, wait
}

// tokenKinds names the tokens r's route takes, for a 401: gateway routes
// (grants and bypasses) take a gateway token, which a newcomer wiring the
// admit SDK otherwise never hears of.
func tokenKinds(r *http.Request) string {
	if p := r.URL.Path; strings.HasPrefix(p, "/v1/grants") || p == "/v1/bypasses" {
		return "a gateway token from `tally tokens create --gateway H` for the request's holder, or the admin token"
	}
	return "the admin token or a customer token from `tally tokens create`"
}

// identify says whose tok is: the admin's, or a customer or gateway
// token's (not revoked, tokens.Store.Verify). An unknown token is a 401
// problem.
func (a *API) identify(ctx context.Context, tok string) (principal, error) {
	h := sha256.Sum256([]byte(tok))
	if subtle.ConstantTimeCompare(h[:], a.adminHash[:]) == 1 {
		return principal{admin: true}, nil
	}
	tp, err := a.tokens.Verify(ctx, tok)
	if errors.Is(err, tokens.ErrUnknown) {
		return principal{}, unauthorized("the token is unknown or revoked")
	}
	if err != nil {
		return principal{}, fmt.Errorf("authenticate: %w", err)
	}
	return principal{customer: tp.Customer, gateway: tp.Gateway, tokenID: tp.TokenID}, nil
}

// readableCustomer is the path's {customer}, checked, and one the caller
// may read (another customer's answers 404, like an unknown one).
func readableCustomer(r *http.Request) (string, error) {
	customer := chi.URLParam(r, "customer")
	if err := checkID("customer", customer); err != nil {
		return "", err
	}
	if err := canRead(r.Context(), customer); err != nil {
		return "", err
	}
	return customer, nil
}
