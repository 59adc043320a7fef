package api

import (
	"context"
	"crypto/rand"
	"crypto/sha256"
	"crypto/subtle"
	"encoding/base64"
	"errors"
	"fmt"
	"github.com/go-chi/chi/v5"
	"net/http"
	"strings"
	"time"
	"unicode/utf8"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgtype"
)

// TokenPrefix starts every customer token, so a leaked one is recognisable
// (secret scanners, logs) and never confused with the admin token.
const TokenPrefix = "tly_"

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
// (compared in constant time) or a customer token that is not revoked. A
// token not shaped like a customer token is refused without a query, and
// one Postgres did not know is remembered for FailedTokenTTL, so a client
// repeating a bad token costs no round trip.
func (a *API) authenticate(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		scheme, tok, ok := strings.Cut(r.Header.Get("Authorization"), " ")
		if !ok || !strings.EqualFold(scheme, "Bearer") || strings.TrimSpace(tok) == "" {
			a.writeError(w, r, unauthorized("send Authorization: Bearer <token> (the admin token or a customer token from `tally tokens create`)"))
			return
		}
		tok = strings.TrimSpace(tok)
		p, err := a.identify(r.Context(), tok)
		if err != nil {
			a.writeError(w, r, err)
			return
		}
		h := sha256.Sum256([]byte(tok))
		if !p.admin {
			if ok, wait := a.tokenLimits.allow(string(h[:]), time.Now()); !ok {
				a.metrics.shed.WithLabelValues("token_rate").Inc()
				a.tooMany(w, r, wait, "this token sends too many requests")
				return
			}
		}
		next.ServeHTTP(w, r.WithContext(context.WithValue(r.Context(), principalKey{}, p)))
	})
}

// identify says whose tok is: the admin's, or a customer or gateway
// token's (not revoked). An unknown token is a 401 problem.
func (a *API) identify(ctx context.Context, tok string) (principal, error) {
	h := sha256.Sum256([]byte(tok))
	switch {
	case subtle.ConstantTimeCompare(h[:], a.adminHash[:]) == 1:
		return principal{admin: true}, nil
	case wellFormedToken(tok):
		if cached, ok := a.tokens.get(h); ok && a.trusted(cached) {
			a.metrics.tokenChecks.WithLabelValues("cached").Inc()
			return cached.p, nil
		}
		if _, refused := a.badTokens.get(h); refused {
			a.metrics.tokenChecks.WithLabelValues("refused_cached").Inc()
			return principal{}, unauthorized("the token is unknown or revoked")
		}
		a.metrics.tokenChecks.WithLabelValues("queried").Inc()
		epoch, stamp := a.watch.l.Epoch(), a.tokenWatch.stamp.Load()
		read := time.Now()
		var p principal
		var id pgtype.UUID // not uuid.UUID: pgx would go through its text form
		err := a.pool.QueryRow(ctx, qTokenByHash, h[:]).Scan(&id, &p.customer, &p.gateway)
		p.tokenID = id.Bytes
		if errors.Is(err, pgx.ErrNoRows) {
			// Remembered so a client repeating it costs no query. A
			// token is never created after being refused (its secret is
			// 32 random bytes); a revoked one stays refused.
			a.badTokens.put(h, struct{}{})
			return principal{}, unauthorized("the token is unknown or revoked")
		}
		if err != nil {
			return principal{}, fmt.Errorf("authenticate: %w", err)
		}
		// Only valid tokens, and only if no revocation was heard while
		// this one was read (it might have been this one).
		a.tokens.putIf(h, cachedPrincipal{p: p, epoch: epoch, read: read}, func() bool {
			return a.tokenWatch.stamp.Load() == stamp
		})
		return p, nil
	default:
		if strings.HasPrefix(tok, TokenPrefix) {
			a.metrics.tokenChecks.WithLabelValues("malformed").Inc()
		}
		return principal{}, unauthorized("the token is unknown or revoked")
	}
}

// tokenCoherentTTL is how long a checked token is trusted while the API
// hears revocations (see Config.TokenCacheTTL).
const tokenCoherentTTL = time.Minute

// cachedPrincipal is a checked customer token, with when it was read and
// the usage watch's epoch then (even: revocations were being heard).
type cachedPrincipal struct {
	p     principal
	epoch uint64
	read  time.Time
}

// trusted reports whether a cached token may be used without asking
// Postgres: within TokenCacheTTL of its read, or for longer while every
// revocation since its read has been heard (the listener has been up
// throughout, so its epoch has not changed) and the listener is live (it
// heard a probe sent within its lease: a listener that died silently is
// not trusted for longer).
func (a *API) trusted(c cachedPrincipal) bool {
	if a.tokenTTL > 0 && time.Since(c.read) < a.tokenTTL {
		return true
	}
	return c.epoch%2 == 0 && a.watch.l.Epoch() == c.epoch && a.watch.l.Live()
}

// DBTX is what the token functions need: a pool, a connection or a transaction.
type DBTX interface {
	Exec(ctx context.Context, sql string, args ...any) (pgconn.CommandTag, error)
	Query(ctx context.Context, sql string, args ...any) (pgx.Rows, error)
	QueryRow(ctx context.Context, sql string, args ...any) pgx.Row
}

// Token is a customer token as stored: never its secret.
type Token struct {
	ID          uuid.UUID  `json:"id"`
	Customer    string     `json:"customer"`
	Gateway     string     `json:"gateway,omitempty"`
	Description string     `json:"description"`
	CreatedAt   time.Time  `json:"created_at"`
	RevokedAt   *time.Time `json:"revoked_at"`
}

// ErrTokenNotFound: no token has that id.
var ErrTokenNotFound = errors.New("no token with that id")

// CreateToken stores a new read-only token for customer and returns it with
// its secret. Only the secret's SHA-256 is stored: the secret cannot be
// shown again.
func CreateToken(ctx context.Context, db DBTX, customer, description string, now time.Time) (Token, string, error) {
	return createToken(ctx, db, customer, "", description, now)
}

// CreateGatewayToken stores a new token for the gateway whose holder id is
// gateway: it may issue, renew and release only that holder's grants and
// report only its bypasses. The secret is shown once, like CreateToken's.
func CreateGatewayToken(ctx context.Context, db DBTX, gateway, description string, now time.Time) (Token, string, error) {
	if !validID(gateway) {
		return Token{}, "", fmt.Errorf("gateway: %s is not 1-128 characters of A-Z a-z 0-9 . _ : -", quote(gateway))
	}
	return createToken(ctx, db, "", gateway, description, now)
}

func createToken(ctx context.Context, db DBTX, customer, gateway, description string, now time.Time) (Token, string, error) {
	if gateway == "" && !validID(customer) {
		return Token{}, "", fmt.Errorf("customer: %s is not 1-128 characters of A-Z a-z 0-9 . _ : -", quote(customer))
	}
	if utf8.RuneCountInString(description) > 200 || !utf8.ValidString(description) {
		return Token{}, "", errors.New("description: at most 200 characters of UTF-8")
	}
	var raw [32]byte
	if _, err := rand.Read(raw[:]); err != nil {
		return Token{}, "", err
	}
	secret := TokenPrefix + base64.RawURLEncoding.EncodeToString(raw[:])
	h := sha256.Sum256([]byte(secret))
	id, err := uuid.NewV7()
	if err != nil {
		return Token{}, "", err
	}
	t := Token{ID: id, Customer: customer, Gateway: gateway, Description: description, CreatedAt: now.UTC().Truncate(time.Microsecond)}
	if _, err := db.Exec(ctx, qInsertToken, t.ID, t.Customer, t.Description, h[:], t.CreatedAt, t.Gateway); err != nil {
		return Token{}, "", fmt.Errorf("create token: %w", err)
	}
	return t, secret, nil
}

// RevokeToken revokes a token; revoking it again keeps the first time.
func RevokeToken(ctx context.Context, db DBTX, id uuid.UUID, now time.Time) (Token, error) {
	t := Token{ID: id}
	err := db.QueryRow(ctx, qRevokeToken, id, now.UTC().Truncate(time.Microsecond)).Scan(&t.Customer, &t.RevokedAt)
	if errors.Is(err, pgx.ErrNoRows) {
		return Token{}, ErrTokenNotFound
	}
	if err != nil {
		return Token{}, fmt.Errorf("revoke token: %w", err)
	}
	return t, nil
}

// ListTokens lists the tokens of customer ("" for all), oldest first.
func ListTokens(ctx context.Context, db DBTX, customer string) ([]Token, error) {
	var filter *string
	if customer != "" {
		filter = &customer
	}
	rows, err := db.Query(ctx, qListTokens, filter)
	if err != nil {
		return nil, fmt.Errorf("list tokens: %w", err)
	}
	var out []Token
	var t Token
	_, err = pgx.ForEachRow(rows, []any{&t.ID, &t.Customer, &t.Description, &t.CreatedAt, &t.RevokedAt, &t.Gateway}, func() error {
		out = append(out, t)
		t = Token{}
		return nil
	})
	if err != nil {
		return nil, fmt.Errorf("list tokens: %w", err)
	}
	return out, nil
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
