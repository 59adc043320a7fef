package alerts

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/shopspring/decimal"

	"github.com/tally-ledger/tally/amount"
	"github.com/tally-ledger/tally/internal/ids"
	"github.com/tally-ledger/tally/internal/locks"
	"github.com/tally-ledger/tally/quota"
	"github.com/tally-ledger/tally/validation"
)

// Errors.
var (
	ErrNotFound = errors.New("alerts: not found")
	ErrInvalid  = errors.New("alerts: invalid input")
)

// Event types and the transitions they name.
const (
	Triggered = "triggered"
	Resolved  = "resolved"

	TypeTriggered = "alert.triggered"
	TypeResolved  = "alert.resolved"
)

// Subjects that are not a single customer or pool.
const (
	SubjectGlobal    = "global"
	SubjectCustomers = "customers" // every customer, each on its own
)

// DBTX is what reads need of a pool, a connection or a transaction.
type DBTX = quota.DBTX

// Threshold is one threshold of a rule: an absolute Value, or a Percent of
// the quota limit in force for the subject and meter.
type Threshold struct {
	Value   *decimal.Decimal `json:"value,omitempty"`
	Percent *decimal.Decimal `json:"percent,omitempty"`
}

// Key names the threshold in states and event ids: "value:100",
// "percent:80".
func (t Threshold) Key() string {
	if t.Percent != nil {
		return "percent:" + t.Percent.String()
	}
	if t.Value != nil {
		return "value:" + t.Value.String()
	}
	return ""
}

// At is the usage the threshold stands for given the limit in force (nil:
// none); ok is false for a percent threshold without a limit.
func (t Threshold) At(limit *decimal.Decimal) (decimal.Decimal, bool) {
	if t.Value != nil {
		return *t.Value, true
	}
	if t.Percent == nil || limit == nil {
		return decimal.Zero, false
	}
	// A percent is exact over a hundred as a shift of the point; Div
	// would round to 16 places, and usage just under the threshold could
	// trigger it.
	return limit.Mul(*t.Percent).Shift(-2), true
}

// Rule is one version of an alert rule.
type Rule struct {
	Name              string          `json:"name"`
	Version           int64           `json:"version"`
	Subject           string          `json:"subject"`
	Meter             string          `json:"meter"`
	Thresholds        []Threshold     `json:"thresholds"`
	NotifyOn          []string        `json:"notify_on"`
	HysteresisPercent decimal.Decimal `json:"hysteresis_percent"`
	Endpoints         []string        `json:"endpoints"`
	CreatedAt         time.Time       `json:"created_at"`
	Actor             string          `json:"actor"`
	Deleted           bool            `json:"deleted,omitempty"`
}

// Notifies says whether the rule sends events of transition kind
// (Triggered or Resolved).
func (r Rule) Notifies(kind string) bool { return slices.Contains(r.NotifyOn, kind) }

// RuleInput is a new version of a rule (PUT /v1/alerts/{name}).
type RuleInput struct {
	Name              string           `json:"-"`
	Subject           string           `json:"subject"`
	Meter             string           `json:"meter"`
	Thresholds        []Threshold      `json:"thresholds"`
	NotifyOn          []string         `json:"notify_on"`
	HysteresisPercent *decimal.Decimal `json:"hysteresis_percent"`
	Endpoints         []string         `json:"endpoints"`
	Actor             string           `json:"actor"`
}

// MaxThresholds and MaxEndpoints bound a rule.
const (
	MaxThresholds = 10
	MaxEndpoints  = 10
)

// Validate reports every problem of in at once: ErrInvalid wrapping
// errors.Join of *validation.FieldError.
func (in RuleInput) Validate() error {
	var errs []error
	bad := func(field, format string, args ...any) {
		errs = append(errs, validation.Errorf(field, format, args...))
	}
	if !ids.ValidName(in.Name) {
		bad("name", "%q must be "+ids.NameRule, in.Name)
	}
	if err := checkSubject(in.Subject); err != "" {
		bad("subject", "%s", err)
	}
	if !ids.Valid(in.Meter) {
		bad("meter", "%q must be "+ids.Rule, in.Meter)
	}
	switch n := len(in.Thresholds); {
	case n == 0:
		bad("thresholds", "at least one threshold is required: {\"value\": \"1000\"} or {\"percent\": \"80\"}")
	case n > MaxThresholds:
		bad("thresholds", "%d thresholds; at most %d", n, MaxThresholds)
	}
	seen := map[string]bool{}
	for i, t := range in.Thresholds {
		f := fmt.Sprintf("thresholds[%d]", i)
		switch {
		case (t.Value == nil) == (t.Percent == nil):
			bad(f, "exactly one of value and percent")
			continue
		case t.Value != nil && !t.Value.IsPositive():
			bad(f+".value", "%s must be positive", t.Value)
		case t.Value != nil && amount.Check(*t.Value) != nil:
			bad(f+".value", "%v", amount.Check(*t.Value))
		case t.Percent != nil && (!t.Percent.IsPositive() || t.Percent.GreaterThan(decimal.NewFromInt(1000))):
			bad(f+".percent", "%s must be in (0, 1000]", t.Percent)
		case t.Percent != nil && t.Percent.Shift(6).Truncate(0).Cmp(t.Percent.Shift(6)) != 0:
			// Digits that count: "80.0000000" is 80 (trailing zeros are no
			// digits, as amount.Check reads every decimal).
			bad(f+".percent", "%s has more than 6 digits after the point", t.Percent)
		}
		if seen[t.Key()] {
			bad(f, "repeats threshold %s", t.Key())
		}
		seen[t.Key()] = true
	}
	if in.NotifyOn != nil && len(in.NotifyOn) == 0 {
		bad("notify_on", "is empty; leave it out for both %q and %q", Triggered, Resolved)
	}
	for i, k := range in.NotifyOn {
		switch {
		case k != Triggered && k != Resolved:
			bad(fmt.Sprintf("notify_on[%d]", i), "%q must be %q or %q", k, Triggered, Resolved)
		case slices.Contains(in.NotifyOn[:i], k):
			bad(fmt.Sprintf("notify_on[%d]", i), "repeats %q", k)
		}
	}
	if h := in.HysteresisPercent; h != nil && (h.IsNegative() || !h.LessThan(decimal.NewFromInt(100))) {
		bad("hysteresis_percent", "%s must be in [0, 100)", h)
	}
	if len(in.Endpoints) > MaxEndpoints {
		bad("endpoints", "%d endpoints; at most %d", len(in.Endpoints), MaxEndpoints)
	}
	for i, e := range in.Endpoints {
		switch {
		case !ids.ValidName(e):
			bad(fmt.Sprintf("endpoints[%d]", i), "%q is not a webhook name (PUT /v1/webhooks/{name})", e)
		case slices.Contains(in.Endpoints[:i], e):
			bad(fmt.Sprintf("endpoints[%d]", i), "repeats endpoint %q", e)
		}
	}
	if in.Actor == "" {
		bad("actor", "is required")
	}
	if len(errs) == 0 {
		return nil
	}
	return fmt.Errorf("%w: %w", ErrInvalid, errors.Join(errs...))
}

// checkSubject returns what is wrong with s, or "".
func checkSubject(s string) string {
	switch {
	case s == SubjectGlobal || s == SubjectCustomers:
		return ""
	case strings.HasPrefix(s, "customer:"):
		if id := strings.TrimPrefix(s, "customer:"); !ids.Valid(id) {
			return fmt.Sprintf("customer id %q must be "+ids.Rule, id)
		}
		return ""
	case strings.HasPrefix(s, "pool:"):
		if !quota.ValidPoolName(strings.TrimPrefix(s, "pool:")) {
			return fmt.Sprintf("pool name in %q must be "+ids.NameRule, s)
		}
		return ""
	}
	return fmt.Sprintf("%q must be customer:<id>, pool:<name>, global or customers", s)
}

const ruleColumns = `name, version, subject, meter, thresholds, notify_on, hysteresis_percent::text, endpoints, created_at, actor, deleted`

func scanRule(row pgx.Row) (Rule, error) {
	var r Rule
	var th []byte
	var h string
	if err := row.Scan(&r.Name, &r.Version, &r.Subject, &r.Meter, &th, &r.NotifyOn, &h, &r.Endpoints, &r.CreatedAt, &r.Actor, &r.Deleted); err != nil {
		return Rule{}, err
	}
	if err := json.Unmarshal(th, &r.Thresholds); err != nil {
		return Rule{}, fmt.Errorf("alerts: rule %q: stored thresholds: %w", r.Name, err)
	}
	var err error
	if r.HysteresisPercent, err = decimal.NewFromString(h); err != nil {
		return Rule{}, fmt.Errorf("alerts: rule %q: stored hysteresis: %w", r.Name, err)
	}
	r.CreatedAt = r.CreatedAt.UTC()
	return r, nil
}

// unknownEndpoints is a field error for each of endpoints that names no
// webhook.
func unknownEndpoints(ctx context.Context, db DBTX, endpoints []string) ([]error, error) {
	var unknown []string
	if err := db.QueryRow(ctx, qUnknownWebhooks, endpoints).Scan(&unknown); err != nil {
		return nil, fmt.Errorf("alerts: read webhooks: %w", err)
	}
	var errs []error
	for _, u := range unknown {
		i := slices.Index(endpoints, u)
		errs = append(errs, validation.Errorf(fmt.Sprintf("endpoints[%d]", i), "no webhook %q; create it first (PUT /v1/webhooks/%s)", u, u))
	}
	return errs, nil
}

// PutRule stores a new version of the rule in.Name and returns it, with
// created true when no live version existed. Endpoints must name existing
// webhooks.
func PutRule(ctx context.Context, db TxBeginner, in RuleInput, now time.Time) (r Rule, created bool, err error) {
	if err := in.Validate(); err != nil {
		// Every field at fault at once: the endpoints that name no webhook
		// too (read without the lock: nothing is written).
		if unknown, rerr := unknownEndpoints(ctx, db, in.Endpoints); rerr == nil && len(unknown) > 0 {
			err = fmt.Errorf("%w: %w", err, errors.Join(unknown...))
		}
		return Rule{}, false, err
	}
	if in.NotifyOn == nil {
		in.NotifyOn = []string{Triggered, Resolved}
	}
	h := decimal.Zero
	if in.HysteresisPercent != nil {
		h = *in.HysteresisPercent
	}
	if in.Endpoints == nil {
		in.Endpoints = []string{}
	}
	err = writeVersion(func() error {
		return pgx.BeginFunc(ctx, db, func(tx pgx.Tx) error {
			if err := lockRule(ctx, tx, in.Name); err != nil {
				return err
			}
			if _, err := tx.Exec(ctx, qLockWebhooks, in.Endpoints); err != nil {
				return fmt.Errorf("alerts: lock webhooks: %w", err)
			}
			unknown, err := unknownEndpoints(ctx, tx, in.Endpoints)
			if err != nil {
				return err
			}
			if len(unknown) > 0 {
				return fmt.Errorf("%w: %w", ErrInvalid, errors.Join(unknown...))
			}
			var prev int64
			var live bool
			if err := tx.QueryRow(ctx, qLatestRuleVersion, in.Name).Scan(&prev, &live); err != nil {
				return fmt.Errorf("alerts: read rule versions: %w", err)
			}
			th, err := json.Marshal(in.Thresholds)
			if err != nil {
				return err
			}
			r = Rule{Name: in.Name, Version: prev + 1, Subject: in.Subject, Meter: in.Meter, Thresholds: in.Thresholds,
				NotifyOn: in.NotifyOn, HysteresisPercent: h, Endpoints: in.Endpoints,
				CreatedAt: now.UTC().Truncate(time.Microsecond), Actor: in.Actor}
			created = !live
			_, err = tx.Exec(ctx, qInsertRule, pgx.NamedArgs{"name": r.Name, "version": r.Version, "subject": r.Subject,
				"meter": r.Meter, "thresholds": string(th), "notify_on": r.NotifyOn, "hysteresis": h.String(),
				"endpoints": r.Endpoints, "deleted": false, "created_at": r.CreatedAt, "actor": r.Actor})
			return err
		})
	})
	if err != nil {
		return Rule{}, false, err
	}
	return r, created, nil
}

// lockRule serialises the writers of rule name's versions until tx ends:
// each reads the latest version once the one before has committed, so any
// number of concurrent PUTs and DELETEs each write a version of their
// own (with retries alone, a writer racing more than the retries' bound
// failed on the key).
func lockRule(ctx context.Context, tx pgx.Tx, name string) error {
	if _, err := tx.Exec(ctx, qLockRule, locks.AlertRule, name); err != nil {
		return fmt.Errorf("alerts: lock rule: %w", err)
	}
	return nil
}

// writeVersion runs write, a transaction that reads the rule's latest
// version and inserts the next, again when another writer inserted that
// version first (the key refuses the second): it reads the latest version
// again. Under lockRule that is only a writer of a build before it, during
// a rolling upgrade.
func writeVersion(write func() error) error {
	for attempt := 0; ; attempt++ {
		err := write()
		var pe *pgconn.PgError
		if errors.As(err, &pe) && pe.Code == "23505" && pe.ConstraintName == "alert_rules_pkey" && attempt < 3 {
			continue
		}
		return err
	}
}

// DeleteRule stores a deleted version of the rule: the evaluator resolves
// its triggered states (reason rule_deleted) and evaluates it no more.
func DeleteRule(ctx context.Context, db TxBeginner, name, actor string, now time.Time) error {
	return writeVersion(func() error { return deleteRule(ctx, db, name, actor, now) })
}

func deleteRule(ctx context.Context, db TxBeginner, name, actor string, now time.Time) error {
	return pgx.BeginFunc(ctx, db, func(tx pgx.Tx) error {
		if err := lockRule(ctx, tx, name); err != nil {
			return err
		}
		r, err := scanRule(tx.QueryRow(ctx, qRule, name))
		if errors.Is(err, pgx.ErrNoRows) || err == nil && r.Deleted {
			return validation.NotFound(ErrNotFound, "no alert %q", name)
		}
		if err != nil {
			return fmt.Errorf("alerts: read rule: %w", err)
		}
		th, err := json.Marshal(r.Thresholds)
		if err != nil {
			return err
		}
		_, err = tx.Exec(ctx, qInsertRule, pgx.NamedArgs{"name": r.Name, "version": r.Version + 1, "subject": r.Subject,
			"meter": r.Meter, "thresholds": string(th), "notify_on": r.NotifyOn, "hysteresis": r.HysteresisPercent.String(),
			"endpoints": r.Endpoints, "deleted": true, "created_at": now.UTC(), "actor": actor})
		return err
	})
}

// GetRule returns the latest live version of the rule name.
func GetRule(ctx context.Context, db DBTX, name string) (Rule, error) {
	r, err := scanRule(db.QueryRow(ctx, qRule, name))
	if errors.Is(err, pgx.ErrNoRows) || err == nil && r.Deleted {
		return Rule{}, validation.NotFound(ErrNotFound, "no alert %q", name)
	}
	if err != nil {
		return Rule{}, fmt.Errorf("alerts: read rule: %w", err)
	}
	return r, nil
}

// Rules returns the latest live version of every rule, by name.
func Rules(ctx context.Context, db DBTX) ([]Rule, error) {
	rows, err := db.Query(ctx, qRules)
	if err != nil {
		return nil, fmt.Errorf("alerts: read rules: %w", err)
	}
	rs, err := pgx.CollectRows(rows, func(row pgx.CollectableRow) (Rule, error) { return scanRule(row) })
	if err != nil {
		return nil, fmt.Errorf("alerts: read rules: %w", err)
	}
	return rs, nil
}

// TxBeginner starts transactions (a pool).
type TxBeginner interface {
	DBTX
	Begin(ctx context.Context) (pgx.Tx, error)
}
