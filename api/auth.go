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

var errForbidden = &Problem{Type: TypeForbidden, Title: "Forbidden", Status: http.StatusForbidden,
	Detail: "customer tokens may only read; this needs the admin token"}

// requireAdmin lets only the admin token through (every write).
func requireAdmin(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if !principalFrom(r.Context()).admin {
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
		scheme, tok, ok := strings.Cut(r.Header.Get("Authorization"), " ")
		if !ok || !strings.EqualFold(scheme, "Bearer") || strings.TrimSpace(tok) == "" {
			a.writeError(w, r, unauthorized("send Authorization: Bearer <token> (the admin token or a customer token from `tally tokens create`)"))
			return
		}
		tok = strings.TrimSpace(tok)
		h := sha256.Sum256([]byte(tok))
		p := principal{admin: subtle.ConstantTimeCompare(h[:], a.adminHash[:]) == 1}
		if !p.admin {
			tp, err := a.tokens.Verify(r.Context(), tok)
			if errors.Is(err, tokens.ErrUnknown) {
				a.writeError(w, r, unauthorized("the token is unknown or revoked"))
				return
			}
			if err != nil {
				a.writeError(w, r, fmt.Errorf("authenticate: %w", err))
				return
			}
			p = principal{customer: tp.Customer, gateway: tp.Gateway, tokenID: tp.TokenID}
			if ok, wait := a.tokenLimits.allow(string(p.tokenID[:]), time.Now()); !ok {
				a.metrics.shed.WithLabelValues("token_rate").Inc()
				a.tooMany(w, r, wait, "this token sends too many requests")
				return
			}
		}
		next.ServeHTTP(w, r.WithContext(context.WithValue(r.Context(), principalKey{}, p)))
	})
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
