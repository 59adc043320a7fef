package quota

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"
)

// qRuleAt is the version in force, as quota_rule_in_force (migration
// 00015) defines it once for every caller.
const qRuleAt = `SELECT ` + ruleColumns + ` FROM quota_rule_in_force($1, $2, $3)`

// RuleAt returns the rule of customer and meter in force at t: of the
// versions whose effective time has come, the latest effective, ties
// broken by the higher version (docs/design.md §12). ErrNotFound when
// there is none. Every query that needs the version in force calls the
// same SQL function, quota_rule_in_force (quota_scope_rule_in_force for
// pool and global rules).
func RuleAt(ctx context.Context, db DBTX, customer, meter string, t time.Time) (Rule, error) {
	return ruleAt(db.QueryRow(ctx, qRuleAt, customer, meter, t), customer, meter)
}

// QueueRuleAt queues RuleAt's read on b, for a caller that sends several
// reads in one round trip: done gets what RuleAt would return, when b's
// results are read.
func QueueRuleAt(b *pgx.Batch, customer, meter string, t time.Time, done func(Rule, error)) {
	b.Queue(qRuleAt, customer, meter, t).QueryRow(func(row pgx.Row) error {
		done(ruleAt(row, customer, meter))
		return nil
	})
}

func ruleAt(row pgx.Row, customer, meter string) (Rule, error) {
	r, err := scanRule(row)
	if errors.Is(err, pgx.ErrNoRows) {
		return Rule{}, fmt.Errorf("%w: %s/%s", ErrNotFound, customer, meter)
	}
	if err != nil {
		return Rule{}, fmt.Errorf("quota: read rule: %w", err)
	}
	return r, nil
}
