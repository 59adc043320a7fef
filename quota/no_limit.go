package quota

import (
	"context"
	"fmt"
	"sort"
	"time"

	"github.com/tally-ledger/tally/periods"
)

// undecided is a key with a published decision whose rule in force has no
// lagged period limit: a customer's rate contract (docs/design.md §17), a
// pool or global rule admitted exactly, or no rule at all. Its last period
// decision must not stay the last one gateways read: it gets a NoLimit
// decision instead.
type undecided struct {
	prev    Decision // the key's last published decision
	version int64    // of the rule in force; prev's when there is none
	period  periods.Period
}

// loadUndecided returns the keys of last that snap does not decide and
// whose rule in force at now has no lagged period limit, sorted by key. A
// key whose rule has one after all (a version committed since snap was
// read) is left to the next evaluation.
func loadUndecided(ctx context.Context, db DBTX, last map[string]Decision, snap []ruleUsage, now time.Time) ([]undecided, error) {
	decided := make(map[string]bool, len(snap))
	for _, u := range snap {
		decided[u.rule.Customer+"/"+u.rule.Meter] = true
	}
	var prevs []Decision
	for k, d := range last {
		if !decided[k] {
			prevs = append(prevs, d)
		}
	}
	if len(prevs) == 0 {
		return nil, nil
	}
	sort.Slice(prevs, func(i, j int) bool { return prevs[i].Key() < prevs[j].Key() })
	n := len(prevs)
	customers, meters, scoped := make([]string, n), make([]string, n), make([]bool, n)
	for i, d := range prevs {
		customers[i], meters[i], scoped[i] = d.Customer, d.Meter, ValidScope(d.Customer)
	}
	rows, err := db.Query(ctx, qRulesUndecided, customers, meters, scoped, now)
	if err != nil {
		return nil, fmt.Errorf("quota: read rules without a period limit: %w", err)
	}
	defer rows.Close()
	var out []undecided
	for rows.Next() {
		var i int64
		var version *int64
		var limited bool
		var raw []byte
		if err := rows.Scan(&i, &version, &limited, &raw); err != nil {
			return nil, fmt.Errorf("quota: read rules without a period limit: %w", err)
		}
		if i < 1 || int(i) > n {
			return nil, fmt.Errorf("quota: read rules without a period limit: row %d of %d", i, n)
		}
		if limited {
			continue
		}
		u := undecided{prev: prevs[i-1], version: prevs[i-1].RuleVersion}
		if version != nil {
			u.version = *version
		}
		sch := scopeCalendar
		if !scoped[i-1] {
			if sch, err = customerSchedule(u.prev.Customer, raw); err != nil {
				return nil, err
			}
		}
		if u.period, err = sch.PeriodAt(now); err != nil {
			return nil, fmt.Errorf("quota: %s: period at %s: %w", u.prev.Key(), now, err)
		}
		out = append(out, u)
	}
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("quota: read rules without a period limit: %w", err)
	}
	return out, nil
}
