package quota

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"
)

const qRuleAt = `
SELECT ` + ruleColumns + `
FROM quota_rules
WHERE customer = $1 AND meter = $2 AND effective_at <= $3
ORDER BY version DESC
LIMIT 1`

// RuleAt returns the rule of customer and meter in force at t (the newest
// version effective by then). ErrNotFound when there is none.
func RuleAt(ctx context.Context, db DBTX, customer, meter string, t time.Time) (Rule, error) {
	r, err := scanRule(db.QueryRow(ctx, qRuleAt, customer, meter, t))
	if errors.Is(err, pgx.ErrNoRows) {
		return Rule{}, fmt.Errorf("%w: %s/%s", ErrNotFound, customer, meter)
	}
	if err != nil {
		return Rule{}, fmt.Errorf("quota: read rule: %w", err)
	}
	return r, nil
}
