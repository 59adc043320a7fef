package admission

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/shopspring/decimal"

	"github.com/tally-ledger/tally/periods"
	"github.com/tally-ledger/tally/quota"
)

// scopeCalendar is the billing calendar of pool and global budgets: their
// usage and grants count in their own periods, whatever their members'.
var scopeCalendar = periods.NewSchedule(periods.DefaultCalendar())

// drawn is one budget a request draws from.
type drawn struct {
	scope   string
	period  periods.Period
	limit   decimal.Decimal
	version int64
}

// plan is what a request draws from, read before any lock is taken.
type plan struct {
	rule          quota.Rule // the customer's rule in force (zero when none)
	customerExact bool
	drawsCustomer bool
	custPeriod    periods.Period
	scopes        []drawn // sorted by scope: the lock order
	subset        bool
}

// planIssue reads the customer's rule and period and the pool and global
// budgets that apply, and picks those req draws from. Nothing is locked:
// the issuing statement checks under the locks that the budgets drawn are
// still the ones that apply.
func planIssue(ctx context.Context, db DBTX, req IssueRequest, now time.Time) (plan, error) {
	var pl plan
	rule, err := quota.RuleAt(ctx, db, req.Customer, req.Meter, now)
	switch {
	case err == nil:
		pl.rule, pl.customerExact = rule, rule.Admission == quota.Exact
	case errors.Is(err, quota.ErrNotFound):
	default:
		return plan{}, err
	}
	if pl.custPeriod, err = periodAt(ctx, db, req.Customer, now); err != nil {
		return plan{}, err
	}
	scopePeriod, err := scopeCalendar.PeriodAt(now)
	if err != nil {
		return plan{}, err
	}
	rows, err := db.Query(ctx, qApplicableScopes, pgx.NamedArgs{"customer": req.Customer, "meter": req.Meter, "now": now})
	if err != nil {
		return plan{}, fmt.Errorf("admission: read budgets: %w", err)
	}
	applicable, err := pgx.CollectRows(rows, func(row pgx.CollectableRow) (drawn, error) {
		var d drawn
		var lim string
		if err := row.Scan(&d.scope, &lim, &d.version); err != nil {
			return drawn{}, err
		}
		d.period = scopePeriod
		d.limit, err = decimal.NewFromString(lim)
		return d, err
	})
	if err != nil {
		return plan{}, fmt.Errorf("admission: read budgets: %w", err)
	}
	if len(req.Budgets) == 0 {
		pl.drawsCustomer, pl.scopes = pl.customerExact, applicable
		if !pl.drawsCustomer && len(pl.scopes) == 0 {
			return plan{}, &NotExactError{Customer: req.Customer, Meter: req.Meter, Admission: string(rule.Admission)}
		}
		return pl, nil
	}
	pl.subset = true
	var errs []error
	for i, b := range req.Budgets {
		if b == quota.CustomerScope(req.Customer) {
			if !pl.customerExact {
				errs = append(errs, &FieldError{Field: fmt.Sprintf("budgets[%d]", i), Detail: fmt.Sprintf("%s has no exact rule for %s", b, req.Meter)})
			}
			pl.drawsCustomer = true
			continue
		}
		j := slices.IndexFunc(applicable, func(d drawn) bool { return d.scope == b })
		if j < 0 {
			errs = append(errs, &FieldError{Field: fmt.Sprintf("budgets[%d]", i), Detail: fmt.Sprintf("%s is not an exact budget of %s for %s", b, req.Customer, req.Meter)})
			continue
		}
		pl.scopes = append(pl.scopes, applicable[j])
	}
	slices.SortFunc(pl.scopes, func(a, b drawn) int { return strings.Compare(a.scope, b.scope) })
	return pl, errors.Join(errs...)
}

// maxReplans bounds how often one request starts over because a rule or a
// membership changed between its plan and its locks.
const maxReplans = 3

// IssueTx leases a grant inside tx: the grant exists once tx commits.
func (s *Store) IssueTx(ctx context.Context, tx pgx.Tx, req IssueRequest) (Grant, error) {
	return s.issue(ctx, tx, req)
}

// issue plans, then sends the issue batch: one round trip, one implicit
// transaction when db is a pool, or statements of the caller's transaction.
func (s *Store) issue(ctx context.Context, db batcher, req IssueRequest) (Grant, error) {
	if err := req.Validate(); err != nil {
		return Grant{}, err
	}
	if req.TTL == 0 {
		req.TTL = DefaultTTL
	}
	for range maxReplans {
		now := s.now()
		pl, err := planIssue(ctx, db, req, now)
		if err != nil {
			return Grant{}, err
		}
		g, err := s.issuePlanned(ctx, db, req, pl, now)
		if errors.Is(err, errReplan) {
			continue
		}
		return g, err
	}
	return Grant{}, fmt.Errorf("admission: the budgets of %s/%s kept changing while issuing; try again", req.Customer, req.Meter)
}

var errReplan = errors.New("admission: budgets changed while issuing")

// batcher is a pool or a transaction: what sends a batch.
type batcher interface {
	DBTX
	SendBatch(ctx context.Context, b *pgx.Batch) pgx.BatchResults
}

func (s *Store) issuePlanned(ctx context.Context, db batcher, req IssueRequest, pl plan, now time.Time) (Grant, error) {
	validUntil := now.Add(req.TTL)
	end := pl.custPeriod.End.UTC()
	for _, d := range pl.scopes {
		end = minTime(end, d.period.End.UTC())
	}
	validUntil = minTime(validUntil, end)
	g := Grant{
		ID: uuid.New(), Customer: req.Customer, Meter: req.Meter, Period: pl.custPeriod.Name,
		PeriodStart: pl.custPeriod.Start.UTC(), PeriodEnd: pl.custPeriod.End.UTC(), RuleVersion: pl.rule.Version,
		Holder: req.Holder, Generation: req.Generation, Spent: decimal.Zero,
		IssuedAt: now, ValidUntil: validUntil, ReclaimAt: validUntil.Add(s.cfg.MaxSkew), State: "live",
		OnUnreachable: string(quota.UnreachableDeny),
	}
	if pl.customerExact {
		g.OnUnreachable, g.LocalAmount = string(pl.rule.OnUnreachable), pl.rule.LocalAmount
		g.LocalEvery = int64(time.Duration(pl.rule.LocalEvery) / time.Second)
	}
	var custLimit *string
	if pl.customerExact {
		v := pl.rule.Limit.String()
		custLimit = &v
	}
	var minAmount *string
	if req.MinAmount.Valid {
		v := req.MinAmount.Decimal.String()
		minAmount = &v
	}
	n := len(pl.scopes)
	scopes, starts, ends, names, limits, versions := make([]string, n), make([]time.Time, n), make([]time.Time, n),
		make([]string, n), make([]string, n), make([]int64, n)
	for i, d := range pl.scopes {
		scopes[i], starts[i], ends[i], names[i] = d.scope, d.period.Start.UTC(), d.period.End.UTC(), d.period.Name
		limits[i], versions[i] = d.limit.String(), d.version
	}
	args := pgx.NamedArgs{
		"holder": req.Holder, "generation": req.Generation, "now": now,
		"customer": req.Customer, "meter": req.Meter, "cust_start": g.PeriodStart, "cust_end": g.PeriodEnd,
		"cust_period": g.Period, "cust_limit": custLimit, "cust_version": pl.rule.Version,
		"draws_customer": pl.drawsCustomer, "subset": pl.subset,
		"scopes": scopes, "starts": starts, "ends": ends, "names": names, "limits": limits, "versions": versions,
		"id": g.ID, "amount": req.Amount.String(), "min_amount": minAmount,
		"valid_until": g.ValidUntil, "reclaim_at": g.ReclaimAt,
	}
	b := &pgx.Batch{}
	b.Queue(qLockHolder, args)
	b.Queue(qEnsureCustomerBudget, args)
	b.Queue(qEnsureScopeBudgets, args)
	b.Queue(qLockCustomerBudget, args)
	b.Queue(qLockScopeBudgets, args)
	b.Queue(qIssueDecide, args)
	br := db.SendBatch(ctx, b)
	outcome, err := readIssue(br)
	if cerr := br.Close(); err == nil && cerr != nil {
		err = fmt.Errorf("admission: issue: %w", cerr)
	}
	if err != nil {
		return Grant{}, err
	}
	switch {
	case outcome.currentGen > req.Generation:
		return Grant{}, &StaleGenerationError{Holder: req.Holder, Generation: req.Generation, Current: outcome.currentGen}
	case !outcome.valid:
		return Grant{}, errReplan
	case outcome.amount == nil:
		return Grant{}, outcome.refusal(req, now)
	}
	g.Amount = *outcome.amount
	if pl.drawsCustomer {
		g.Budgets = append(g.Budgets, quota.CustomerScope(req.Customer))
	}
	g.Budgets = append(g.Budgets, scopes...)
	return g, nil
}

func minTime(a, b time.Time) time.Time {
	if b.Before(a) {
		return b
	}
	return a
}

type budgetState struct {
	scope     string
	available decimal.Decimal
	periodEnd time.Time
	earliest  *time.Time // set for a budget that refused
}

type issueOutcome struct {
	budgets    []budgetState
	amount     *decimal.Decimal
	currentGen int64
	valid      bool
}

func readIssue(br pgx.BatchResults) (issueOutcome, error) {
	for range 5 {
		if _, err := br.Exec(); err != nil {
			return issueOutcome{}, fmt.Errorf("admission: issue: %w", err)
		}
	}
	rows, err := br.Query()
	if err != nil {
		return issueOutcome{}, fmt.Errorf("admission: issue: %w", err)
	}
	var out issueOutcome
	for rows.Next() {
		var scope, avail, amt *string
		var periodEnd, earliest *time.Time
		var gen *int64
		if err := rows.Scan(&scope, &avail, &periodEnd, &earliest, &amt, &gen, &out.valid); err != nil {
			rows.Close()
			return issueOutcome{}, fmt.Errorf("admission: issue: %w", err)
		}
		if gen != nil {
			out.currentGen = *gen
		}
		if amt != nil {
			v, err := decimal.NewFromString(*amt)
			if err != nil {
				rows.Close()
				return issueOutcome{}, fmt.Errorf("admission: granted %q: %w", *amt, err)
			}
			out.amount = &v
		}
		if scope == nil {
			continue
		}
		b := budgetState{scope: *scope, periodEnd: periodEnd.UTC(), earliest: earliest}
		if avail != nil {
			v, err := decimal.NewFromString(*avail)
			if err != nil {
				rows.Close()
				return issueOutcome{}, fmt.Errorf("admission: available %q: %w", *avail, err)
			}
			b.available = v
		} else {
			b.available = decimal.NewFromInt(-1) // no limit (no exact rule): never binding
		}
		out.budgets = append(out.budgets, b)
	}
	rows.Close()
	if err := rows.Err(); err != nil {
		return issueOutcome{}, fmt.Errorf("admission: issue: %w", err)
	}
	return out, nil
}

// refusal names the binding budget: of those without room, the one with
// the least available (the first in lock order on a tie).
func (o issueOutcome) refusal(req IssueRequest, now time.Time) error {
	need := req.Amount
	if req.MinAmount.Valid {
		need = req.MinAmount.Decimal
	}
	var bind *budgetState
	for i := range o.budgets {
		b := &o.budgets[i]
		if b.available.IsNegative() || !b.available.LessThan(need) {
			continue
		}
		if bind == nil || b.available.LessThan(bind.available) {
			bind = b
		}
	}
	if bind == nil {
		return fmt.Errorf("admission: %s/%s refused without a binding budget", req.Customer, req.Meter)
	}
	at := bind.periodEnd
	if bind.earliest != nil {
		at = *bind.earliest
	}
	retry := max(at.Sub(now), 0)
	return &BudgetExhaustedError{Binding: bind.scope + "/" + req.Meter, Available: bind.available, RetryAfter: retry}
}

// ScopePeriod is the period of pool and global budgets at t.
func ScopePeriod(t time.Time) (periods.Period, error) { return scopeCalendar.PeriodAt(t) }
