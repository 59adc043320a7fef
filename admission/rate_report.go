package admission

import (
	"context"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/shopspring/decimal"
	"github.com/tally-ledger/tally/internal/pgnamed"
)

// RateAccount is what one rate budget (docs/design.md §17) handed out to
// the grants of the reconciled customers and periods, for reconciliation.
type RateAccount struct {
	Scope, Meter string
	// Stranded is Σ amount − spent of those grants reclaimed without a
	// final report (counted fully spent: never given back).
	Stranded decimal.Decimal
	// Unbalanced is how far the bucket gave back more than its grants left
	// unspent over its whole life: Σ returned − Σ (amount − spent) of its
	// released grants (positive: tokens appeared; must never happen;
	// negative by the refill a release deducts, docs/design.md §17).
	Unbalanced decimal.Decimal
	// Refused is the requests the bucket refused, over its whole life.
	Refused int64
}

// qRateAccounts is every rate bucket that grants of the given (customer,
// period start) pairs drew from.
const qRateAccounts = `
WITH t AS (SELECT * FROM unnest(@customers::text[], @starts::timestamptz[]) AS t(customer, period_start)),
     k AS (SELECT DISTINCT d.scope, d.meter FROM admission_rate_draws d JOIN admission_grants g ON g.id = d.grant_id
           JOIN t ON (t.customer, t.period_start) = (g.customer, g.period_start))
SELECT k.scope, k.meter,
       coalesce((SELECT sum(g.amount - g.spent) FROM admission_rate_draws d JOIN admission_grants g ON g.id = d.grant_id
                 JOIN t ON (t.customer, t.period_start) = (g.customer, g.period_start)
                 WHERE (d.scope, d.meter) = (k.scope, k.meter) AND g.ended_at IS NULL AND g.reclaim_at <= @now), 0)::text,
       (b.returned - coalesce((SELECT sum(g.amount - g.spent) FROM admission_rate_draws d JOIN admission_grants g ON g.id = d.grant_id
                               WHERE (d.scope, d.meter) = (k.scope, k.meter) AND g.end_reason = 'released'), 0))::text,
       b.refused
FROM k JOIN admission_rate_buckets b USING (scope, meter)
ORDER BY k.scope, k.meter`

// RateAccounts reads the rate budgets the grants of customers[i] in the
// period starting at starts[i] drew from.
func RateAccounts(ctx context.Context, db DBTX, customers []string, starts []time.Time, now time.Time) ([]RateAccount, error) {
	rows, err := db.Query(ctx, qRateAccounts, pgnamed.Args{"customers": customers, "starts": starts, "now": now})
	if err != nil {
		return nil, fmt.Errorf("admission: rate accounts: %w", err)
	}
	out, err := pgx.CollectRows(rows, func(row pgx.CollectableRow) (RateAccount, error) {
		var a RateAccount
		var stranded, unbalanced string
		if err := row.Scan(&a.Scope, &a.Meter, &stranded, &unbalanced, &a.Refused); err != nil {
			return RateAccount{}, err
		}
		var err error
		if a.Stranded, err = decimal.NewFromString(stranded); err != nil {
			return RateAccount{}, err
		}
		if a.Unbalanced, err = decimal.NewFromString(unbalanced); err != nil {
			return RateAccount{}, err
		}
		return a, nil
	})
	if err != nil {
		return nil, fmt.Errorf("admission: rate accounts: %w", err)
	}
	return out, nil
}
