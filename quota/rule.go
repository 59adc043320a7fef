package quota

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/shopspring/decimal"

	"github.com/tally-ledger/tally/amount"
	"github.com/tally-ledger/tally/internal/ids"
	"github.com/tally-ledger/tally/internal/locks"
	"github.com/tally-ledger/tally/ledger"
	"github.com/tally-ledger/tally/periods"
	"github.com/tally-ledger/tally/validation"
)

// Mode says whether gateways should act on a rule's decisions.
type Mode string

// Modes of a rule.
const (
	// Enforce: gateways block while exceeded.
	Enforce Mode = "enforce"
	// Shadow: decisions say what enforce would do; gateways only observe.
	Shadow Mode = "shadow"
)

// OnStale is what a gateway does once a decision is older than stale_after.
type OnStale string

// Stale policies.
const (
	Allow OnStale = "allow"
	Deny  OnStale = "deny"
)

// Admission says how gateways admit requests under a rule.
type Admission string

// Admission modes of a rule.
const (
	// Lagged: gateways act on published decisions (the default).
	Lagged Admission = "lagged"
	// Exact: gateways admit only from grants leased by the admission package,
	// so everything all gateways may admit stays within the limit.
	Exact Admission = "exact"
)

// OnUnreachable is what a gateway does under an exact rule when it cannot
// reach Tally for a grant: deny (fail closed), local (at most LocalAmount
// per LocalEvery per holder), or allow (fail open).
type OnUnreachable string

// Unreachable policies.
const (
	UnreachableDeny  OnUnreachable = "deny"
	UnreachableLocal OnUnreachable = "local"
	UnreachableAllow OnUnreachable = "allow"
)

// Defaults of a rule (docs/design.md §5).
var (
	DefaultWarnAt     = decimal.RequireFromString("0.8")
	DefaultStaleAfter = 5 * time.Minute
)

// Errors of the rules API. The REST layer maps them to HTTP statuses.
var (
	// ErrNotFound: no rule for that customer and meter (404).
	ErrNotFound = errors.New("quota: no such rule")
	// ErrInvalid wraps every validation error of an input (422/400).
	ErrInvalid = errors.New("quota: invalid input")
	// ErrNotLeader: the enforcer lost its lease while writing.
	ErrNotLeader = errors.New("quota: not the enforcer leader")
)

// DBTX is what reads need of a pool, a connection or a transaction.
type DBTX interface {
	Query(ctx context.Context, sql string, args ...any) (pgx.Rows, error)
	QueryRow(ctx context.Context, sql string, args ...any) pgx.Row
	Exec(ctx context.Context, sql string, args ...any) (pgconn.CommandTag, error)
}

// Rule is one version of a quota rule.
type Rule struct {
	Customer    string    `json:"customer"`
	Meter       string    `json:"meter"`
	Version     int64     `json:"version"`
	EffectiveAt time.Time `json:"effective_at"`
	// Limit is the period limit; null for a rate rule (Rate).
	Limit decimal.NullDecimal `json:"limit"`
	// Rate (docs/design.md §17): a rate contract instead of a period
	// limit, with MaxSkew its own reclaim margin (zero: the deployment's).
	Rate       *Rate           `json:"rate,omitempty"`
	MaxSkew    DurationText    `json:"max_skew,omitzero"`
	WarnAt     decimal.Decimal `json:"warn_at"`
	Mode       Mode            `json:"mode"`
	OnStale    OnStale         `json:"on_stale"`
	StaleAfter DurationText    `json:"stale_after"`
	// Admission: lagged (default) or exact; OnUnreachable applies to exact
	// rules, with LocalAmount per LocalEvery when it is local.
	Admission     Admission           `json:"admission"`
	OnUnreachable OnUnreachable       `json:"on_unreachable"`
	LocalAmount   decimal.NullDecimal `json:"local_amount,omitzero"`
	LocalEvery    DurationText        `json:"local_every,omitzero"`
	CreatedAt     time.Time           `json:"created_at"`
	Actor         string              `json:"actor"`
	Reason        string              `json:"reason,omitempty"`
}

// RuleInput is a new version of a rule. Zero optional fields take the
// defaults: WarnAt 0.8, Mode enforce, OnStale allow, StaleAfter 5m,
// EffectiveAt now.
type RuleInput struct {
	Customer   string
	Meter      string
	Limit      decimal.Decimal
	WarnAt     decimal.NullDecimal
	Mode       Mode
	OnStale    OnStale
	StaleAfter time.Duration
	// Admission defaults to lagged, OnUnreachable to deny; LocalAmount and
	// LocalEvery are required exactly when OnUnreachable is local.
	Admission     Admission
	OnUnreachable OnUnreachable
	LocalAmount   decimal.NullDecimal
	LocalEvery    time.Duration
	// Rate replaces Limit (which must then be zero) with a rate contract;
	// MaxSkew (rate rules only, optional) is its reclaim margin.
	Rate        *Rate
	MaxSkew     time.Duration
	EffectiveAt time.Time // zero: now
	Actor       string    // who made the change (required)
	Reason      string
}

// Validate reports every problem of in at once, each naming its field:
// ErrInvalid wrapping errors.Join of *validation.FieldError.
func (in RuleInput) Validate() error {
	return invalid(in.problems()...)
}

// invalid is ErrInvalid wrapping the field errors errs, or nil if there
// are none.
func invalid(errs ...error) error {
	if len(errs) == 0 {
		return nil
	}
	return fmt.Errorf("%w: %w", ErrInvalid, errors.Join(errs...))
}

func (in RuleInput) problems() []error {
	var errs []error
	bad := func(field, format string, args ...any) {
		errs = append(errs, validation.Errorf(field, format, args...))
	}
	switch {
	case !ids.Valid(in.Customer):
		bad("customer", "%q must be "+ids.Rule, in.Customer)
	case in.Customer == Global || strings.HasPrefix(in.Customer, "pool:"):
		// Scope decisions are published under "<scope>/<meter>": a
		// customer rule here would share their key.
		bad("customer", "%q is reserved for the global and pool budgets' decisions; a customer with this id can be metered but not given a quota rule", in.Customer)
	}
	if !ids.Valid(in.Meter) {
		bad("meter", "%q must be "+ids.Rule, in.Meter)
	}
	if in.Limit.IsNegative() {
		bad("limit", "%s is negative", in.Limit)
	} else if err := amount.Check(in.Limit); err != nil {
		bad("limit", "%v", err)
	}
	if in.WarnAt.Valid && (!in.WarnAt.Decimal.IsPositive() || in.WarnAt.Decimal.GreaterThan(decimal.NewFromInt(1))) {
		bad("warn_at", "%s must be a fraction in (0, 1]", in.WarnAt.Decimal)
	} else if in.WarnAt.Valid && amount.Check(in.WarnAt.Decimal) != nil {
		// Digits that count, as for every decimal: "0.8000000000" is 0.8
		// (its exponent says ten digits, of which one counts).
		bad("warn_at", "%s has more than %d digits after the point", in.WarnAt.Decimal, amount.MaxScale)
	}
	switch in.Mode {
	case "", Enforce, Shadow:
	default:
		bad("mode", "%q must be %q or %q", in.Mode, Enforce, Shadow)
	}
	switch in.OnStale {
	case "", Allow, Deny:
	default:
		bad("on_stale", "%q must be %q or %q", in.OnStale, Allow, Deny)
	}
	if in.StaleAfter < 0 || in.StaleAfter%time.Second != 0 {
		errs = append(errs, durationOutOfRange("stale_after", in.StaleAfter, SecondsRange))
	}
	switch in.Admission {
	case "", Lagged, Exact:
	default:
		bad("admission", "%q must be %q or %q", in.Admission, Lagged, Exact)
	}
	if in.Admission != Exact && (in.OnUnreachable == UnreachableAllow || in.OnUnreachable == UnreachableLocal) {
		// Gateways answer a lagged rule from its decisions (on_stale when
		// they are old); on_unreachable would never apply. deny, the
		// default, is accepted so a rule read back can be written again.
		bad("on_unreachable", "applies only to exact rules (admission %q); a lagged rule's gateways follow on_stale", Exact)
	}
	switch in.OnUnreachable {
	case "", UnreachableDeny, UnreachableAllow:
		if in.LocalAmount.Valid || in.LocalEvery != 0 {
			bad("on_unreachable", "local_amount and local_every go only with %q", UnreachableLocal)
		}
	case UnreachableLocal:
		if !in.LocalAmount.Valid || in.LocalAmount.Decimal.IsNegative() {
			bad("local_amount", "a non-negative amount is required with on_unreachable %q", UnreachableLocal)
		} else if err := amount.Check(in.LocalAmount.Decimal); err != nil {
			bad("local_amount", "%v", err)
		}
		switch {
		case in.LocalEvery == 0:
			bad("local_every", "is required with on_unreachable %q: %s", UnreachableLocal, SecondsRange)
		case in.LocalEvery < 0 || in.LocalEvery%time.Second != 0:
			errs = append(errs, durationOutOfRange("local_every", in.LocalEvery, SecondsRange))
		}
	default:
		bad("on_unreachable", "%q must be %q, %q or %q", in.OnUnreachable, UnreachableDeny, UnreachableLocal, UnreachableAllow)
	}
	if in.Actor == "" {
		bad("actor", "is required (who is changing the quota)")
	}
	return append(errs, rateProblems(in.Rate, !in.Limit.IsZero(), in.Admission, in.MaxSkew)...)
}

func (in RuleInput) withDefaults(now time.Time) RuleInput {
	if !in.WarnAt.Valid {
		in.WarnAt = decimal.NewNullDecimal(DefaultWarnAt)
	}
	if in.Mode == "" {
		in.Mode = Enforce
	}
	if in.OnStale == "" {
		in.OnStale = Allow
	}
	if in.StaleAfter == 0 {
		in.StaleAfter = DefaultStaleAfter
	}
	if in.Admission == "" {
		in.Admission = Lagged
	}
	if in.OnUnreachable == "" {
		in.OnUnreachable = UnreachableDeny
	}
	if in.EffectiveAt.IsZero() {
		in.EffectiveAt = now
	}
	in.EffectiveAt = in.EffectiveAt.UTC().Truncate(time.Microsecond)
	return in
}

// PutRule stores in as the next version of its rule, inside tx, and returns
// it. It never touches usage: the new version applies to usage counted from
// the period start, so lowering the limit below usage is exceeded at the
// enforcer's next evaluation.
//
// The version in force is the one with the latest effective time that has
// come, the highest version among equal times: so a change effective now
// takes effect at once even when a version is scheduled for later (which
// still takes effect at its time). EffectiveAt may lie in the future, but
// not before the effective time of the version in force, where it would
// never take effect.
func PutRule(ctx context.Context, tx pgx.Tx, in RuleInput) (Rule, error) {
	return putRule(ctx, tx, in, time.Now)
}

// putRule reads clock once it holds the rule's lock: a version without
// effective_at takes effect then, after any version it waited for.
func putRule(ctx context.Context, tx pgx.Tx, in RuleInput, clock func() time.Time) (Rule, error) {
	if err := in.Validate(); err != nil {
		return Rule{}, err
	}
	if err := requireLaggedUnlessCounter(ctx, tx, in); err != nil {
		return Rule{}, err
	}
	// Serialise versions of one rule: the next version number and the
	// effective-time check read the previous version under this lock.
	if _, err := tx.Exec(ctx, qLockRule, locks.QuotaRule, in.Customer+"/"+in.Meter); err != nil {
		return Rule{}, fmt.Errorf("quota: lock rule: %w", err)
	}
	now := clock().UTC().Truncate(time.Microsecond)
	in = in.withDefaults(now)
	var prevVersion int64
	var inForceVersion *int64
	var inForce *time.Time
	if err := tx.QueryRow(ctx, qLatestVersion, in.Customer, in.Meter, now).Scan(&prevVersion, &inForceVersion, &inForce); err != nil {
		return Rule{}, fmt.Errorf("quota: read rule versions: %w", err)
	}
	// A version dated before the one in force would never be in force.
	if inForce != nil && in.EffectiveAt.Before(*inForce) {
		return Rule{}, invalid(validation.Errorf("effective_at", "%s is before %s, the effective time of version %d (in force), so it would never take effect",
			in.EffectiveAt.Format(time.RFC3339Nano), inForce.UTC().Format(time.RFC3339Nano), *inForceVersion))
	}
	r := Rule{
		Customer: in.Customer, Meter: in.Meter, Version: prevVersion + 1,
		EffectiveAt: in.EffectiveAt, Limit: decimal.NewNullDecimal(in.Limit), Rate: in.Rate, MaxSkew: DurationText(in.MaxSkew),
		WarnAt: in.WarnAt.Decimal,
		Mode:   in.Mode, OnStale: in.OnStale, StaleAfter: DurationText(in.StaleAfter),
		Admission: in.Admission, OnUnreachable: in.OnUnreachable,
		LocalAmount: in.LocalAmount, LocalEvery: DurationText(in.LocalEvery),
		CreatedAt: now, Actor: in.Actor, Reason: in.Reason,
	}
	var limit *string
	if in.Rate == nil {
		v := in.Limit.String()
		limit = &v
	} else {
		r.Limit = decimal.NullDecimal{}
	}
	rateAmount, rateBurst, ratePer, maxSkew := rateColumns(in.Rate, in.MaxSkew)
	var localAmount *string
	if in.LocalAmount.Valid {
		v := in.LocalAmount.Decimal.String()
		localAmount = &v
	}
	_, err := tx.Exec(ctx, qInsertRule, r.Customer, r.Meter, r.Version, r.EffectiveAt,
		limit, r.WarnAt.String(), string(r.Mode), string(r.OnStale),
		int64(in.StaleAfter/time.Second), r.CreatedAt, r.Actor, r.Reason,
		string(r.Admission), string(r.OnUnreachable), localAmount, int64(in.LocalEvery/time.Second),
		rateAmount, rateBurst, ratePer, maxSkew)
	if err != nil {
		return Rule{}, fmt.Errorf("quota: insert rule: %w", err)
	}
	// The rule refers to its customer, which exists from now on (last, so
	// no lock is awaited while its row is new).
	if err := periods.RegisterCustomers(ctx, tx, r.Customer); err != nil {
		return Rule{}, err
	}
	return r, nil
}

// meterKindLocked is meter's kind, read holding locks.MeterKinds shared
// until tx ends, so that a declaration turning the meter into another kind
// (which takes it exclusively, then looks for rules: MeterHasRules) is
// ordered with the rule being written.
func meterKindLocked(ctx context.Context, tx pgx.Tx, meter string) (ledger.MeterKind, error) {
	if _, err := tx.Exec(ctx, qLockMeterKindsShared, locks.MeterKinds); err != nil {
		return "", fmt.Errorf("quota: lock meter kinds: %w", err)
	}
	m, err := ledger.MeterByName(ctx, tx, meter)
	return m.Kind, err
}

// requireCounter refuses a scope rule on a gauge or unique meter: pools
// and the global budget sum their members' counters, and a peak or a
// distinct count is not a sum (docs/design.md §16).
func requireCounter(ctx context.Context, tx pgx.Tx, meter string) error {
	kind, err := meterKindLocked(ctx, tx, meter)
	if err != nil || kind == ledger.Counter {
		return err
	}
	return invalid(validation.Errorf("meter", "%q is a %s meter: pool and global rules (lagged or exact) sum their members' usage, so they apply to counters only", meter, kind))
}

// requireLaggedUnlessCounter admits a customer rule on a gauge or unique
// meter only lagged and with a period limit: it limits the gauge's period
// max or the unique meter's distinct members, the aggregate the kind
// implies (docs/design.md §16); exact admission and rate rules draw from a
// running total, which only counters have.
func requireLaggedUnlessCounter(ctx context.Context, tx pgx.Tx, in RuleInput) error {
	kind, err := meterKindLocked(ctx, tx, in.Meter)
	if err != nil || kind == ledger.Counter {
		return err
	}
	switch {
	case in.Rate != nil:
		return invalid(validation.Errorf("rate", "%q is a %s meter: rate rules draw from a running total, which only counters have", in.Meter, kind))
	case in.Admission == Exact:
		return invalid(validation.Errorf("admission", "%q is a %s meter: exact admission draws from a running total, which only counters have; a lagged rule limits its %s", in.Meter, kind, aggregateOf(kind)))
	}
	return nil
}

// aggregateOf names what a lagged rule limits on a meter of kind k.
func aggregateOf(k ledger.MeterKind) string {
	switch k {
	case ledger.Gauge:
		return "period max"
	case ledger.Unique:
		return "distinct members per period"
	}
	return "period total"
}

// MeterHasRules reports whether any customer, pool or global quota rule
// was ever written for meter: such a meter stays a counter
// (docs/design.md §16). Call it inside the transaction that declares the
// meter, after the declaration took locks.MeterKinds exclusively.
func MeterHasRules(ctx context.Context, db DBTX, meter string) (bool, error) {
	var has bool
	if err := db.QueryRow(ctx, qMeterHasRules, meter).Scan(&has); err != nil {
		return false, fmt.Errorf("quota: rules of meter %q: %w", meter, err)
	}
	return has, nil
}

// Rules returns the current rule of each of customer's meters (of the
// versions whose effective time has come, the latest effective, then the
// highest version), ordered by meter.
func Rules(ctx context.Context, db DBTX, customer string) ([]Rule, error) {
	return RulesAt(ctx, db, customer, time.Now())
}

// RulesAt is Rules as of t: the rule of each meter in force at t.
func RulesAt(ctx context.Context, db DBTX, customer string, t time.Time) ([]Rule, error) {
	return queryRules(ctx, db, qCurrentRules, customer, t)
}

// RuleHistory returns every version of a rule, oldest first, including
// versions not yet effective. ErrNotFound when there is none.
func RuleHistory(ctx context.Context, db DBTX, customer, meter string) ([]Rule, error) {
	rs, err := queryRules(ctx, db, qRuleHistory, customer, meter)
	if err != nil {
		return nil, err
	}
	if len(rs) == 0 {
		return nil, fmt.Errorf("%w: %s/%s", ErrNotFound, customer, meter)
	}
	return rs, nil
}

// LatestRuleVersions returns the latest n versions of a rule, newest
// first: a rule changed every day has thousands. Versions are numbered
// from 1, so the newest's Version is how many there are. ErrNotFound when
// there is none.
func LatestRuleVersions(ctx context.Context, db DBTX, customer, meter string, n int) ([]Rule, error) {
	rs, err := queryRules(ctx, db, qRuleHistoryLatest, customer, meter, n)
	if err != nil {
		return nil, err
	}
	if len(rs) == 0 {
		return nil, fmt.Errorf("%w: %s/%s", ErrNotFound, customer, meter)
	}
	return rs, nil
}

func queryRules(ctx context.Context, db DBTX, q string, args ...any) ([]Rule, error) {
	rows, err := db.Query(ctx, q, args...)
	if err != nil {
		return nil, fmt.Errorf("quota: read rules: %w", err)
	}
	rs, err := pgx.CollectRows(rows, func(row pgx.CollectableRow) (Rule, error) { return scanRule(row) })
	if err != nil {
		return nil, fmt.Errorf("quota: read rules: %w", err)
	}
	return rs, nil
}

// ruleColumns is the column list every rule query selects, in scanRule's order.
const ruleColumns = `customer, meter, version, effective_at, "limit"::text, warn_at::text, mode, on_stale,
       extract(epoch FROM stale_after)::bigint, created_at, actor, reason,
       admission, on_unreachable, local_amount::text, coalesce(extract(epoch FROM local_every)::bigint, 0),
       ` + rateSelect

func scanRule(row pgx.Row, extra ...any) (Rule, error) {
	var r Rule
	var warn, mode, onStale string
	var limit, rateAmount, rateBurst *string
	var ratePer, maxSkew *int64
	var staleSec, localSec int64
	var admission, onUnreachable string
	var localAmount *string
	dest := append([]any{&r.Customer, &r.Meter, &r.Version, &r.EffectiveAt, &limit, &warn, &mode, &onStale,
		&staleSec, &r.CreatedAt, &r.Actor, &r.Reason, &admission, &onUnreachable, &localAmount, &localSec,
		&rateAmount, &rateBurst, &ratePer, &maxSkew}, extra...)
	if err := row.Scan(dest...); err != nil {
		return Rule{}, err
	}
	var err error
	if limit != nil {
		v, err := decimal.NewFromString(*limit)
		if err != nil {
			return Rule{}, fmt.Errorf("stored limit %q: %w", *limit, err)
		}
		r.Limit = decimal.NewNullDecimal(v)
	}
	if r.Rate, r.MaxSkew, err = scanRate(rateAmount, rateBurst, ratePer, maxSkew); err != nil {
		return Rule{}, err
	}
	if r.WarnAt, err = decimal.NewFromString(warn); err != nil {
		return Rule{}, fmt.Errorf("stored warn_at %q: %w", warn, err)
	}
	r.Mode, r.OnStale, r.StaleAfter = Mode(mode), OnStale(onStale), DurationText(time.Duration(staleSec)*time.Second)
	r.Admission, r.OnUnreachable = Admission(admission), OnUnreachable(onUnreachable)
	r.LocalEvery = DurationText(time.Duration(localSec) * time.Second)
	if localAmount != nil {
		v, err := decimal.NewFromString(*localAmount)
		if err != nil {
			return Rule{}, fmt.Errorf("stored local_amount %q: %w", *localAmount, err)
		}
		r.LocalAmount = decimal.NewNullDecimal(v)
	}
	r.EffectiveAt, r.CreatedAt = r.EffectiveAt.UTC(), r.CreatedAt.UTC()
	return r, nil
}

// Duration is a time.Duration that is a whole number of seconds in JSON
// ("stale_after": 300). On input it also accepts a Go duration string ("5m").
type Duration time.Duration

// MarshalJSON writes whole seconds.
func (d Duration) MarshalJSON() ([]byte, error) {
	return strconv.AppendInt(nil, int64(time.Duration(d)/time.Second), 10), nil
}

// UnmarshalJSON reads seconds (an integer) or a Go duration string.
func (d *Duration) UnmarshalJSON(b []byte) error {
	var s string
	if err := json.Unmarshal(b, &s); err == nil {
		v, err := time.ParseDuration(s)
		if err != nil {
			return fmt.Errorf("duration %q: %w", s, err)
		}
		*d = Duration(v)
		return nil
	}
	n, err := strconv.ParseInt(string(b), 10, 64)
	if err != nil || n < 0 || n > int64(1<<62/time.Second) {
		return fmt.Errorf("duration %s: want whole seconds or a string like \"5m\"", b)
	}
	*d = Duration(time.Duration(n) * time.Second)
	return nil
}

// DurationText is a rule's duration in JSON: written as a duration string
// such as "5m" or "1h30m" (the form the API takes), read as one or as
// whole seconds. Decisions keep Duration (seconds): their wire format on
// tally.quota-decisions is read by gateways in any language.
type DurationText time.Duration

// MarshalJSON writes the shortest duration string: "1m", not "1m0s".
func (d DurationText) MarshalJSON() ([]byte, error) {
	return json.Marshal(FormatDuration(time.Duration(d)))
}

// UnmarshalJSON reads a duration string or whole seconds, as Duration.
func (d *DurationText) UnmarshalJSON(b []byte) error {
	var v Duration
	if err := v.UnmarshalJSON(b); err != nil {
		return err
	}
	*d = DurationText(v)
	return nil
}

// FormatDuration is d as Go writes it without zero units: "1m", "1h30m",
// "90ms", "0s".
func FormatDuration(d time.Duration) string {
	s := d.String()
	if strings.HasSuffix(s, "m0s") {
		s = strings.TrimSuffix(s, "0s")
	}
	if strings.HasSuffix(s, "h0m") {
		s = strings.TrimSuffix(s, "0m")
	}
	return s
}
