package reconcile

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"sort"
	"time"

	"github.com/tally-ledger/tally/periods"
)

// maxDuePerCustomer bounds how many unclosed ended periods of one customer
// a nightly run lists (a daily calendar over a decade is under 4,000); the
// oldest are listed first, the rest on the following nights. Closed
// periods are walked past, not counted.
const maxDuePerCustomer = 5000

// Nightly reconciles every period whose grace has ended and that is not
// closed, closing the clean ones, then checks the current open periods
// without closing them. It returns every run it made; NightlyEach passes
// each to a function as it ends instead, and keeps none.
//
// Due periods come from each customer's calendar, from its first period
// (the earliest of its creation and its first usage: counter rollups,
// gauge days, unique counts) to now: a period with
// no usage is due like any other and closes with a zero statement, so
// usage that arrives months late is a prior-period adjustment, never a new
// statement for an old month.
func (rc *Reconciler) Nightly(ctx context.Context) ([]*Run, error) {
	var runs []*Run
	err := rc.NightlyEach(ctx, func(r *Run) error {
		runs = append(runs, r)
		return nil
	})
	return runs, err
}

// NightlyEach is Nightly passing each run to each when it ends, failed or
// not, and holding none: after an outage of the job, or on a ledger with
// a history, hundreds of periods are due, each run with every customer's
// totals and findings. An error of each stops the job and is returned.
func (rc *Reconciler) NightlyEach(ctx context.Context, each func(*Run) error) error {
	now := rc.cfg.Clock().UTC()
	names, err := rc.duePeriods(ctx, now)
	if err != nil {
		return err
	}
	var errs []error
	for i, n := range names {
		// An interrupted job stops here: what it closed stays closed (each
		// close is its own transaction) and running it again goes on.
		if ctx.Err() != nil {
			return stopped(errs, ctx.Err())
		}
		rc.progress("period %d/%d: %s\n", i+1, len(names)+1, n)
		run, err := rc.Run(ctx, Options{Period: n, Close: true})
		if err != nil {
			errs = append(errs, err)
		}
		if run != nil {
			if err := each(run); err != nil {
				return errors.Join(append(errs, err)...)
			}
		}
	}
	if ctx.Err() != nil {
		return stopped(errs, ctx.Err())
	}
	rc.progress("period %d/%d: current\n", len(names)+1, len(names)+1)
	run, err := rc.Run(ctx, Options{Period: "current"})
	if err != nil && !errors.Is(err, periods.ErrNoSuchPeriod) {
		errs = append(errs, err)
	}
	if run != nil {
		if err := each(run); err != nil {
			errs = append(errs, err)
		}
	}
	return errors.Join(errs...)
}

// duePeriods lists, by name, every customer's periods whose grace has
// ended and that have no close record.
func (rc *Reconciler) duePeriods(ctx context.Context, now time.Time) ([]string, error) {
	rows, err := rc.cfg.Pool.Query(ctx, qCustomersDue)
	if err != nil {
		return nil, fmt.Errorf("reconcile: nightly: %w", err)
	}
	defer rows.Close()
	due := map[string]bool{}
	for rows.Next() {
		var id string
		var raw []byte
		var first time.Time
		var closedAt []time.Time
		if err := rows.Scan(&id, &raw, &first, &closedAt); err != nil {
			return nil, err
		}
		var s periods.Schedule
		if err := json.Unmarshal(raw, &s); err != nil {
			return nil, fmt.Errorf("customer %q: stored calendar: %w", id, err)
		}
		closed := make(map[int64]bool, len(closedAt))
		for _, t := range closedAt {
			closed[t.UnixMicro()] = true
		}
		p, err := s.PeriodAt(first)
		if err != nil {
			return nil, fmt.Errorf("customer %q: %w", id, err)
		}
		for n := 0; periods.StateOf(p, now, rc.cfg.Grace, false) == periods.AwaitingClose; {
			if n == maxDuePerCustomer {
				// The oldest are listed; the rest come on the next nights.
				rc.log.Warn("customer has more periods awaiting close than one nightly run lists",
					"customer", id, "listed", maxDuePerCustomer, "since", first)
				break
			}
			if !closed[p.Start.UnixMicro()] {
				due[p.Name] = true
				n++
			}
			if p, err = s.Next(p); err != nil {
				return nil, fmt.Errorf("customer %q: %w", id, err)
			}
		}
	}
	if err := rows.Err(); err != nil {
		return nil, err
	}
	names := make([]string, 0, len(due))
	for n := range due {
		names = append(names, n)
	}
	sort.Strings(names)
	return names, nil
}

// stopped is the error of a job interrupted by cause: the errors so far,
// cause among them once.
func stopped(errs []error, cause error) error {
	for _, err := range errs {
		if errors.Is(err, cause) {
			return errors.Join(errs...)
		}
	}
	return errors.Join(append(errs, cause)...)
}
