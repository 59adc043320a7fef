package ledger

import (
	"context"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/shopspring/decimal"

	"github.com/tally-ledger/tally/periods"
)

// GaugeUsage is a gauge's aggregates over a period, through AsOf (the
// period's end, or now while it is open) — docs/design.md §16.
type GaugeUsage struct {
	Meter string `json:"meter"`
	// Max is the highest customer level in the period, the level carried
	// in at its start included.
	Max decimal.Decimal `json:"max"`
	// Latest is the level in force just before AsOf (a reading stamped
	// exactly at AsOf belongs to what follows).
	Latest decimal.Decimal `json:"latest"`
	// UnitSeconds is the integral of the level over the period through
	// AsOf, exact to the microsecond; UnitHours is it in hours (for
	// display, rounded to 9 places).
	UnitSeconds decimal.Decimal `json:"unit_seconds"`
	UnitHours   decimal.Decimal `json:"unit_hours"`
	// Average is UnitSeconds over the period's seconds through AsOf
	// (rounded to 9 places).
	Average decimal.Decimal `json:"average"`
	// PriorPeriodUnitSeconds is level-seconds of closed periods that
	// changed late and are billed in this one.
	PriorPeriodUnitSeconds decimal.Decimal `json:"prior_period_unit_seconds"`
	AsOf                   time.Time       `json:"as_of"`
}

// UniqueUsage is a unique meter's distinct members over a period and per
// bucket day.
type UniqueUsage struct {
	Meter string      `json:"meter"`
	Count int64       `json:"count"`
	Days  []UniqueDay `json:"days"`
}

// UniqueDay is one bucket day's distinct members.
type UniqueDay struct {
	Start time.Time `json:"start"`
	Count int64     `json:"count"`
}

// GaugeMeters lists the gauges of a customer with a level in or before the
// period ending at end (meter "": every one).
func GaugeMeters(ctx context.Context, db DBTX, customer, meter string, end time.Time) ([]string, error) {
	var m *string
	if meter != "" {
		m = &meter
	}
	rows, err := db.Query(ctx, qGaugeMetersOf, customer, m, end)
	if err != nil {
		return nil, fmt.Errorf("ledger: gauge meters: %w", err)
	}
	out, err := pgx.CollectRows(rows, pgx.RowTo[string])
	if err != nil {
		return nil, fmt.Errorf("ledger: gauge meters: %w", err)
	}
	return out, nil
}

// ReadGauge answers a gauge's aggregates over period p from its buckets:
// at most one row per day of the period, whatever the number of readings.
func ReadGauge(ctx context.Context, db DBTX, customer, meter string, p periods.Period, now time.Time) (GaugeUsage, error) {
	u := GaugeUsage{Meter: meter}
	asOf := p.End.UTC()
	if now.Before(asOf) {
		asOf = now.UTC().Truncate(time.Microsecond)
	}
	u.AsOf = asOf
	rows, err := db.Query(ctx, qGaugeUsageDays, customer, meter, p.Start, p.End)
	if err != nil {
		return u, fmt.Errorf("ledger: gauge usage: %w", err)
	}
	var days []dayRow
	var d dayRow
	_, err = pgx.ForEachRow(rows, []any{&d.start, &d.end, numericDst(&d.levelIn), nullNumericDst(&d.prefix), &d.lastAt,
		numericDst(&d.unitSec), numericDst(&d.levelOut)}, func() error {
		row := d
		row.start, row.end = d.start.UTC(), d.end.UTC()
		if row.lastAt.Valid {
			row.lastAt.Time = row.lastAt.Time.UTC()
		}
		days = append(days, row)
		return nil
	})
	if err != nil {
		return u, fmt.Errorf("ledger: gauge usage: %w", err)
	}
	if err := db.QueryRow(ctx, qGaugePriorAdjustments, customer, meter, p.Start).Scan(numericDst(&u.PriorPeriodUnitSeconds)); err != nil {
		return u, fmt.Errorf("ledger: gauge usage: %w", err)
	}
	var pts []point
	for _, r := range days {
		if r.start.Before(asOf) && asOf.Before(r.end) && r.lastAt.Valid && !r.lastAt.Time.Before(asOf) {
			// A reading stamped ahead of now (within the allowed skew):
			// the bucket's own points tell what held until now.
			prow, err := db.Query(ctx, qGaugePointsBetween, customer, meter, r.start, r.end)
			if err != nil {
				return u, fmt.Errorf("ledger: gauge usage: %w", err)
			}
			var pt point
			if _, err := pgx.ForEachRow(prow, []any{&pt.at, numericDst(&pt.delta)}, func() error {
				pts = append(pts, point{pt.at.UTC(), pt.delta})
				return nil
			}); err != nil {
				return u, fmt.Errorf("ledger: gauge usage: %w", err)
			}
		}
	}
	gaugeAggregates(&u, days, pts, p.Start.UTC(), asOf)
	return u, nil
}

// gaugeAggregates folds a period's buckets (the first may be the last one
// before the period: its level is carried in) through asOf. pts are the
// change points of the bucket holding asOf when some lie after it.
func gaugeAggregates(u *GaugeUsage, days []dayRow, pts []point, start, asOf time.Time) {
	level := decimal.Zero
	if len(days) > 0 && days[0].start.Before(start) {
		level, days = days[0].levelOut, days[1:]
	}
	var mx decimal.NullDecimal
	see := func(v decimal.Decimal) {
		if !mx.Valid || v.GreaterThan(mx.Decimal) {
			mx = decimal.NewNullDecimal(v)
		}
	}
	us, pos := decimal.Zero, start
	for i := range days {
		r := &days[i]
		if !r.start.Before(asOf) {
			break
		}
		if r.start.After(pos) {
			us = us.Add(level.Mul(Seconds(r.start.Sub(pos))))
			see(level)
		}
		switch {
		case !r.end.After(asOf):
			us = us.Add(r.unitSec)
			see(r.Max())
			level, pos = r.levelOut, r.end
		case !r.lastAt.Valid || r.lastAt.Time.Before(asOf):
			us = us.Add(r.unitSec.Sub(r.levelOut.Mul(Seconds(r.end.Sub(asOf)))))
			see(r.Max())
			level, pos = r.levelOut, asOf
		default:
			cut := dayRow{start: r.start, end: asOf, levelIn: r.levelIn}
			var before []point
			for _, p := range pts {
				if p.at.Before(asOf) {
					before = append(before, p)
				}
			}
			cut.recompute(before)
			us = us.Add(cut.unitSec)
			see(cut.Max())
			level, pos = cut.levelOut, asOf
		}
	}
	if pos.Before(asOf) {
		us = us.Add(level.Mul(Seconds(asOf.Sub(pos))))
		see(level)
	}
	u.Max, u.Latest, u.UnitSeconds = mx.Decimal, level, us
	u.UnitHours = us.DivRound(decimal.NewFromInt(3600), 9)
	if secs := Seconds(asOf.Sub(start)); secs.Sign() > 0 {
		u.Average = us.DivRound(secs, 9)
	}
}

// ReadUniques answers the distinct members of a customer's unique meters
// (meter "": every one) over period p, and per bucket day.
func ReadUniques(ctx context.Context, db DBTX, customer, meter string, p periods.Period) ([]UniqueUsage, error) {
	var m *string
	if meter != "" {
		m = &meter
	}
	rows, err := db.Query(ctx, qUniqueUsage, customer, p.Start, m)
	if err != nil {
		return nil, fmt.Errorf("ledger: unique usage: %w", err)
	}
	var out []UniqueUsage
	var name string
	var perDay bool
	var day time.Time
	var n int64
	_, err = pgx.ForEachRow(rows, []any{&name, &perDay, &day, &n}, func() error {
		if len(out) == 0 || out[len(out)-1].Meter != name {
			out = append(out, UniqueUsage{Meter: name, Days: []UniqueDay{}})
		}
		u := &out[len(out)-1]
		if perDay {
			u.Days = append(u.Days, UniqueDay{Start: day.UTC(), Count: n})
		} else {
			u.Count = n
		}
		return nil
	})
	if err != nil {
		return nil, fmt.Errorf("ledger: unique usage: %w", err)
	}
	return out, nil
}
