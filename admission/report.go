package admission

import (
	"context"
	"fmt"
	"time"

	pgxdecimal "github.com/jackc/pgx-shopspring-decimal"
	"github.com/jackc/pgx/v5"
	"github.com/shopspring/decimal"
)

// Account is what the protocol handed out for one budget and period, for
// reconciliation.
type Account struct {
	Customer    string
	Meter       string
	PeriodStart time.Time
	Limit       decimal.Decimal
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

const qAccounts = `
WITH t AS (SELECT * FROM unnest(@customers::text[], @starts::timestamptz[]) AS t(customer, period_start))
SELECT b.customer, b.meter, b.period_start, b."limit", b.consumed,
       coalesce((SELECT sum(g.spent) FROM admission_grants g
                 WHERE (g.customer, g.meter, g.period_start) = (b.customer, b.meter, b.period_start)
                   AND g.draws_customer), 0),
       coalesce((SELECT sum(g.amount - g.spent) FROM admission_grants g
                 WHERE (g.customer, g.meter, g.period_start) = (b.customer, b.meter, b.period_start)
                   AND g.draws_customer AND g.ended_at IS NULL AND g.reclaim_at <= @now), 0),
       coalesce((SELECT jsonb_object_agg(x.holder, x.amount::text) FROM
                   (SELECT holder, sum(amount) AS amount FROM admission_bypasses y
                    WHERE (y.customer, y.meter, y.period_start) = (b.customer, b.meter, b.period_start)
                    GROUP BY holder) x), '{}')
FROM admission_budgets b JOIN t USING (customer, period_start)
WHERE b."limit" IS NOT NULL
ORDER BY 1, 2, 3`

// Accounts returns the account of every exact budget of the given
// (customer, period start) pairs.
func Accounts(ctx context.Context, db DBTX, customers []string, starts []time.Time, now time.Time) ([]Account, error) {
	rows, err := db.Query(ctx, qAccounts, pgx.NamedArgs{"customers": customers, "starts": starts, "now": now})
	if err != nil {
		return nil, fmt.Errorf("admission: accounts: %w", err)
	}
	out, err := pgx.CollectRows(rows, func(row pgx.CollectableRow) (Account, error) {
		var a Account
		var bypassed map[string]string // amounts as text: JSON has no exact number type
		if err := row.Scan(&a.Customer, &a.Meter, &a.PeriodStart, numeric(&a.Limit), numeric(&a.Consumed),
			numeric(&a.Spent), numeric(&a.Stranded), &bypassed); err != nil {
			return Account{}, err
		}
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
	Limit       decimal.Decimal
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
SELECT s.scope, s.meter, s.period_start, s."limit", s.consumed,
       coalesce((SELECT sum(g.spent) FROM admission_grant_draws d JOIN admission_grants g ON g.id = d.grant_id
                 WHERE (d.scope, d.meter, d.period_start) = (s.scope, s.meter, s.period_start)), 0),
       coalesce((SELECT sum(g.amount - g.spent) FROM admission_grant_draws d JOIN admission_grants g ON g.id = d.grant_id
                 WHERE (d.scope, d.meter, d.period_start) = (s.scope, s.meter, s.period_start)
                   AND g.ended_at IS NULL AND g.reclaim_at <= @now), 0)
FROM admission_scope_budgets s
WHERE EXISTS (SELECT 1 FROM admission_grant_draws d
              JOIN admission_grants g ON g.id = d.grant_id
              JOIN t ON (t.customer, t.period_start) = (g.customer, g.period_start)
              WHERE (d.scope, d.meter, d.period_start) = (s.scope, s.meter, s.period_start))
ORDER BY 1, 2, 3`

// ScopeAccounts returns the account of every pool and global budget that
// grants of the given (customer, period start) pairs drew from.
func ScopeAccounts(ctx context.Context, db DBTX, customers []string, starts []time.Time, now time.Time) ([]ScopeAccount, error) {
	rows, err := db.Query(ctx, qScopeAccounts, pgx.NamedArgs{"customers": customers, "starts": starts, "now": now})
	if err != nil {
		return nil, fmt.Errorf("admission: scope accounts: %w", err)
	}
	out, err := pgx.CollectRows(rows, func(row pgx.CollectableRow) (ScopeAccount, error) {
		var a ScopeAccount
		if err := row.Scan(&a.Scope, &a.Meter, &a.PeriodStart, numeric(&a.Limit), numeric(&a.Consumed),
			numeric(&a.Spent), numeric(&a.Stranded)); err != nil {
			return ScopeAccount{}, err
		}
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
