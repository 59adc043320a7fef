package quota

import (
	"context"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/shopspring/decimal"

	"github.com/tally-ledger/tally/periods"
)

// scopeCalendar is the billing calendar of pools and the global scope.
var scopeCalendar = periods.NewSchedule(periods.DefaultCalendar())

// loadScopeSnapshot reads every lagged pool and global rule in force with
// its usage (docs/design.md §13): the sum of its members' rollups over the
// scope's period (monthly, UTC), a member being every customer that was in
// the pool at some time of the period (leaving takes nothing back; every
// customer, for global), and as_of the oldest of the members' partitions.
// Each becomes a rule whose Customer is its scope, so its decision goes to
// tally.quota-decisions under the key "<scope>/<meter>". Exact scope rules
// are enforced by grants (package admission), not by decisions.
func loadScopeSnapshot(ctx context.Context, db DBTX, q snapshotQuery) ([]ruleUsage, error) {
	p, err := scopeCalendar.PeriodAt(q.now)
	if err != nil {
		return nil, err
	}
	prev, err := scopeCalendar.Previous(p)
	if err != nil {
		prev = p
	}
	rows, err := db.Query(ctx, qScopeRulesInForce, pgx.NamedArgs{"now": q.now})
	if err != nil {
		return nil, fmt.Errorf("quota: read scope rules: %w", err)
	}
	rules, err := pgx.CollectRows(rows, func(row pgx.CollectableRow) (ScopeRule, error) { return scanScopeRule(row) })
	if err != nil {
		return nil, fmt.Errorf("quota: read scope rules: %w", err)
	}
	if len(rules) == 0 {
		return nil, nil
	}
	out := make([]ruleUsage, len(rules))
	scopes, meters := make([]string, len(rules)), make([]string, len(rules))
	for i, r := range rules {
		out[i] = ruleUsage{period: p, prev: prev, rule: Rule{Customer: r.Scope, Meter: r.Meter, Version: r.Version,
			EffectiveAt: r.EffectiveAt, Limit: r.Limit, WarnAt: r.WarnAt, Mode: r.Mode, OnStale: Allow,
			StaleAfter: DurationText(DefaultStaleAfter), Admission: Lagged, OnUnreachable: UnreachableDeny,
			CreatedAt: r.CreatedAt, Actor: r.Actor, Reason: r.Reason}}
		scopes[i], meters[i] = r.Scope, r.Meter
	}
	sql := qScopeUsageByTopic
	if q.byCustomer {
		sql = qScopeUsageByCustomer
	}
	rows, err = db.Query(ctx, sql, pgx.NamedArgs{"scopes": scopes, "meters": meters, "start": p.Start.UTC(),
		"end": p.End.UTC(), "prev_start": prev.Start.UTC(), "now": q.now, "topic": q.ingestTopic})
	if err != nil {
		return nil, fmt.Errorf("quota: read scope usage: %w", err)
	}
	defer rows.Close()
	seen := 0
	for rows.Next() {
		var i int64
		var used, prevUsed string
		var asOf *time.Time
		if err := rows.Scan(&i, &used, &prevUsed, &asOf); err != nil {
			return nil, fmt.Errorf("quota: read scope usage: %w", err)
		}
		if i < 1 || int(i) > len(out) {
			return nil, fmt.Errorf("quota: read scope usage: row %d of %d", i, len(out))
		}
		u := &out[i-1]
		if u.used, err = decimal.NewFromString(used); err != nil {
			return nil, fmt.Errorf("quota: read scope usage: %q: %w", used, err)
		}
		if u.prevUsed, err = decimal.NewFromString(prevUsed); err != nil {
			return nil, fmt.Errorf("quota: read scope usage: %q: %w", prevUsed, err)
		}
		if asOf != nil {
			a := asOf.UTC()
			u.asOf = &a
		}
		seen++
	}
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("quota: read scope usage: %w", err)
	}
	if seen != len(out) {
		return nil, fmt.Errorf("quota: read scope usage: %d rows for %d rules", seen, len(out))
	}
	return out, nil
}
