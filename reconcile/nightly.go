package reconcile

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"sort"

	"github.com/tally-ledger/tally/periods"
)

// Nightly reconciles every period whose grace has ended and that is not
// closed, closing the clean ones, then checks the current open periods
// without closing them. It returns every run it made.
func (rc *Reconciler) Nightly(ctx context.Context) ([]*Run, error) {
	now := rc.cfg.Clock().UTC()
	rows, err := rc.cfg.Pool.Query(ctx, `
SELECT c.id, c.schedule, p.period_start
FROM customers c
JOIN (SELECT DISTINCT customer, period_start FROM rollups) p ON p.customer = c.id
WHERE NOT EXISTS (SELECT 1 FROM period_closes pc WHERE pc.customer = c.id AND pc.period_start = p.period_start)`)
	if err != nil {
		return nil, fmt.Errorf("reconcile: nightly: %w", err)
	}
	due := map[string]bool{}
	for rows.Next() {
		var id string
		var raw []byte
		var p periods.Period
		if err := rows.Scan(&id, &raw, &p.Start); err != nil {
			rows.Close()
			return nil, err
		}
		var s periods.Schedule
		if err := json.Unmarshal(raw, &s); err != nil {
			rows.Close()
			return nil, fmt.Errorf("customer %q: stored calendar: %w", id, err)
		}
		if p, err = s.PeriodAt(p.Start); err != nil {
			rows.Close()
			return nil, err
		}
		if periods.StateOf(p, now, rc.cfg.Grace, false) == periods.AwaitingClose {
			due[p.Name] = true
		}
	}
	rows.Close()
	if err := rows.Err(); err != nil {
		return nil, err
	}
	names := make([]string, 0, len(due))
	for n := range due {
		names = append(names, n)
	}
	sort.Strings(names)

	var runs []*Run
	var errs []error
	for _, n := range names {
		run, err := rc.Run(ctx, Options{Period: n, Close: true})
		if run != nil {
			runs = append(runs, run)
		}
		if err != nil {
			errs = append(errs, err)
		}
	}
	run, err := rc.Run(ctx, Options{Period: "current"})
	if run != nil {
		runs = append(runs, run)
	}
	if err != nil && !errors.Is(err, periods.ErrNoSuchPeriod) {
		errs = append(errs, err)
	}
	return runs, errors.Join(errs...)
}
