package reconcile

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"

	"github.com/tally-ledger/tally/periods"
)

// Gate is the periods.Gate that makes a clean run the precondition of a
// close: the newest run for the customer's period must be clean and the
// period's billed totals (read inside the closing transaction, under the
// customer lock) must still equal what that run saw.
func Gate(ctx context.Context, tx pgx.Tx, customer string, p periods.Period) (uuid.UUID, error) {
	var id uuid.UUID
	var clean bool
	var raw []byte
	err := tx.QueryRow(ctx, `
SELECT v.run_id, v.clean, v.totals FROM reconciliation_verdicts v
JOIN reconciliation_runs r ON r.id = v.run_id
WHERE v.customer = $1 AND v.period_start = $2 AND r.status <> 'failed'
ORDER BY r.started_at DESC, r.id DESC LIMIT 1`, customer, p.Start).Scan(&id, &clean, &raw)
	if errors.Is(err, pgx.ErrNoRows) {
		return uuid.Nil, fmt.Errorf("period %s of %q has never been reconciled: %w", p.Name, customer, periods.ErrNotReconciled)
	}
	if err != nil {
		return uuid.Nil, fmt.Errorf("reconcile: gate: %w", err)
	}
	if !clean {
		return uuid.Nil, fmt.Errorf("period %s of %q: the latest run %s found discrepancies: %w", p.Name, customer, id, periods.ErrNotReconciled)
	}
	var saw map[string]string
	if err := json.Unmarshal(raw, &saw); err != nil {
		return uuid.Nil, err
	}
	rows, err := tx.Query(ctx, `SELECT meter, trim_scale(sum(quantity))::text FROM rollups WHERE customer = $1 AND period_start = $2 GROUP BY 1`, customer, p.Start)
	if err != nil {
		return uuid.Nil, err
	}
	now := map[string]string{}
	for rows.Next() {
		var m, q string
		if err := rows.Scan(&m, &q); err != nil {
			rows.Close()
			return uuid.Nil, err
		}
		now[m] = q
	}
	rows.Close()
	if err := rows.Err(); err != nil {
		return uuid.Nil, err
	}
	for m, q := range now {
		if !dec(q).Equal(dec(saw[m])) {
			return uuid.Nil, fmt.Errorf("period %s of %q changed since run %s (%s: %s then, %s now): reconcile again: %w",
				p.Name, customer, id, m, orZero(saw[m]), q, periods.ErrNotReconciled)
		}
	}
	for m, q := range saw {
		if _, ok := now[m]; !ok && !dec(q).IsZero() {
			return uuid.Nil, fmt.Errorf("period %s of %q changed since run %s (%s): reconcile again: %w", p.Name, customer, id, m, periods.ErrNotReconciled)
		}
	}
	return id, nil
}

func orZero(s string) string {
	if s == "" {
		return "0"
	}
	return s
}

// closeClean closes the period of every customer the run found clean and
// whose grace has ended. Customers still open or in grace are left alone.
func (rc *Reconciler) closeClean(ctx context.Context, run *Run, vs []verdict, now time.Time) error {
	store := periods.Store{Grace: rc.cfg.Grace, Clock: rc.cfg.Clock, Gate: Gate}
	var errs []error
	for _, v := range vs {
		if !v.clean || periods.StateOf(v.period, now, rc.cfg.Grace, false) != periods.AwaitingClose {
			continue
		}
		var closed bool
		if err := rc.cfg.Pool.QueryRow(ctx, `SELECT EXISTS (SELECT 1 FROM period_closes WHERE customer = $1 AND period_start = $2)`,
			v.customer, v.period.Start).Scan(&closed); err != nil {
			return err
		}
		if closed {
			continue
		}
		err := pgx.BeginFunc(ctx, rc.cfg.Pool, func(tx pgx.Tx) error {
			_, err := store.Close(ctx, tx, periods.CloseRequest{Customer: v.customer, Period: v.period.Name})
			return err
		})
		if err != nil {
			rc.log.Warn("period not closed", "customer", v.customer, "period", v.period.Name, "err", err)
			errs = append(errs, fmt.Errorf("close %s %s: %w", v.customer, v.period.Name, err))
			continue
		}
		run.Closed = append(run.Closed, v.customer)
		rc.log.Info("period closed", "customer", v.customer, "period", v.period.Name, "run", run.ID)
	}
	return errors.Join(errs...)
}
