package quota

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/shopspring/decimal"

	"github.com/tally-ledger/tally/amount"
	"github.com/tally-ledger/tally/internal/ids"
	"github.com/tally-ledger/tally/internal/locks"
)

// Global is the scope of the budget every customer draws from.
const Global = "global"

// PoolScope is the scope of a pool's budget: "pool:<name>".
func PoolScope(pool string) string { return "pool:" + pool }

// CustomerScope is the scope of a customer's own budget: "customer:<id>".
func CustomerScope(customer string) string { return "customer:" + customer }

// ValidPoolName says whether name can name a pool.
func ValidPoolName(name string) bool { return ids.ValidName(name) }

// ValidScope says whether scope is a pool or the global scope (the scopes
// of ScopeRule; a customer's rules are Rule).
func ValidScope(scope string) bool {
	if scope == Global {
		return true
	}
	name, ok := strings.CutPrefix(scope, "pool:")
	return ok && ValidPoolName(name)
}

// ScopeRule is one version of the rule of a pool or of the global scope
// (docs/design.md §13): versioned and insert-only like a customer's Rule.
type ScopeRule struct {
	Scope       string    `json:"scope"`
	Meter       string    `json:"meter"`
	Version     int64     `json:"version"`
	EffectiveAt time.Time `json:"effective_at"`
	// Limit is the period limit; null for a rate rule (Rate).
	Limit     decimal.NullDecimal `json:"limit"`
	Rate      *Rate               `json:"rate,omitempty"`
	MaxSkew   DurationText        `json:"max_skew,omitzero"`
	WarnAt    decimal.Decimal     `json:"warn_at"`
	Mode      Mode                `json:"mode"`
	Admission Admission           `json:"admission"`
	CreatedAt time.Time           `json:"created_at"`
	Actor     string              `json:"actor"`
	Reason    string              `json:"reason,omitempty"`
}

// ScopeRuleInput is a new version of a scope rule. Zero optional fields
// take the defaults of RuleInput (warn_at 0.8, enforce, lagged, now).
type ScopeRuleInput struct {
	Scope     string
	Meter     string
	Limit     decimal.Decimal
	WarnAt    decimal.NullDecimal
	Mode      Mode
	Admission Admission
	// Rate replaces Limit (then zero); MaxSkew goes only with a Rate.
	Rate        *Rate
	MaxSkew     time.Duration
	EffectiveAt time.Time
	Actor       string
	Reason      string
}

// Validate reports every problem of in at once; the errors wrap ErrInvalid.
func (in ScopeRuleInput) Validate() error {
	var errs []error
	if !ValidScope(in.Scope) {
		errs = append(errs, fmt.Errorf("%w: scope: %q must be %q or pool:<name> (1-128 characters of [A-Za-z0-9._-])", ErrInvalid, in.Scope, Global))
	}
	// The rest is a customer rule's validation, with a placeholder customer.
	r := RuleInput{Customer: "scope", Meter: in.Meter, Limit: in.Limit, WarnAt: in.WarnAt, Mode: in.Mode,
		Admission: in.Admission, Actor: in.Actor, Rate: in.Rate, MaxSkew: in.MaxSkew}
	if err := r.Validate(); err != nil {
		errs = append(errs, err)
	}
	return errors.Join(errs...)
}

// PutScopeRule stores in as the next version of its scope rule inside tx.
// Like PutRule, it never touches usage or consumed: a lower limit stops new
// grants while live ones run out, a higher one frees capacity at once.
func PutScopeRule(ctx context.Context, tx pgx.Tx, in ScopeRuleInput) (ScopeRule, error) {
	return putScopeRule(ctx, tx, in, time.Now)
}

// PutScopeRuleAt is PutScopeRule at the instant now (tests).
func PutScopeRuleAt(ctx context.Context, tx pgx.Tx, in ScopeRuleInput, now time.Time) (ScopeRule, error) {
	return putScopeRule(ctx, tx, in, func() time.Time { return now })
}

// PutScopeRuleClock is PutScopeRule with the caller's clock (the API, whose
// clock is configurable), read once the rule's lock is held.
func PutScopeRuleClock(ctx context.Context, tx pgx.Tx, in ScopeRuleInput, clock func() time.Time) (ScopeRule, error) {
	return putScopeRule(ctx, tx, in, clock)
}

// putScopeRule reads clock once it holds the rule's lock, as putRule.
func putScopeRule(ctx context.Context, tx pgx.Tx, in ScopeRuleInput, clock func() time.Time) (ScopeRule, error) {
	if err := in.Validate(); err != nil {
		return ScopeRule{}, err
	}
	if err := requireCounter(ctx, tx, in.Meter); err != nil {
		return ScopeRule{}, err
	}
	if _, err := tx.Exec(ctx, qLockRule, locks.QuotaRule, "scope/"+in.Scope+"/"+in.Meter); err != nil {
		return ScopeRule{}, fmt.Errorf("quota: lock scope rule: %w", err)
	}
	now := clock().UTC().Truncate(time.Microsecond)
	d := RuleInput{WarnAt: in.WarnAt, Mode: in.Mode, Admission: in.Admission, EffectiveAt: in.EffectiveAt}.withDefaults(now)
	var prev int64
	var inForce *time.Time
	if err := tx.QueryRow(ctx, qScopeLatestVersion, pgx.NamedArgs{"scope": in.Scope, "meter": in.Meter, "now": now}).
		Scan(&prev, &inForce); err != nil {
		return ScopeRule{}, fmt.Errorf("quota: read scope rule versions: %w", err)
	}
	if inForce != nil && d.EffectiveAt.Before(*inForce) {
		return ScopeRule{}, fmt.Errorf("%w: effective_at: %s is before %s, the effective time of the version in force, so it would never take effect",
			ErrInvalid, d.EffectiveAt.Format(time.RFC3339Nano), inForce.UTC().Format(time.RFC3339Nano))
	}
	r := ScopeRule{Scope: in.Scope, Meter: in.Meter, Version: prev + 1, EffectiveAt: d.EffectiveAt,
		Rate: in.Rate, MaxSkew: DurationText(in.MaxSkew),
		WarnAt: d.WarnAt.Decimal, Mode: d.Mode, Admission: d.Admission, CreatedAt: now, Actor: in.Actor, Reason: in.Reason}
	var limit *string
	if in.Rate == nil {
		if err := amount.Check(in.Limit); err != nil {
			return ScopeRule{}, fmt.Errorf("%w: limit: %v", ErrInvalid, err)
		}
		r.Limit = decimal.NewNullDecimal(in.Limit)
		v := in.Limit.String()
		limit = &v
	}
	rateAmount, rateBurst, ratePer, maxSkew := rateColumns(in.Rate, in.MaxSkew)
	if _, err := tx.Exec(ctx, qInsertScopeRule, pgx.NamedArgs{"scope": r.Scope, "meter": r.Meter, "version": r.Version,
		"effective_at": r.EffectiveAt, "limit": limit, "warn_at": r.WarnAt.String(), "mode": string(r.Mode),
		"admission": string(r.Admission), "created_at": r.CreatedAt, "actor": r.Actor, "reason": r.Reason,
		"rate_amount": rateAmount, "rate_burst": rateBurst, "rate_per": ratePer, "max_skew": maxSkew}); err != nil {
		return ScopeRule{}, fmt.Errorf("quota: insert scope rule: %w", err)
	}
	return r, nil
}

// ScopeRules returns the rule in force at t of each meter of scope, by meter.
func ScopeRules(ctx context.Context, db DBTX, scope string, t time.Time) ([]ScopeRule, error) {
	rows, err := db.Query(ctx, qScopeRules, pgx.NamedArgs{"scope": scope, "now": t})
	if err != nil {
		return nil, fmt.Errorf("quota: read scope rules: %w", err)
	}
	rs, err := pgx.CollectRows(rows, func(row pgx.CollectableRow) (ScopeRule, error) { return scanScopeRule(row) })
	if err != nil {
		return nil, fmt.Errorf("quota: read scope rules: %w", err)
	}
	return rs, nil
}

func scanScopeRule(row pgx.Row) (ScopeRule, error) {
	var r ScopeRule
	var warn, mode, admission string
	var limit, rateAmount, rateBurst *string
	var ratePer, maxSkew *int64
	if err := row.Scan(&r.Scope, &r.Meter, &r.Version, &r.EffectiveAt, &limit, &warn, &mode, &admission,
		&r.CreatedAt, &r.Actor, &r.Reason, &rateAmount, &rateBurst, &ratePer, &maxSkew); err != nil {
		return ScopeRule{}, err
	}
	var err error
	if limit != nil {
		v, err := decimal.NewFromString(*limit)
		if err != nil {
			return ScopeRule{}, fmt.Errorf("stored limit %q: %w", *limit, err)
		}
		r.Limit = decimal.NewNullDecimal(v)
	}
	if r.Rate, r.MaxSkew, err = scanRate(rateAmount, rateBurst, ratePer, maxSkew); err != nil {
		return ScopeRule{}, err
	}
	if r.WarnAt, err = decimal.NewFromString(warn); err != nil {
		return ScopeRule{}, fmt.Errorf("stored warn_at %q: %w", warn, err)
	}
	r.Mode, r.Admission = Mode(mode), Admission(admission)
	r.EffectiveAt, r.CreatedAt = r.EffectiveAt.UTC(), r.CreatedAt.UTC()
	return r, nil
}
