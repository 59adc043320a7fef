package reconcile

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/shopspring/decimal"

	"github.com/tally-ledger/tally/ledger"
	"github.com/tally-ledger/tally/periods"
)

// Gate is the periods.Gate that makes a clean run the precondition of a
// close: the newest run for the customer's period must be clean, and
// everything that run checked for the period (read again inside the
// closing transaction, under the customer lock that keeps new usage out)
// must be as the run saw it: the ledger rows billed in it (a gauge's
// prior-period adjustments included), its open gaps,
// conflicts, ledger findings and late usage, and the unreplayed dead
// letters and offset jumps that could hold its usage. A run that predates
// any of these is no ticket to close: reconcile again.
func Gate(ctx context.Context, tx pgx.Tx, customer string, p periods.Period) (uuid.UUID, error) {
	var id uuid.UUID
	var clean bool
	var raw []byte
	err := tx.QueryRow(ctx, qVerdictLatest, customer, p.Start).Scan(&id, &clean, &raw)
	if errors.Is(err, pgx.ErrNoRows) {
		return uuid.Nil, fmt.Errorf("period %s of %q has never been reconciled: %w", p.Name, customer, periods.ErrNotReconciled)
	}
	if err != nil {
		return uuid.Nil, fmt.Errorf("reconcile: gate: %w", err)
	}
	if !clean {
		return uuid.Nil, fmt.Errorf("period %s of %q: the latest run %s found discrepancies: %w", p.Name, customer, id, periods.ErrNotReconciled)
	}
	if raw == nil {
		return uuid.Nil, fmt.Errorf("period %s of %q: run %s predates the checks a close rests on: reconcile again: %w", p.Name, customer, id, periods.ErrNotReconciled)
	}
	var saw fingerprint
	if err := json.Unmarshal(raw, &saw); err != nil {
		return uuid.Nil, fmt.Errorf("reconcile: gate: run %s: %w", id, err)
	}
	tg := target{customers: []string{customer}, starts: []time.Time{p.Start.UTC()}, ends: []time.Time{p.End.UTC()}}
	usage, err := ledgerUsage(ctx, tx, customer, p.Start)
	if err != nil {
		return uuid.Nil, fmt.Errorf("reconcile: gate: %w", err)
	}
	fps, err := fingerprints(ctx, tx, tg, map[string]string{customer: usage})
	if err != nil {
		return uuid.Nil, fmt.Errorf("reconcile: gate: %w", err)
	}
	if changed := saw.changes(fps[customer]); len(changed) > 0 {
		return uuid.Nil, fmt.Errorf("period %s of %q changed since run %s (%s): reconcile again: %w",
			p.Name, customer, id, strings.Join(changed, ", "), periods.ErrNotReconciled)
	}
	// Stream state is not part of the fingerprint (any new usage moves
	// it, in any period), so its invariant is checked again here: the
	// billed deltas of each of the customer's streams add up to its last
	// total (the primary key of records finds each stream's rows).
	var broken int64
	if err := tx.QueryRow(ctx, qStreamsBroken, customer).Scan(&broken); err != nil {
		return uuid.Nil, fmt.Errorf("reconcile: gate: %w", err)
	}
	if broken > 0 {
		return uuid.Nil, fmt.Errorf("period %s of %q: %d streams' totals no longer add up to their billed records since run %s: reconcile again: %w",
			p.Name, customer, broken, id, periods.ErrNotReconciled)
	}
	return id, nil
}

// fingerprint is what a run checked for one customer's period, compact
// enough to store with its verdict and cheap enough to recompute at close.
// The ledger's tables are append-only where it counts (records, entries,
// conflicts, findings), so a count and a sum see every addition; sets that
// shrink too (open gaps, pending dead letters) are hashed whole.
type fingerprint struct {
	Usage       string `json:"usage"` // per meter: ledger rows (records and entries) and their billed sum
	Gaps        string `json:"gaps"`
	Conflicts   int64  `json:"conflicts"`
	Findings    int64  `json:"findings"`
	Late        int64  `json:"late"`
	DeadLetters string `json:"dead_letters"`
	Unowned     string `json:"unowned_dead_letters"`
	Jumps       string `json:"offset_jumps"`
	// Kinds counts the gauge and unique readings that bear on the period
	// ("" when there are none, as in runs stored before it was kept; see
	// qFingerprint for its "v2/" form).
	Kinds string `json:"kinds,omitempty"`
	// GaugePrior counts and sums the gauges' prior-period adjustments
	// billed in the period ("" when there are none, as in runs stored
	// before it was kept).
	GaugePrior string `json:"gauge_prior,omitempty"`
}

func (a fingerprint) changes(b fingerprint) []string {
	var out []string
	add := func(changed bool, what string) {
		if changed {
			out = append(out, what)
		}
	}
	add(a.Usage != b.Usage, "new usage or adjustments")
	add(a.Gaps != b.Gaps, "open gaps changed")
	add(a.Conflicts != b.Conflicts, fmt.Sprintf("conflicts: %d then, %d now", a.Conflicts, b.Conflicts))
	add(a.Findings != b.Findings, fmt.Sprintf("ledger findings: %d then, %d now", a.Findings, b.Findings))
	add(a.Late != b.Late, "late usage")
	add(a.DeadLetters != b.DeadLetters, "unreplayed dead letters changed")
	add(a.Unowned != b.Unowned, "unreplayed dead letters of no known customer changed")
	add(a.Jumps != b.Jumps, "offset jumps (messages deleted unread) changed")
	add(a.GaugePrior != b.GaugePrior, "gauge prior-period adjustments")
	switch {
	case a.Kinds != "" && b.Kinds != "" && strings.HasPrefix(a.Kinds, "v2/") != strings.HasPrefix(b.Kinds, "v2/"):
		// A run stored before gauge readings were counted as they are now.
		out = append(out, "gauge readings are counted differently since the run")
	case a.Kinds != b.Kinds:
		out = append(out, "new gauge or unique readings")
	}
	return out
}

// meterUsage is one meter's ledger rows billed in a period.
type meterUsage struct {
	meter string
	rows  int64
	sum   decimal.Decimal
}

// usageKey renders a customer's per-meter usage, the same way from a run's
// rollup check and from the gate's query.
func usageKey(ms []meterUsage) string {
	slices.SortFunc(ms, func(a, b meterUsage) int { return strings.Compare(a.meter, b.meter) })
	var b strings.Builder
	for _, m := range ms {
		if m.rows == 0 {
			continue
		}
		fmt.Fprintf(&b, "%s:%d:%s;", m.meter, m.rows, m.sum.String())
	}
	return b.String()
}

// ledgerUsage reads, per meter, the ledger rows billed in one customer's
// period (found through stream_periods and the primary key of records).
func ledgerUsage(ctx context.Context, tx pgx.Tx, customer string, start time.Time) (string, error) {
	rows, err := tx.Query(ctx, qLedgerUsage, customer, start)
	if err != nil {
		return "", err
	}
	ms, err := pgx.CollectRows(rows, func(row pgx.CollectableRow) (meterUsage, error) {
		var m meterUsage
		var q numeric
		err := row.Scan(&m.meter, &m.rows, &q)
		m.sum = q.dec()
		return m, err
	})
	if err != nil {
		return "", err
	}
	return usageKey(ms), nil
}

// fingerprints computes the fingerprint of every target, given each
// customer's usage key.
func fingerprints(ctx context.Context, tx pgx.Tx, tg target, usage map[string]string) (map[string]fingerprint, error) {
	rows, err := tx.Query(ctx, qFingerprint, tg.args())
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	out := make(map[string]fingerprint, len(tg.customers))
	for rows.Next() {
		var c string
		var fp fingerprint
		if err := rows.Scan(&c, &fp.Gaps, &fp.Conflicts, &fp.Findings, &fp.Late, &fp.DeadLetters, &fp.Unowned, &fp.Jumps, &fp.Kinds, &fp.GaugePrior); err != nil {
			return nil, err
		}
		fp.Usage = usage[c]
		out[c] = fp
	}
	return out, rows.Err()
}

// closeClean closes the period of every customer the run found clean and
// whose grace has ended. Customers still open or in grace are left alone.
func (rc *Reconciler) closeClean(ctx context.Context, run *Run, vs []verdict, now time.Time) error {
	store := periods.Store{Grace: rc.cfg.Grace, Clock: rc.cfg.Clock, Gate: Gate, Kinds: ledger.StatementKinds}
	// The periods to close: clean, past their grace, and not closed (one
	// statement for all of them, not one per customer).
	var todo []verdict
	var customers []string
	var starts []time.Time
	for _, v := range vs {
		if v.clean && periods.StateOf(v.period, now, rc.cfg.Grace, false) == periods.AwaitingClose {
			todo = append(todo, v)
			customers, starts = append(customers, v.customer), append(starts, v.period.Start)
		}
	}
	if len(todo) == 0 {
		return nil
	}
	rows, err := rc.cfg.Pool.Query(ctx, qPeriodsClosed, customers, starts)
	if err != nil {
		return err
	}
	closedAlready, err := pgx.CollectRows(rows, pgx.RowTo[string])
	if err != nil {
		return err
	}
	due := len(todo) - len(closedAlready)
	skip := make(map[string]bool, len(closedAlready))
	for _, c := range closedAlready {
		skip[c] = true
	}
	// Each close is a transaction of its own: with tens of thousands of
	// customers this takes a while, so a terminal hears how far it is
	// (at most a line a second, and the last).
	done, last := 0, time.Now()
	defer func() {
		if due > 0 {
			rc.progress("closing %s: %d of %d clean periods closed\n", run.Period, done, due)
		}
	}()
	var errs []error
	for _, v := range todo {
		if skip[v.customer] {
			continue
		}
		if err := ctx.Err(); err != nil {
			return errors.Join(append(errs, err)...)
		}
		if time.Since(last) >= time.Second {
			rc.progress("closing %s: %d of %d clean periods closed\n", run.Period, done, due)
			last = time.Now()
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
		done++
		run.Closed = append(run.Closed, v.customer)
		rc.log.Info("period closed", "customer", v.customer, "period", v.period.Name, "run", run.ID)
	}
	return errors.Join(errs...)
}
