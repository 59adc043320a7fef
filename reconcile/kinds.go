package reconcile

import (
	"context"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/shopspring/decimal"

	"github.com/tally-ledger/tally/ledger"
	"github.com/tally-ledger/tally/periods"
)

// Gauges and unique meters (docs/design.md §16).
const (
	CheckKinds = "gauges_and_uniques"

	KindGaugeMismatch  = "gauge_mismatch"        // a gauge's aggregates differ from those recomputed from its readings
	KindGaugeMaxClosed = "gauge_max_after_close" // a late reading changed a closed period's max (notice: the statement stays)
	KindUniqueMismatch = "unique_count_mismatch" // distinct members differ from a recount of the readings
	KindUniqueClosed   = "unique_after_close"    // members seen in a closed period after its close (notice)
)

// checkKinds recomputes, for each target, every gauge's aggregates from
// its readings and recounts every unique meter's members, and compares
// them with what the ledger answers (an open period) or what the frozen
// statement says plus what was billed later as prior-period adjustments
// (a closed one).
func (r *runner) checkKinds(ctx context.Context, tx pgx.Tx, tg target, now time.Time) error {
	who, err := ledger.KindCustomers(ctx, tx)
	if err != nil {
		return err
	}
	// A few small statements per customer, each reading by key: planned
	// once for every customer (qGenericPlans) rather than at each, as the
	// run's set-based statements are (qRunSettings).
	if _, err := tx.Exec(ctx, qGenericPlans); err != nil {
		return err
	}
	defer tx.Exec(context.WithoutCancel(ctx), qCustomPlans)
	for i, c := range tg.customers {
		if !who[c] {
			continue
		}
		p := periods.Period{Name: r.periodOf[c], Start: tg.starts[i], End: tg.ends[i]}
		start := p.Start
		asOf := p.End
		if now.Before(asOf) {
			asOf = now
		}
		// The frozen statement's gauge and unique lines, or the ledger's
		// answer for an open period (as a statement reads them), not the
		// whole statement: the counter lines are the rollup check's.
		st, closed, err := periods.Store{}.Frozen(ctx, tx, c, p)
		if err != nil {
			return err
		}
		if !closed {
			kl, err := ledger.StatementKinds(ctx, tx, c, p, now)
			if err != nil {
				return err
			}
			st.Gauges, st.Uniques = kl.Gauges, kl.Uniques
		}
		gauges, err := ledger.GaugeMetersOf(ctx, tx, c)
		if err != nil {
			return err
		}
		moved := map[string]decimal.Decimal{}
		if st.Final && len(gauges) > 0 {
			if moved, err = ledger.PriorPeriodMoves(ctx, tx, c, p.Start); err != nil {
				return err
			}
		}
		lines := map[string]periods.GaugeLine{}
		for _, g := range st.Gauges {
			lines[g.Meter] = g
		}
		for _, m := range gauges {
			want, err := ledger.RecomputeGaugeFor(ctx, tx, c, m, p.Start, asOf)
			if err != nil {
				return err
			}
			got := lines[m] // zero when the statement has no line
			if !st.Final {
				if !got.UnitSeconds.Equal(want.UnitSeconds) || !got.Max.Equal(want.Max) || !got.Latest.Equal(want.Latest) {
					diff := got.UnitSeconds.Sub(want.UnitSeconds)
					r.find(Finding{Kind: KindGaugeMismatch, Severity: Discrepancy, Customer: c, Meter: m, Period: &start, Amount: &diff,
						Detail: fmt.Sprintf("the ledger answers max %s latest %s unit_seconds %s; its readings give max %s latest %s unit_seconds %s",
							got.Max, got.Latest, got.UnitSeconds, want.Max, want.Latest, want.UnitSeconds)})
				}
				continue
			}
			if billed := got.UnitSeconds.Add(moved[m]); !billed.Equal(want.UnitSeconds) {
				diff := billed.Sub(want.UnitSeconds)
				r.find(Finding{Kind: KindGaugeMismatch, Severity: Discrepancy, Customer: c, Meter: m, Period: &start, Amount: &diff,
					Detail: fmt.Sprintf("the frozen statement's unit_seconds %s plus %s billed later as prior-period adjustments is not the %s its readings give",
						got.UnitSeconds, moved[m], want.UnitSeconds)})
			}
			if !got.Max.Equal(want.Max) {
				r.find(Finding{Kind: KindGaugeMaxClosed, Severity: Notice, Customer: c, Meter: m, Period: &start,
					Detail: fmt.Sprintf("the frozen statement says max %s; with the readings that arrived after the close it is %s", got.Max, want.Max)})
			}
		}
		counts, err := ledger.RecountUniques(ctx, tx, c, p)
		if err != nil {
			return err
		}
		frozen := map[string]int64{}
		for _, u := range st.Uniques {
			frozen[u.Meter] = u.Count
		}
		live := frozen
		if st.Final {
			if live, err = r.liveUniques(ctx, tx, c, p); err != nil {
				return err
			}
		}
		for m, n := range counts {
			if live[m] != n {
				d := decimal.NewFromInt(live[m] - n)
				r.find(Finding{Kind: KindUniqueMismatch, Severity: Discrepancy, Customer: c, Meter: m, Period: &start, Amount: &d,
					Detail: fmt.Sprintf("the ledger counts %d distinct members; its readings have %d", live[m], n)})
			}
			if st.Final && frozen[m] != n {
				r.find(Finding{Kind: KindUniqueClosed, Severity: Notice, Customer: c, Meter: m, Period: &start,
					Detail: fmt.Sprintf("the frozen statement counts %d distinct members; with the readings that arrived after the close there are %d", frozen[m], n)})
			}
		}
	}
	return nil
}

// liveUniques is what the ledger counts now for a closed period.
func (r *runner) liveUniques(ctx context.Context, tx pgx.Tx, customer string, p periods.Period) (map[string]int64, error) {
	us, err := ledger.ReadUniques(ctx, tx, customer, "", p)
	if err != nil {
		return nil, err
	}
	out := map[string]int64{}
	for _, u := range us {
		out[u.Meter] = u.Count
	}
	return out, nil
}
