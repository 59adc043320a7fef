package admission

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/shopspring/decimal"

	"github.com/tally-ledger/tally/internal/locks"
	"github.com/tally-ledger/tally/internal/pgnamed"
	"github.com/tally-ledger/tally/internal/pguuid"
	"github.com/tally-ledger/tally/quota"
)

// A debit (docs/design.md §13) admits one request centrally: its cost is
// taken from every exact budget that applies to its customer and meter,
// all or nothing, and recorded as a grant of exactly that cost that is
// spent in full and released in the same transaction. It is what a
// gateway asks for when it holds nothing and a budget is too tight to
// size a grant for: no release follows, and nothing is held afterwards.
//
// Its record is an ordinary grant row (end_reason "released", spent =
// amount), so consumed, reconciliation, the scope budgets' counts and
// the audit trail read it as they read any grant; its draws from pool
// and global budgets are recorded as a grant's are.
//
// A debit is idempotent by its id, chosen by the gateway: a debit sent
// again after its answer was lost answers with the debit stored and takes
// nothing twice.
//
// Where everything it draws from is known at the rule version in force,
// a debit is one round trip, a transaction of its own, without waiting
// for the issue combiner: it locks the meter (shared), the holder (shared),
// the customer's row and the pool and global rows in the lock order every
// other path takes, and one guarded statement checks, under those locks,
// everything an issue batch checks (the holder's generation, the rules
// and memberships in force, each row at its rule version, no rate budget)
// and takes the cost or refuses. Otherwise (a holder's first request, a
// row to create or bring to a new rule version, a plan that changed, a
// rate budget) it runs as an issue batch of its own.

// DebitRequest asks for a debit.
type DebitRequest struct {
	// ID makes the debit idempotent: the same id is debited at most once.
	ID         uuid.UUID
	Holder     string
	Generation int64
	Customer   string
	Meter      string
	// Amount is the request's cost, taken whole or not at all.
	Amount decimal.Decimal
}

// Validate reports every problem of r at once.
func (r DebitRequest) Validate() error {
	errs := checkTake(r.Holder, r.Generation, r.Customer, r.Meter, r.Amount)
	if r.ID == uuid.Nil {
		errs = append(errs, &FieldError{Field: "id", Detail: "must be a uuid other than the nil uuid (the gateway's own, so a debit sent again is taken once)"})
	}
	return errors.Join(errs...)
}

func (r DebitRequest) issue() IssueRequest {
	return IssueRequest{Holder: r.Holder, Generation: r.Generation, Customer: r.Customer, Meter: r.Meter,
		Amount: r.Amount, EveryBudget: true, id: r.ID, debit: true}
}

// Debit takes req's amount from every exact budget that applies to its
// customer and meter, all or nothing, answering only after the commit
// with the debit's record: a grant of req.Amount, spent and released.
// A refusal is a *BudgetExhaustedError, as for a grant.
func (s *Store) Debit(ctx context.Context, req DebitRequest) (Grant, error) {
	if err := req.Validate(); err != nil {
		return Grant{}, err
	}
	ireq := req.issue()
	for range maxReplans {
		t := time.Now()
		pl, err := s.plans.get(ctx, s.db, ireq, s.now())
		if err != nil {
			return Grant{}, err
		}
		s.m.observe(pathDebit, phasePlan, time.Since(t))
		g, outcome, err := s.debitOnce(ctx, ireq, pl)
		switch {
		case err != nil:
			return Grant{}, err
		case outcome == debitDone:
			s.m.debits.WithLabelValues("one_round_trip").Inc()
			return g, nil
		}
		// Not decidable in one round trip: an issue batch of its own.
		g, err = s.debitInBatch(ctx, ireq)
		if !errors.Is(err, errReplan) {
			if err == nil {
				s.m.debits.WithLabelValues("batch").Inc()
			}
			return g, err
		}
		s.plans.forget(ireq)
	}
	return Grant{}, errKeptChanging(ireq)
}

type debitOutcome int

const (
	debitDone debitOutcome = iota // taken, or refused (the error)
	debitSlow                     // a batch of its own decides it
)

// oneRoundTrip says whether every row pl draws from (and the customer's
// row, which the grant refers to) is known at the version pl planned,
// and the holder at req's generation: then nothing needs creating or
// bringing, and the guarded statement can decide.
func (s *Store) oneRoundTrip(req IssueRequest, pl plan) bool {
	if len(pl.rates) > 0 || len(pl.allRates) > 0 {
		return false
	}
	if g, ok := s.holderGens.get(req.Holder); !ok || g != req.Generation {
		return false
	}
	ck := budgetKey{quota.CustomerScope(req.Customer), req.Meter, pl.custPeriod.Start.UTC()}
	want := int64(-1)
	if pl.drawsCustomer {
		want = pl.rule.Version
	}
	if v, ok := s.known.get(ck); !ok || v != want {
		return false
	}
	for _, d := range pl.scopes {
		if v, ok := s.known.get(budgetKey{d.scope, req.Meter, d.period.Start.UTC()}); !ok || v != d.version {
			return false
		}
	}
	return true
}

// debitOnce tries the one-round-trip debit.
func (s *Store) debitOnce(ctx context.Context, req IssueRequest, pl plan) (Grant, debitOutcome, error) {
	if !s.oneRoundTrip(req, pl) {
		return Grant{}, debitSlow, nil
	}
	now := s.now()
	if !pl.custPeriod.Contains(now) {
		return Grant{}, debitSlow, nil
	}
	g := s.newGrant(req, pl, req.Amount, now)
	scopes := make([]string, len(pl.scopes))
	var scopeStart time.Time
	for i, d := range pl.scopes {
		if !d.period.Contains(now) {
			return Grant{}, debitSlow, nil
		}
		scopes[i], scopeStart = d.scope, d.period.Start.UTC()
	}
	args := pgnamed.Args{"id": pguuid.Of(g.ID), "holder": req.Holder, "generation": req.Generation, "customer": req.Customer,
		"meter": req.Meter, "cstart": g.PeriodStart, "cost": req.Amount.String(), "now": now, "scopes": scopes,
		"sstart": scopeStart, "version": g.RuleVersion, "valid_until": g.ValidUntil, "reclaim_at": g.ReclaimAt,
		"draws_customer": pl.drawsCustomer, "exact_scope_lock": locks.ExactScope}
	b := &pgx.Batch{}
	// One round trip, one transaction: BEGIN and COMMIT ride in it. The
	// guarded statement's plan is made once per connection (generic):
	// planning it per call cost more than running it.
	b.Queue("BEGIN")
	b.Queue(qGenericPlans)
	// The lock order of every path: the meter, the holder, the customer's
	// row, the pool and global rows (sorted); then the guarded statement.
	b.Queue(qDebitLockMeter, args)
	b.Queue(qShareHolders, pgnamed.Args{"holders": []string{req.Holder}})
	b.Queue(qDebitLockCustomer, args)
	if len(scopes) > 0 {
		b.Queue(qDebitLockScopes, args)
	}
	var outcome, bind string
	var stored *int64
	var left, bindLeft decimal.NullDecimal
	b.Queue(qDebit, args).QueryRow(func(r pgx.Row) error {
		return r.Scan(&outcome, &stored, nullNumeric(&left), &bind, nullNumeric(&bindLeft))
	})
	b.Queue("COMMIT")
	// A failed statement leaves the connection in a failed transaction:
	// the pool closes a connection released in a transaction, so nothing
	// of it is reused.
	t := time.Now()
	conn, err := s.db.Acquire(ctx)
	if err != nil {
		return Grant{}, 0, fmt.Errorf("admission: debit: %w", err)
	}
	acquired := time.Now()
	err = conn.SendBatch(ctx, b).Close()
	conn.Release()
	s.m.observe(pathDebit, phaseConnection, acquired.Sub(t))
	s.m.observe(pathDebit, phasePostgres, time.Since(acquired))
	if err != nil {
		return Grant{}, 0, fmt.Errorf("admission: debit: %w", err)
	}
	switch outcome {
	case "debited":
		g.Available = left
		return debited(g), debitDone, nil
	case "already":
		g, _, err := s.storedDebit(ctx, req)
		return g, debitDone, err
	case "refused":
		return Grant{}, debitDone, s.debitRefused(ctx, req, pl, bind, bindLeft.Decimal, now)
	case "stale":
		return Grant{}, 0, staleGeneration(req.Holder, req.Generation, *stored)
	default: // "slow": the plan or the rows are not as this Store knew them
		if stored == nil || *stored != req.Generation {
			s.holderGens.forget(req.Holder)
		}
		s.known.forget(append(drawnKeys(pl, req), budgetKey{quota.CustomerScope(req.Customer), req.Meter, pl.custPeriod.Start.UTC()})...)
		s.plans.forget(req)
		return Grant{}, debitSlow, nil
	}
}

// debited is g as a debit's record.
func debited(g Grant) Grant {
	at := g.IssuedAt
	g.Spent, g.EndedAt, g.EndReason, g.State = g.Amount, &at, "released", "ended"
	return g
}

// debitInBatch runs req as an issue batch of its own transaction: it
// creates and brings what the one round trip cannot. A debit whose id is
// stored already (sent again) answers with it, before the batch and after
// a refusal (the first sending may have committed meanwhile: the batch
// waited for its locks, so it sees it then).
func (s *Store) debitInBatch(ctx context.Context, req IssueRequest) (Grant, error) {
	if g, found, err := s.storedDebit(ctx, req); found || err != nil {
		return g, err
	}
	c := &call{req: req}
	err := s.issueOwnTx(ctx, []*call{c})
	if keyTaken(err, "admission_grants_pkey") {
		g, _, err := s.storedDebit(ctx, req)
		return g, err
	}
	if err != nil {
		return Grant{}, err
	}
	if c.err != nil {
		if g, found, err := s.storedDebit(ctx, req); found || err != nil {
			return g, err
		}
		return Grant{}, c.err
	}
	return debited(c.grant), nil
}

// storedDebit reads the debit stored under req's id (found false when
// none is): the answer to a debit sent again. An id stored for anything
// else is an error on the id.
func (s *Store) storedDebit(ctx context.Context, req IssueRequest) (Grant, bool, error) {
	g, err := s.Get(ctx, req.id)
	switch {
	case errors.Is(err, ErrNotFound):
		return Grant{}, false, nil
	case err != nil:
		return Grant{}, false, err
	}
	if g.Holder != req.Holder || g.Customer != req.Customer || g.Meter != req.Meter || !g.Amount.Equal(req.Amount) ||
		g.EndReason != "released" || !g.Spent.Equal(g.Amount) {
		return Grant{}, true, &FieldError{Field: "id", Detail: fmt.Sprintf("%s is already the id of another grant or debit", req.id)}
	}
	return g, true, nil
}

// debitRefused is the refusal of a debit the guarded statement refused
// by the budget scope (left of it), with retry_after and what other
// holders hold on it, read as an issue batch reads them for its refusals
// (after the transaction: advice, as retry_after always is). A refused
// debit takes nothing and is not tried again.
func (s *Store) debitRefused(ctx context.Context, req IssueRequest, pl plan, scope string, left decimal.Decimal, now time.Time) error {
	row := &budgetRow{drawn: drawn{period: pl.custPeriod}}
	for _, d := range pl.scopes {
		if d.scope == scope {
			row.drawn.period = d.period
		}
	}
	k := budgetKey{scope, req.Meter, row.drawn.period.Start.UTC()}
	ex := &BudgetExhaustedError{Binding: scope + "/" + req.Meter, Available: left}
	s.retryAfter(ctx, s.db, now, []*call{{req: req, err: ex}}, []budgetKey{k}, map[budgetKey]*budgetRow{k: row})
	s.m.refusedBy(ex.Binding)
	return ex
}

// The one-round-trip debit's statements.

const qDebitLockMeter = `SELECT pg_advisory_xact_lock_shared(@exact_scope_lock::int, hashtext(@meter::text))`

const qDebitLockCustomer = `
SELECT 1 FROM admission_budgets
WHERE (customer, meter, period_start) = (@customer::text, @meter::text, @cstart::timestamptz)
FOR UPDATE`

const qDebitLockScopes = `
SELECT 1 FROM admission_scope_budgets
WHERE scope = ANY(@scopes::text[]) AND meter = @meter::text AND period_start = @sstart::timestamptz
ORDER BY scope, meter, period_start
FOR UPDATE`

// qDebit decides and takes a debit under the locks the statements before
// it took (a fresh snapshot, after them): "already" when its id is
// stored; "stale" when the holder has a newer generation; "slow" when
// anything is not as the plan said (the holder's generation, a row's rule
// version, the rules and memberships in force, the customer's rule version
// whether its budget is drawn or not: the record carries it, a rate
// budget applying);
// "refused" when a budget has less than the cost left; else "debited",
// with every budget taken and the record written. The second column is
// the holder's stored generation, the third what the budgets drawn have
// left once this debit is taken (the smallest limit − consumed), the
// last two the budget with the least left (the customer's first, then by
// scope, as an issue batch names the binding one) and what it has left.
const qDebit = `
WITH h AS (SELECT generation FROM admission_holders WHERE holder = @holder::text),
c AS (SELECT b.consumed, b.rule_version, r."limit" AS lim, r.version,
             coalesce(r.admission = 'exact' AND r."limit" IS NOT NULL, false) AS exact,
             coalesce(r.admission = 'exact' AND r.rate_amount IS NOT NULL, false) AS rated
      FROM admission_budgets b
      LEFT JOIN LATERAL quota_rule_in_force(b.customer, b.meter, @now::timestamptz) r ON true
      WHERE (b.customer, b.meter, b.period_start) = (@customer::text, @meter::text, @cstart::timestamptz)),
s AS (SELECT x.scope, x.consumed, x.rule_version, r."limit" AS lim, r.version
      FROM admission_scope_budgets x
      JOIN LATERAL quota_scope_rule_in_force(x.scope, x.meter, @now::timestamptz) r ON true
      WHERE x.scope = ANY(@scopes::text[]) AND x.meter = @meter::text AND x.period_start = @sstart::timestamptz
        AND r.admission = 'exact' AND r."limit" IS NOT NULL AND r.version = x.rule_version),
sr AS (SELECT a.scope, r.admission, r."limit" AS lim, r.rate_amount
       FROM (SELECT 'global' AS scope
             UNION
             SELECT 'pool:' || m.pool FROM pool_members m
             WHERE m.customer = @customer::text AND m.joined_at <= @now::timestamptz
               AND (m.left_at IS NULL OR m.left_at > @now::timestamptz)) a
       CROSS JOIN LATERAL quota_scope_rule_in_force(a.scope, @meter::text, @now::timestamptz) r),
app AS (SELECT scope FROM sr WHERE admission = 'exact' AND lim IS NOT NULL),
v AS (SELECT CASE
        WHEN EXISTS (SELECT 1 FROM admission_grants WHERE id = @id::uuid) THEN 'already'
        WHEN (SELECT generation FROM h) > @generation::bigint THEN 'stale'
        WHEN (SELECT generation FROM h) IS DISTINCT FROM @generation::bigint THEN 'slow'
        WHEN NOT EXISTS (SELECT 1 FROM c) THEN 'slow'
        WHEN (SELECT exact FROM c) <> @draws_customer::boolean THEN 'slow'
        WHEN @draws_customer::boolean AND (SELECT rule_version <> version FROM c) THEN 'slow'
        WHEN (SELECT coalesce(version, 0) <> @version::bigint FROM c) THEN 'slow'
        WHEN (SELECT count(*) FROM s) <> cardinality(@scopes::text[]) THEN 'slow'
        WHEN (SELECT count(*) FROM app) <> cardinality(@scopes::text[])
          OR EXISTS (SELECT 1 FROM app WHERE NOT (scope = ANY(@scopes::text[]))) THEN 'slow'
        WHEN (SELECT rated FROM c) OR EXISTS (SELECT 1 FROM sr WHERE admission = 'exact' AND rate_amount IS NOT NULL) THEN 'slow'
        WHEN (@draws_customer::boolean AND (SELECT consumed + @cost::numeric > lim FROM c))
          OR EXISTS (SELECT 1 FROM s WHERE consumed + @cost::numeric > lim) THEN 'refused'
        ELSE 'debited' END AS outcome),
uc AS (UPDATE admission_budgets b SET consumed = b.consumed + @cost::numeric, updated_at = @now::timestamptz
       FROM v
       WHERE v.outcome = 'debited' AND @draws_customer::boolean
         AND (b.customer, b.meter, b.period_start) = (@customer::text, @meter::text, @cstart::timestamptz)),
us AS (UPDATE admission_scope_budgets x SET consumed = x.consumed + @cost::numeric, updated_at = @now::timestamptz
       FROM v
       WHERE v.outcome = 'debited'
         AND x.scope = ANY(@scopes::text[]) AND x.meter = @meter::text AND x.period_start = @sstart::timestamptz),
g AS (INSERT INTO admission_grants (id, customer, meter, period_start, rule_version, holder, generation, amount, spent,
                                    issued_at, valid_until, reclaim_at, ended_at, end_reason, draws_customer)
      SELECT @id::uuid, @customer::text, @meter::text, @cstart::timestamptz, @version::bigint, @holder::text,
             @generation::bigint, @cost::numeric, @cost::numeric, @now::timestamptz, @valid_until::timestamptz,
             @reclaim_at::timestamptz, @now::timestamptz, 'released', @draws_customer::boolean
      FROM v WHERE v.outcome = 'debited'
      RETURNING id),
d AS (INSERT INTO admission_grant_draws (grant_id, scope, meter, period_start)
      SELECT g.id, u.scope, @meter::text, @sstart::timestamptz FROM g, unnest(@scopes::text[]) AS u(scope)),
k AS (SELECT 0 AS ord, 'customer:' || @customer::text AS scope, greatest(0, lim - consumed) AS avail FROM c
      WHERE @draws_customer::boolean
      UNION ALL
      SELECT 1, scope, greatest(0, lim - consumed) FROM s),
m AS (SELECT min(avail) AS least FROM k)
SELECT v.outcome, (SELECT generation FROM h), greatest(0, m.least - @cost::numeric),
       CASE WHEN v.outcome = 'refused' THEN (SELECT scope FROM k ORDER BY avail, ord, scope LIMIT 1) ELSE '' END, m.least
FROM v, m`
