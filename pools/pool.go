package pools

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/tally-ledger/tally/internal/ids"
	"github.com/tally-ledger/tally/periods"
	"github.com/tally-ledger/tally/validation"
)

// ErrNotFound: no such pool.
var ErrNotFound = errors.New("pools: no such pool")

// FieldError is one problem of an input, naming its field.
type FieldError struct {
	Field  string
	Detail string
}

func (e *FieldError) Error() string { return "pools: " + e.Field + ": " + e.Detail }

// DBTX is what reads need of a pool, a connection or a transaction.
type DBTX interface {
	Query(ctx context.Context, sql string, args ...any) (pgx.Rows, error)
	QueryRow(ctx context.Context, sql string, args ...any) pgx.Row
	Exec(ctx context.Context, sql string, args ...any) (pgconn.CommandTag, error)
}

// MaxMembers bounds one pool's member list in one change.
const MaxMembers = 10000

// Pool is a pool and its membership history.
type Pool struct {
	Name      string    `json:"name"`
	CreatedAt time.Time `json:"created_at"`
	UpdatedAt time.Time `json:"updated_at"`
	// Members are the customers in the pool now.
	Members []string `json:"members"`
	// History is every stay, oldest first (Get only).
	History []Stay `json:"history,omitempty"`
}

// Stay is one period of a customer's membership.
type Stay struct {
	Customer string     `json:"customer"`
	JoinedAt time.Time  `json:"joined_at"`
	LeftAt   *time.Time `json:"left_at,omitempty"`
	Actor    string     `json:"actor"`
}

// PutInput sets a pool's members from EffectiveAt on.
type PutInput struct {
	Name    string
	Members []string
	// EffectiveAt is when the change takes effect: zero means now; never in
	// the future, never before the pool's latest change.
	EffectiveAt time.Time
	Actor       string
}

// Validate reports every problem of in at once.
func (in PutInput) Validate() error {
	var errs []error
	if !ids.ValidName(in.Name) {
		errs = append(errs, &FieldError{Field: "name", Detail: fmt.Sprintf("%q must be "+ids.NameRule, in.Name)})
	}
	if len(in.Members) > MaxMembers {
		errs = append(errs, &FieldError{Field: "members", Detail: fmt.Sprintf("at most %d members", MaxMembers)})
	}
	seen := make(map[string]bool, len(in.Members))
	for i, c := range in.Members {
		if !ids.Valid(c) {
			errs = append(errs, &FieldError{Field: fmt.Sprintf("members[%d]", i), Detail: fmt.Sprintf("%q is not a customer id: %s", c, ids.Rule)})
		} else if seen[c] {
			errs = append(errs, &FieldError{Field: fmt.Sprintf("members[%d]", i), Detail: fmt.Sprintf("%q is listed twice", c)})
		}
		seen[c] = true
	}
	if in.Actor == "" {
		errs = append(errs, &FieldError{Field: "actor", Detail: "is required"})
	}
	return errors.Join(errs...)
}

// Change is what a Put did.
type Change struct {
	At     time.Time
	Joined []string
	Left   []string
}

// PutTx creates the pool if needed and makes its members exactly
// in.Members from in.EffectiveAt: stays of customers no longer listed end
// then, listed customers not yet members start a stay then. now is the
// caller's clock.
func PutTx(ctx context.Context, tx pgx.Tx, in PutInput, now time.Time) (Change, error) {
	if err := in.Validate(); err != nil {
		return Change{}, err
	}
	now = now.UTC().Truncate(time.Microsecond)
	at := in.EffectiveAt.UTC().Truncate(time.Microsecond)
	if in.EffectiveAt.IsZero() {
		at = now
	}
	if at.After(now) {
		return Change{}, &FieldError{Field: "effective_at", Detail: "must not be in the future"}
	}
	if _, err := tx.Exec(ctx, qLockPool, pgx.NamedArgs{"name": in.Name, "now": now}); err != nil {
		return Change{}, fmt.Errorf("pools: lock pool: %w", err)
	}
	var latest *time.Time
	if err := tx.QueryRow(ctx, qLatestChange, pgx.NamedArgs{"name": in.Name}).Scan(&latest); err != nil {
		return Change{}, fmt.Errorf("pools: read the latest change: %w", err)
	}
	if latest != nil && in.EffectiveAt.IsZero() && at.Before(*latest) {
		// now was read before the lock was waited for: the change that
		// held it came after. This one applies from that instant.
		at = latest.UTC()
	}
	if latest != nil && at.Before(*latest) {
		return Change{}, &FieldError{Field: "effective_at", Detail: fmt.Sprintf("%s is before the pool's latest change at %s",
			at.Format(time.RFC3339Nano), latest.UTC().Format(time.RFC3339Nano))}
	}
	current, err := members(ctx, tx, in.Name)
	if err != nil {
		return Change{}, err
	}
	ch := Change{At: at}
	for _, c := range current {
		if !slices.Contains(in.Members, c) {
			ch.Left = append(ch.Left, c)
		}
	}
	for _, c := range in.Members {
		if !slices.Contains(current, c) {
			ch.Joined = append(ch.Joined, c)
		}
	}
	slices.Sort(ch.Joined)
	if _, err := tx.Exec(ctx, qLeave, pgx.NamedArgs{"pool": in.Name, "customers": ch.Left, "at": at}); err != nil {
		return Change{}, fmt.Errorf("pools: end stays: %w", err)
	}
	if _, err := tx.Exec(ctx, qJoin, pgx.NamedArgs{"pool": in.Name, "customers": ch.Joined, "at": at, "actor": in.Actor}); err != nil {
		return Change{}, fmt.Errorf("pools: start stays: %w", err)
	}
	// A member is a customer, which exists from now on.
	if err := periods.RegisterCustomers(ctx, tx, ch.Joined...); err != nil {
		return Change{}, err
	}
	return ch, nil
}

func members(ctx context.Context, db DBTX, name string) ([]string, error) {
	rows, err := db.Query(ctx, qMembers, pgx.NamedArgs{"pool": name})
	if err != nil {
		return nil, fmt.Errorf("pools: read members: %w", err)
	}
	out, err := pgx.CollectRows(rows, pgx.RowTo[string])
	if err != nil {
		return nil, fmt.Errorf("pools: read members: %w", err)
	}
	return out, nil
}

// Get returns a pool with its current members and its history.
func Get(ctx context.Context, db DBTX, name string) (Pool, error) {
	var p Pool
	err := db.QueryRow(ctx, qPool, pgx.NamedArgs{"name": name}).Scan(&p.Name, &p.CreatedAt, &p.UpdatedAt)
	if errors.Is(err, pgx.ErrNoRows) {
		return Pool{}, validation.NotFound(ErrNotFound, "no pool %q", name)
	}
	if err != nil {
		return Pool{}, fmt.Errorf("pools: read pool: %w", err)
	}
	p.CreatedAt, p.UpdatedAt = p.CreatedAt.UTC(), p.UpdatedAt.UTC()
	if p.Members, err = members(ctx, db, name); err != nil {
		return Pool{}, err
	}
	rows, err := db.Query(ctx, qHistory, pgx.NamedArgs{"pool": name})
	if err != nil {
		return Pool{}, fmt.Errorf("pools: read history: %w", err)
	}
	p.History, err = pgx.CollectRows(rows, func(row pgx.CollectableRow) (Stay, error) {
		var s Stay
		err := row.Scan(&s.Customer, &s.JoinedAt, &s.LeftAt, &s.Actor)
		s.JoinedAt = s.JoinedAt.UTC()
		if s.LeftAt != nil {
			t := s.LeftAt.UTC()
			s.LeftAt = &t
		}
		return s, err
	})
	if err != nil {
		return Pool{}, fmt.Errorf("pools: read history: %w", err)
	}
	return p, nil
}

// List returns every pool with its current members, by name.
func List(ctx context.Context, db DBTX) ([]Pool, error) {
	rows, err := db.Query(ctx, qPools)
	if err != nil {
		return nil, fmt.Errorf("pools: list: %w", err)
	}
	out, err := pgx.CollectRows(rows, func(row pgx.CollectableRow) (Pool, error) {
		var p Pool
		err := row.Scan(&p.Name, &p.CreatedAt, &p.UpdatedAt, &p.Members)
		p.CreatedAt, p.UpdatedAt = p.CreatedAt.UTC(), p.UpdatedAt.UTC()
		return p, err
	})
	if err != nil {
		return nil, fmt.Errorf("pools: list: %w", err)
	}
	return out, nil
}

// Of returns the pools customer belongs to at t, by name.
func Of(ctx context.Context, db DBTX, customer string, t time.Time) ([]string, error) {
	rows, err := db.Query(ctx, qPoolsOf, pgx.NamedArgs{"customer": customer, "at": t})
	if err != nil {
		return nil, fmt.Errorf("pools: pools of %s: %w", customer, err)
	}
	out, err := pgx.CollectRows(rows, pgx.RowTo[string])
	if err != nil {
		return nil, fmt.Errorf("pools: pools of %s: %w", customer, err)
	}
	return out, nil
}
