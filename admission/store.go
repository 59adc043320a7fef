package admission

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/shopspring/decimal"

	"github.com/tally-ledger/tally/amount"
	"github.com/tally-ledger/tally/internal/ids"
	"github.com/tally-ledger/tally/periods"
	"github.com/tally-ledger/tally/quota"
)

// Defaults of Config.
const (
	DefaultMaxSkew = 5 * time.Second
	DefaultTTL     = 30 * time.Second
	MaxTTL         = time.Hour
)

// DB is what the store needs of a pool.
type DB interface {
	DBTX
	Begin(ctx context.Context) (pgx.Tx, error)
	SendBatch(ctx context.Context, b *pgx.Batch) pgx.BatchResults
	Acquire(ctx context.Context) (*pgxpool.Conn, error)
}

// DBTX is what reads need of a pool, a connection or a transaction.
type DBTX interface {
	Query(ctx context.Context, sql string, args ...any) (pgx.Rows, error)
	QueryRow(ctx context.Context, sql string, args ...any) pgx.Row
	Exec(ctx context.Context, sql string, args ...any) (pgconn.CommandTag, error)
}

// Config configures a Store.
type Config struct {
	// MaxSkew is added to valid_until to give the time a grant is
	// reclaimed: the clock skew tolerated between Tally and a holder.
	// Default 5 s.
	MaxSkew time.Duration
	// Now is the clock. Default time.Now.
	Now func() time.Time
	// Logger; default discards.
	Logger *slog.Logger
	// MaxBatch bounds how many concurrent grant requests share one
	// transaction. Default 256.
	MaxBatch int
	// Registerer, when set, receives the issuing metrics
	// (tally_admission_*). Default none.
	Registerer prometheus.Registerer
}

// DefaultMaxBatch is Config.MaxBatch's default.
const DefaultMaxBatch = 256

// Validate reports every problem of c at once.
func (c Config) Validate() error {
	var errs []error
	if c.MaxSkew < 0 {
		errs = append(errs, &FieldError{Field: "max_skew", Detail: "is negative"})
	}
	if c.MaxBatch < 0 {
		errs = append(errs, &FieldError{Field: "max_batch", Detail: "is negative"})
	}
	return errors.Join(errs...)
}

// Store issues, renews and releases grants.
type Store struct {
	db   DB
	cfg  Config
	comb combiner
	// reports queues renews and releases for shared transactions.
	reports reportCombiner
	plans   planCache
	// known budget rows and holders' generations (see known).
	known      known[budgetKey]
	holderGens known[string]
	m          *issueMetrics
}

// New returns a Store on db.
func New(db DB, cfg Config) (*Store, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	if cfg.MaxSkew == 0 {
		cfg.MaxSkew = DefaultMaxSkew
	}
	if cfg.MaxBatch == 0 {
		cfg.MaxBatch = DefaultMaxBatch
	}
	if cfg.Now == nil {
		cfg.Now = time.Now
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.New(slog.DiscardHandler)
	}
	s := &Store{db: db, cfg: cfg, m: newIssueMetrics(cfg.Registerer)}
	s.plans.now, s.plans.max = s.now, maxPlans
	return s, nil
}

func (s *Store) now() time.Time { return s.cfg.Now().UTC().Truncate(time.Microsecond) }

// Grant is one leased permission.
type Grant struct {
	ID          uuid.UUID       `json:"id"`
	Customer    string          `json:"customer"`
	Meter       string          `json:"meter"`
	Period      string          `json:"period"`
	PeriodStart time.Time       `json:"period_start"`
	PeriodEnd   time.Time       `json:"period_end"`
	RuleVersion int64           `json:"rule_version"`
	Holder      string          `json:"holder"`
	Generation  int64           `json:"generation"`
	Amount      decimal.Decimal `json:"amount"`
	Spent       decimal.Decimal `json:"spent"`
	IssuedAt    time.Time       `json:"issued_at"`
	ValidUntil  time.Time       `json:"valid_until"`
	// ReclaimAt is valid_until + max_skew: the grant ends then unless
	// released before.
	ReclaimAt time.Time  `json:"reclaim_at"`
	EndedAt   *time.Time `json:"ended_at"`
	EndReason string     `json:"end_reason,omitempty"`
	// State is live or ended, by the store's clock when read.
	State string `json:"state"`
	// LateReport (a release's answer only): the grant had already been
	// reclaimed, so its final spent was recorded and freed nothing.
	LateReport bool `json:"late_report,omitempty"`
	// OnUnreachable, with LocalAmount per LocalEvery ("1m") for local,
	// is the rule's policy for a holder that cannot reach Tally. Set on
	// issue only, so a gateway learns its rule with its grant.
	OnUnreachable string              `json:"on_unreachable,omitempty"`
	LocalAmount   decimal.NullDecimal `json:"local_amount,omitzero"`
	LocalEvery    quota.DurationText  `json:"local_every,omitzero"`
	// Budgets are the scopes the grant drew from ("customer:<id>",
	// "pool:<name>", "global"), in lock order.
	Budgets []string `json:"budgets"`
	// Available is, in the answer to an issue only, the smallest of
	// limit − consumed over the budgets the grant drew from, once it and
	// the grants issued in the same transaction were taken: how tight the
	// budget is, read under the issue's locks (docs/design.md §12).
	Available decimal.NullDecimal `json:"available,omitzero"`

	drawsCustomer bool
	debit         bool // issued spent and released (Store.Debit)
	// Rate: the grant drew from a rate budget (docs/design.md §17): it
	// is short, and renew never extends it.
	Rate     bool       `json:"rate,omitempty"`
	drawsEnd *time.Time // the earliest end of the pool and global periods drawn
}

// Binding is the name of a budget in errors and problems.
func Binding(customer, meter string) string { return "customer:" + customer + "/" + meter }

// IssueRequest asks for a grant.
type IssueRequest struct {
	Holder     string
	Generation int64
	Customer   string
	Meter      string
	Amount     decimal.Decimal
	// MinAmount, when set, accepts a smaller grant (what is available) of
	// at least MinAmount.
	MinAmount decimal.NullDecimal
	// TTL: valid_until = now + TTL (never past the period's end). Default 30 s.
	TTL time.Duration
	// Budgets, when set, names the subset of the customer's exact budgets
	// to draw from (scopes: "customer:<id>", "pool:<name>", "global");
	// empty draws from every exact budget that applies.
	Budgets []string
	// EveryBudget refuses a Budgets that leaves out an exact budget that
	// applies (*OmittedBudgetError): set it for every caller but the
	// admin (docs/design.md §13).
	EveryBudget bool

	// id, when set, is the grant's id; debit issues it spent in full and
	// released (Store.Debit).
	id    uuid.UUID
	debit bool
}

func checkHolder(holder string, generation int64) []error {
	var errs []error
	if !ids.Valid(holder) {
		errs = append(errs, &FieldError{Field: "holder", Detail: fmt.Sprintf("%q must be "+ids.Rule, holder)})
	}
	if generation < 1 {
		errs = append(errs, &FieldError{Field: "generation", Detail: "must be a positive integer"})
	}
	return errs
}

// MinTTL is the shortest a grant may be asked to live.
const MinTTL = time.Millisecond

// TTLRange is the range of a grant's ttl, as its refusal states it.
var TTLRange = "whole microseconds from " + quota.FormatDuration(MinTTL) + " to " + quota.FormatDuration(MaxTTL)

// checkTTL refuses a ttl (0: the default) shorter than MinTTL, longer than
// MaxTTL, or finer than the microsecond Tally keeps times to (a grant's
// answer would name a valid_until it does not store).
func checkTTL(ttl time.Duration) []error {
	if ttl != 0 && (ttl < MinTTL || ttl > MaxTTL || ttl%time.Microsecond != 0) {
		return []error{&FieldError{Field: "ttl", Detail: quota.FormatDuration(ttl) + " must be " + TTLRange}}
	}
	return nil
}

// checkTake checks what a grant and a debit both name: the holder and its
// generation, the customer, the meter and a positive amount.
func checkTake(holder string, generation int64, customer, meter string, amt decimal.Decimal) []error {
	errs := checkHolder(holder, generation)
	if !ids.Valid(customer) {
		errs = append(errs, &FieldError{Field: "customer", Detail: fmt.Sprintf("%q must be "+ids.Rule, customer)})
	}
	if !ids.Valid(meter) {
		errs = append(errs, &FieldError{Field: "meter", Detail: fmt.Sprintf("%q must be "+ids.Rule, meter)})
	}
	if !amt.IsPositive() {
		errs = append(errs, &FieldError{Field: "amount", Detail: fmt.Sprintf("%s must be positive", amt)})
	} else if err := amount.Check(amt); err != nil {
		errs = append(errs, &FieldError{Field: "amount", Detail: err.Error()})
	}
	return errs
}

// Validate reports every problem of r at once.
func (r IssueRequest) Validate() error {
	errs := checkTake(r.Holder, r.Generation, r.Customer, r.Meter, r.Amount)
	if r.MinAmount.Valid {
		m := r.MinAmount.Decimal
		if !m.IsPositive() || m.GreaterThan(r.Amount) {
			errs = append(errs, &FieldError{Field: "min_amount", Detail: fmt.Sprintf("%s must be positive and at most amount", m)})
		} else if err := amount.Check(m); err != nil {
			errs = append(errs, &FieldError{Field: "min_amount", Detail: err.Error()})
		}
	}
	errs = append(errs, checkTTL(r.TTL)...)
	for i, b := range r.Budgets {
		if b != quota.CustomerScope(r.Customer) && !quota.ValidScope(b) {
			errs = append(errs, &FieldError{Field: fmt.Sprintf("budgets[%d]", i),
				Detail: fmt.Sprintf("%q must be %q, pool:<name> or global", b, quota.CustomerScope(r.Customer))})
		} else if slices.Contains(r.Budgets[:i], b) {
			errs = append(errs, &FieldError{Field: fmt.Sprintf("budgets[%d]", i), Detail: fmt.Sprintf("%q is named twice", b)})
		}
	}
	return errors.Join(errs...)
}

func exactRule(ctx context.Context, db DBTX, customer, meter string, now time.Time) (quota.Rule, error) {
	rule, err := quota.RuleAt(ctx, db, customer, meter, now)
	if errors.Is(err, quota.ErrNotFound) {
		return quota.Rule{}, &NotExactError{Customer: customer, Meter: meter}
	}
	if err != nil {
		return quota.Rule{}, err
	}
	if rule.Admission != quota.Exact {
		return quota.Rule{}, &NotExactError{Customer: customer, Meter: meter, Admission: string(rule.Admission)}
	}
	return rule, nil
}

// periodAt is the customer's billing period at t (the default calendar for
// a customer Tally has not seen yet, as the enforcer does).
func periodAt(ctx context.Context, db DBTX, customer string, t time.Time) (periods.Period, error) {
	sch, err := periods.Store{}.Schedule(ctx, db, customer)
	return periodIn(sch, err, t)
}

// periodIn is the period at t of the calendar read as sch (err): the
// default calendar's for a customer not stored yet.
func periodIn(sch periods.Schedule, err error, t time.Time) (periods.Period, error) {
	if errors.Is(err, periods.ErrUnknownCustomer) {
		sch, err = periods.NewSchedule(periods.DefaultCalendar()), nil
	}
	if err != nil {
		return periods.Period{}, err
	}
	return sch.PeriodAt(t)
}
