package tokens

import (
	"context"
	"crypto/rand"
	"crypto/sha256"
	"encoding/base64"
	"errors"
	"fmt"
	"strings"
	"time"
	"unicode/utf8"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgtype"

	"github.com/tally-ledger/tally/internal/ids"
	"github.com/tally-ledger/tally/periods"
	"github.com/tally-ledger/tally/validation"
)

// Prefix starts every token's secret, so a leaked one is recognisable
// (secret scanners, logs) and never confused with the admin token.
const Prefix = "tly_"

// DBTX is what the token functions need: a pool, a connection or a transaction.
type DBTX interface {
	Exec(ctx context.Context, sql string, args ...any) (pgconn.CommandTag, error)
	Query(ctx context.Context, sql string, args ...any) (pgx.Rows, error)
	QueryRow(ctx context.Context, sql string, args ...any) pgx.Row
}

// Beginner is what Create needs besides DBTX: a customer token and its
// customer are written in one transaction (a savepoint inside the caller's).
type Beginner interface {
	DBTX
	Begin(ctx context.Context) (pgx.Tx, error)
}

// Token is a token as stored: never its secret. A customer token has
// Customer, a gateway token Gateway.
type Token struct {
	ID          uuid.UUID  `json:"id"`
	Customer    string     `json:"customer"`
	Gateway     string     `json:"gateway,omitempty"`
	Description string     `json:"description"`
	CreatedAt   time.Time  `json:"created_at"`
	RevokedAt   *time.Time `json:"revoked_at"`
}

// ErrNotFound: no token has that id.
var ErrNotFound = errors.New("no token with that id")

// Create stores a new read-only token for customer and returns it with
// its secret. Only the secret's SHA-256 is stored: the secret cannot be
// shown again. The token refers to its customer, which exists from then on
// (periods.RegisterCustomers): a customer with nothing metered yet reads as
// zero usage through it, not as unknown.
func Create(ctx context.Context, db Beginner, customer, description string, now time.Time) (t Token, secret string, err error) {
	if err := Validate(false, customer, description); err != nil {
		return Token{}, "", err
	}
	err = pgx.BeginFunc(ctx, db, func(tx pgx.Tx) error {
		if t, secret, err = create(ctx, tx, customer, "", description, now); err != nil {
			return err
		}
		return periods.RegisterCustomers(ctx, tx, customer)
	})
	if err != nil {
		return Token{}, "", err
	}
	return t, secret, nil
}

// CreateGateway stores a new token for the gateway whose holder id is
// gateway: it may issue, renew and release only that holder's grants and
// report only its bypasses. The secret is shown once, like Create's.
func CreateGateway(ctx context.Context, db Beginner, gateway, description string, now time.Time) (Token, string, error) {
	if err := Validate(true, gateway, description); err != nil {
		return Token{}, "", err
	}
	return create(ctx, db, "", gateway, description, now)
}

// Validate reports, as field errors (customer or gateway, description), all
// at once, what a token of a gateway (when gateway is true: its holder id
// in owner) or of a customer (owner) with description could not be.
func Validate(gateway bool, owner, description string) error {
	field := "customer"
	if gateway {
		field = "gateway"
	}
	var errs []error
	if !ids.Valid(owner) {
		errs = append(errs, validation.Errorf(field, "%q is not "+ids.Rule, owner))
	}
	if utf8.RuneCountInString(description) > MaxDescription || !utf8.ValidString(description) {
		errs = append(errs, validation.Errorf("description", "at most %d characters of UTF-8", MaxDescription))
	}
	return errors.Join(errs...)
}

// create stores a token of customer or gateway, Validated by its caller.
func create(ctx context.Context, db DBTX, customer, gateway, description string, now time.Time) (Token, string, error) {
	var raw [32]byte
	if _, err := rand.Read(raw[:]); err != nil {
		return Token{}, "", err
	}
	secret := Prefix + base64.RawURLEncoding.EncodeToString(raw[:])
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

// MaxDescription is the longest description of a token, in characters.
const MaxDescription = 200

// Revoke revokes a token and returns it as stored; revoking it again keeps
// the first time.
func Revoke(ctx context.Context, db DBTX, id uuid.UUID, now time.Time) (Token, error) {
	t := Token{ID: id}
	err := db.QueryRow(ctx, qRevokeToken, id, now.UTC().Truncate(time.Microsecond)).Scan(&t.Customer, &t.Description, &t.CreatedAt, &t.RevokedAt, &t.Gateway)
	if errors.Is(err, pgx.ErrNoRows) {
		return Token{}, ErrNotFound
	}
	if err != nil {
		return Token{}, fmt.Errorf("revoke token: %w", err)
	}
	return t, nil
}

// List lists the tokens of customer ("" for all), oldest first.
func List(ctx context.Context, db DBTX, customer string) ([]Token, error) {
	var filter *string
	if customer != "" {
		filter = &customer
	}
	return collect(db.Query(ctx, qListTokens, filter))
}

// collect reads the tokens of a list query's rows.
func collect(rows pgx.Rows, err error) ([]Token, error) {
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

// PageRequest asks for up to Limit tokens of Customer ("" for all) after
// the token created at AfterCreated with id AfterID (none when
// AfterCreated is zero), oldest first.
type PageRequest struct {
	Customer     string
	AfterCreated time.Time
	AfterID      uuid.UUID
	Limit        int
}

// Page lists the tokens req asks for: a keyset page, read by an index
// (a deployment has a token per customer or more), so it neither repeats
// nor skips a token when tokens are created between pages.
func Page(ctx context.Context, db DBTX, req PageRequest) ([]Token, error) {
	after := pgtype.Timestamptz{InfinityModifier: pgtype.NegativeInfinity, Valid: true}
	if !req.AfterCreated.IsZero() {
		after = pgtype.Timestamptz{Time: req.AfterCreated, Valid: true}
	}
	args := []any{after, req.AfterID, req.Limit}
	q := qPageTokens
	if req.Customer != "" {
		q, args = qPageTokensOf, append(args, req.Customer)
	}
	out, err := collect(db.Query(ctx, q, args...))
	if out == nil && err == nil {
		out = []Token{} // an empty page is a list, not null
	}
	return out, err
}

// WellFormed reports whether secret has the shape Create gives every
// token: Prefix and 43 characters of unpadded base64url (32 random
// bytes). Anything else is refused without a query.
func WellFormed(secret string) bool {
	if len(secret) != len(Prefix)+43 || !strings.HasPrefix(secret, Prefix) {
		return false
	}
	for i := len(Prefix); i < len(secret); i++ {
		c := secret[i]
		if !(c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || c == '-' || c == '_') {
			return false
		}
	}
	return true
}
