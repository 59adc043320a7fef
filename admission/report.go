package admission

import (
	"context"
	"fmt"
	"time"

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
	// Stranded is Σ amount - spent of ended grants.
	Stranded decimal.Decimal
	// Bypassed is Σ bypasses per holder.
	Bypassed map[string]decimal.Decimal
}

const qAccounts = `
WITH t AS (SELECT * FROM unnest(@customers::text[], @starts::timestamptz[]) AS t(customer, period_start))
SELECT b.customer, b.meter, b.period_start, b."limit"::text, b.consumed::text,
       coalesce((SELECT sum(g.spent) FROM admission_grants g
                 WHERE (g.customer, g.meter, g.period_start) = (b.customer, b.meter, b.period_start)
                   AND g.draws_customer), 0)::text,
       coalesce((SELECT sum(g.amount - g.spent) FROM admission_grants g
                 WHERE (g.customer, g.meter, g.period_start) = (b.customer, b.meter, b.period_start)
                   AND g.draws_customer AND (g.ended_at IS NOT NULL OR g.reclaim_at <= @now)), 0)::text,
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
		var lim, cons, spent, stranded string
		var bypassed map[string]string
		if err := row.Scan(&a.Customer, &a.Meter, &a.PeriodStart, &lim, &cons, &spent, &stranded, &bypassed); err != nil {
			return Account{}, err
		}
		for _, p := range []struct {
			s string
			d *decimal.Decimal
		}{{lim, &a.Limit}, {cons, &a.Consumed}, {spent, &a.Spent}, {stranded, &a.Stranded}} {
			v, err := decimal.NewFromString(p.s)
			if err != nil {
				return Account{}, err
			}
			*p.d = v
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
	// Stranded is Σ amount - spent of ended grants drawn from it.
	Stranded decimal.Decimal
}

// qScopeAccounts is every pool and global budget that grants of the given
// (customer, period start) pairs drew from.
const qScopeAccounts = `
WITH t AS (SELECT * FROM unnest(@customers::text[], @starts::timestamptz[]) AS t(customer, period_start))
SELECT s.scope, s.meter, s.period_start, s."limit"::text, s.consumed::text,
       coalesce((SELECT sum(g.spent) FROM admission_grant_draws d JOIN admission_grants g ON g.id = d.grant_id
                 WHERE (d.scope, d.meter, d.period_start) = (s.scope, s.meter, s.period_start)), 0)::text,
       coalesce((SELECT sum(g.amount - g.spent) FROM admission_grant_draws d JOIN admission_grants g ON g.id = d.grant_id
                 WHERE (d.scope, d.meter, d.period_start) = (s.scope, s.meter, s.period_start)
                   AND (g.ended_at IS NOT NULL OR g.reclaim_at <= @now)), 0)::text
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
		var lim, cons, spent, stranded string
		if err := row.Scan(&a.Scope, &a.Meter, &a.PeriodStart, &lim, &cons, &spent, &stranded); err != nil {
			return ScopeAccount{}, err
		}
		if err := parseDecimals(map[*decimal.Decimal]string{&a.Limit: lim, &a.Consumed: cons, &a.Spent: spent, &a.Stranded: stranded}); err != nil {
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

// parseDecimals parses each stored decimal text into its destination.
func parseDecimals(m map[*decimal.Decimal]string) error {
	for d, text := range m {
		v, err := decimal.NewFromString(text)
		if err != nil {
			return fmt.Errorf("admission: stored decimal %q: %w", text, err)
		}
		*d = v
	}
	return nil
}
