package quota

import (
	"context"
	"fmt"
	"time"

	"github.com/shopspring/decimal"

	"github.com/tally-ledger/tally/ledger"
	"github.com/tally-ledger/tally/periods"
)

// kindItem is one customer rule's usage to be read from its meter's kind.
type kindItem struct {
	customer, meter string
	period, prev    periods.Period
	used, prevUsed  *decimal.Decimal
	fallback        **rate // cleared: the rollup rate says nothing of a level
}

// kindUsed replaces the usage of rules on gauge and unique meters with
// the aggregate a lagged rule limits (docs/design.md §16): a gauge's
// period max (the level carried in at its start included), a unique
// meter's distinct members in the period. Both come from the ledger's
// per-day rows (ledger.ReadKinds: at most a row per day of the period),
// never from the period's readings. Counters keep their rollup usage.
func kindUsed(ctx context.Context, db DBTX, now time.Time, items []kindItem) error {
	if len(items) == 0 {
		return nil
	}
	names := make([]string, 0, len(items))
	for _, it := range items {
		names = append(names, it.meter)
	}
	kinds, err := ledger.MeterKinds(ctx, db, names)
	if err != nil {
		return fmt.Errorf("quota: read meter kinds: %w", err)
	}
	for _, it := range items {
		kind := kinds[it.meter]
		if kind == ledger.Counter {
			continue
		}
		if *it.used, err = kindAggregate(ctx, db, kind, it.customer, it.meter, it.period, now); err != nil {
			return err
		}
		if *it.prevUsed, err = kindAggregate(ctx, db, kind, it.customer, it.meter, it.prev, now); err != nil {
			return err
		}
		if it.fallback != nil {
			*it.fallback = nil
		}
	}
	return nil
}

// kindAggregate is a gauge's max or a unique meter's count over p through now.
func kindAggregate(ctx context.Context, db DBTX, kind ledger.MeterKind, customer, meter string, p periods.Period, now time.Time) (decimal.Decimal, error) {
	k, err := ledger.ReadKinds(ctx, db, customer, meter, p, now)
	if err != nil {
		return decimal.Zero, fmt.Errorf("quota: read %s usage: %w", kind, err)
	}
	if kind == ledger.Gauge {
		for _, g := range k.Gauges(now) {
			if g.Meter == meter {
				return g.Max, nil
			}
		}
		return decimal.Zero, nil
	}
	for _, u := range k.Uniques {
		if u.Meter == meter {
			return decimal.NewFromInt(u.Count), nil
		}
	}
	return decimal.Zero, nil
}
