package admission

import (
	"context"
	"fmt"
	"time"

	pgxdecimal "github.com/jackc/pgx-shopspring-decimal"
	"github.com/jackc/pgx/v5"
	"github.com/shopspring/decimal"
	"github.com/tally-ledger/tally/internal/pgnamed"
)

// Account is what the protocol handed out for one budget and period, for
// reconciliation.
type Account struct {
	Customer    string
	Meter       string
	PeriodStart time.Time
	// Limit is the limit of the rule version in force now, or at the
	// period's last instant once it ended.
	Limit decimal.Decimal
	// OverGranted is how far the grants took the budget above the limit
	// of the rule version in force when each was issued (zero: never).
	// Consumed at a grant's issue is rebuilt from the grants alone, so
	// what a budget counted besides them (metered usage, members' grants
	// brought in) never makes a finding: it can only hide part of one.
	OverGranted decimal.Decimal
	// Spent is Σ spent reported on every grant (final for released ones).
	Spent decimal.Decimal
	// Consumed is Σ amount of unreleased grants + Σ spent of released ones:
	// the most gateways may have admitted from grants.
	Consumed decimal.Decimal
	// Stranded is Σ amount - spent of grants reclaimed without a final
	// report in time (BudgetState.Stranded).
	Stranded decimal.Decimal
	// Bypassed is Σ bypasses per holder.
	Bypassed map[string]decimal.Decimal
}

// The over_granted of a budget: its consumed rebuilt from its grants in
// time order (+ amount at an issue, − amount − spent at a release; a
// release at the same instant as an issue first), and at each issue
// compared with the limit of the rule version in force then, when that
// version was exact (a grant issued while it was lagged and counted later
// was not decided by it). The column is the largest excess (negative:
// none).

const qAccounts = `
WITH t AS (SELECT * FROM unnest(@customers::text[], @starts::timestamptz[]) AS t(customer, period_start))
SELECT b.customer, b.meter, b.period_start, coalesce(r."limit", b."limit"), b.consumed,
       coalesce((SELECT sum(g.spent) FROM admission_grants g
                 WHERE (g.customer, g.meter, g.period_start) = (b.customer, b.meter, b.period_start)
                   AND g.draws_customer), 0),
       coalesce((SELECT sum(g.amount - g.spent) FROM admission_grants g
                 WHERE (g.customer, g.meter, g.period_start) = (b.customer, b.meter, b.period_start)
                   AND g.draws_customer AND g.ended_at IS NULL AND g.reclaim_at <= @now), 0),
       coalesce((SELECT jsonb_object_agg(x.holder, x.amount::text) FROM
                   (SELECT holder, sum(amount) AS amount FROM admission_bypasses y
                    WHERE (y.customer, y.meter, y.period_start) = (b.customer, b.meter, b.period_start)
                    GROUP BY holder) x), '{}'),
       coalesce((SELECT max(e.consumed - q."limit")
                 FROM (SELECT x.at, x.issue, sum(x.delta) OVER (ORDER BY x.at, x.issue, x.id ROWS UNBOUNDED PRECEDING) AS consumed
                       FROM (SELECT g.id, g.issued_at AS at, true AS issue, g.amount AS delta FROM admission_grants g
                             WHERE (g.customer, g.meter, g.period_start) = (b.customer, b.meter, b.period_start) AND g.draws_customer
                             UNION ALL
                             SELECT g.id, g.ended_at, false, g.spent - g.amount FROM admission_grants g
                             WHERE (g.customer, g.meter, g.period_start) = (b.customer, b.meter, b.period_start) AND g.draws_customer
                               AND g.ended_at IS NOT NULL) x) e
                 CROSS JOIN LATERAL quota_rule_in_force(b.customer, b.meter, e.at) q
                 WHERE e.issue AND q.admission = 'exact'), 0)
FROM admission_budgets b JOIN t USING (customer, period_start)
LEFT JOIN LATERAL quota_rule_in_force(b.customer, b.meter, least(@now::timestamptz, b.period_end - interval '1 microsecond')) r ON true
WHERE b."limit" IS NOT NULL
ORDER BY 1, 2, 3`

// Accounts returns the account of every exact budget of the given
// (customer, period start) pairs.
func Accounts(ctx context.Context, db DBTX, customers []string, starts []time.Time, now time.Time) ([]Account, error) {
	rows, err := db.Query(ctx, qAccounts, pgnamed.Args{"customers": customers, "starts": starts, "now": now})
	if err != nil {
		return nil, fmt.Errorf("admission: accounts: %w", err)
	}
	out, err := pgx.CollectRows(rows, func(row pgx.CollectableRow) (Account, error) {
		var a Account
		var bypassed map[string]string // amounts as text: JSON has no exact number type
		if err := row.Scan(&a.Customer, &a.Meter, &a.PeriodStart, numeric(&a.Limit), numeric(&a.Consumed),
			numeric(&a.Spent), numeric(&a.Stranded), &bypassed, numeric(&a.OverGranted)); err != nil {
			return Account{}, err
		}
		a.OverGranted = decimal.Max(decimal.Zero, a.OverGranted)
		a.Bypassed = map[string]decimal.Decimal{}
		for h, s := range bypassed {
			v, err := decimal.NewFromString(s)
			if err != nil {
				return Account{}, err
			}
			a.Bypassed[h] = v
		}
		a.PeriodStart = a.PeriodStart.UTC()
		return a, nil
	})
	if err != nil {
		return nil, fmt.Errorf("admission: accounts: %w", err)
	}
	return out, nil
}

// ScopeAccount is what the protocol handed out from one pool or global
// budget and period, for reconciliation.
type ScopeAccount struct {
	Scope       string
	Meter       string
	PeriodStart time.Time
	// Limit and OverGranted are as Account's.
	Limit       decimal.Decimal
	OverGranted decimal.Decimal
	// Consumed counts the grants drawn from it and what members brought in.
	Consumed decimal.Decimal
	// Spent is Σ spent reported on the grants drawn from it.
	Spent decimal.Decimal
	// Stranded is Σ amount - spent of grants drawn from it reclaimed
	// without a final report in time (BudgetState.Stranded).
	Stranded decimal.Decimal
}

// qScopeAccounts is every pool and global budget that grants of the given
// (customer, period start) pairs drew from.
const qScopeAccounts = `
WITH t AS (SELECT * FROM unnest(@customers::text[], @starts::timestamptz[]) AS t(customer, period_start))
SELECT s.scope, s.meter, s.period_start, coalesce(r."limit", s."limit"), s.consumed,
       coalesce((SELECT sum(g.spent) FROM admission_grant_draws d JOIN admission_grants g ON g.id = d.grant_id
                 WHERE (d.scope, d.meter, d.period_start) = (s.scope, s.meter, s.period_start)), 0),
       coalesce((SELECT sum(g.amount - g.spent) FROM admission_grant_draws d JOIN admission_grants g ON g.id = d.grant_id
                 WHERE (d.scope, d.meter, d.period_start) = (s.scope, s.meter, s.period_start)
                   AND g.ended_at IS NULL AND g.reclaim_at <= @now), 0),
       coalesce((SELECT max(e.consumed - q."limit")
                 FROM (SELECT x.at, x.issue, sum(x.delta) OVER (ORDER BY x.at, x.issue, x.id ROWS UNBOUNDED PRECEDING) AS consumed
                       FROM (SELECT g.id, g.issued_at AS at, true AS issue, g.amount AS delta
                             FROM admission_grant_draws d JOIN admission_grants g ON g.id = d.grant_id
                             WHERE (d.scope, d.meter, d.period_start) = (s.scope, s.meter, s.period_start)
                             UNION ALL
                             SELECT g.id, g.ended_at, false, g.spent - g.amount
                             FROM admission_grant_draws d JOIN admission_grants g ON g.id = d.grant_id
                             WHERE (d.scope, d.meter, d.period_start) = (s.scope, s.meter, s.period_start)
                               AND g.ended_at IS NOT NULL) x) e
                 CROSS JOIN LATERAL quota_scope_rule_in_force(s.scope, s.meter, e.at) q
                 WHERE e.issue AND q.admission = 'exact'), 0)
FROM admission_scope_budgets s
LEFT JOIN LATERAL quota_scope_rule_in_force(s.scope, s.meter, least(@now::timestamptz, s.period_end - interval '1 microsecond')) r ON true
WHERE EXISTS (SELECT 1 FROM admission_grant_draws d
              JOIN admission_grants g ON g.id = d.grant_id
              JOIN t ON (t.customer, t.period_start) = (g.customer, g.period_start)
              WHERE (d.scope, d.meter, d.period_start) = (s.scope, s.meter, s.period_start))
ORDER BY 1, 2, 3`

// ScopeAccounts returns the account of every pool and global budget that
// grants of the given (customer, period start) pairs drew from.
func ScopeAccounts(ctx context.Context, db DBTX, customers []string, starts []time.Time, now time.Time) ([]ScopeAccount, error) {
	rows, err := db.Query(ctx, qScopeAccounts, pgnamed.Args{"customers": customers, "starts": starts, "now": now})
	if err != nil {
		return nil, fmt.Errorf("admission: scope accounts: %w", err)
	}
	out, err := pgx.CollectRows(rows, func(row pgx.CollectableRow) (ScopeAccount, error) {
		var a ScopeAccount
		if err := row.Scan(&a.Scope, &a.Meter, &a.PeriodStart, numeric(&a.Limit), numeric(&a.Consumed),
			numeric(&a.Spent), numeric(&a.Stranded), numeric(&a.OverGranted)); err != nil {
			return ScopeAccount{}, err
		}
		a.OverGranted = decimal.Max(decimal.Zero, a.OverGranted)
		a.PeriodStart = a.PeriodStart.UTC()
		return a, nil
	})
	if err != nil {
		return nil, fmt.Errorf("admission: scope accounts: %w", err)
	}
	return out, nil
}

// numeric scans a NUMERIC straight into d.
func numeric(d *decimal.Decimal) *pgxdecimal.Decimal { return (*pgxdecimal.Decimal)(d) }

// nullNumeric scans a NUMERIC that may be NULL straight into d.
func nullNumeric(d *decimal.NullDecimal) *pgxdecimal.NullDecimal { return (*pgxdecimal.NullDecimal)(d) }
