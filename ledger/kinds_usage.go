package ledger

import (
	"context"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgtype"
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
	// Levels is the level over the period through AsOf, in time order:
	// one span per bucket day with readings, and one per stretch without
	// readings between them (its level constant), each with its highest
	// and its last level. Their maxima's max is Max. Empty: the gauge had
	// no level yet (zero throughout).
	Levels []GaugeLevel `json:"levels"`
}

// GaugeLevel is a gauge's level over [Start, End): its highest and its
// last.
type GaugeLevel struct {
	Start  time.Time       `json:"start"`
	End    time.Time       `json:"end"`
	Max    decimal.Decimal `json:"max"`
	Latest decimal.Decimal `json:"latest"`
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

// KindsUsage is what a customer's gauges and unique meters hold for one
// period, read in one go; Gauges answers the gauges' aggregates at the
// read's now or any later one (an open period's level-seconds grow with
// time), so an answer may be kept until the ledger changes.
type KindsUsage struct {
	start, end time.Time
	read       time.Time // the read's now
	gauges     []gaugeRows
	Uniques    []UniqueUsage
}

type gaugeRows struct {
	meter string
	days  []usageDay
	prior decimal.Decimal
}

// usageDay is a bucket as a usage read has it. A bucket ending after the
// read's now with a change point at or after it has ahead set: it is cut
// at a later now from its row and these, never from all its points.
type usageDay struct {
	dayRow
	ahead *aheadOfRead
}

// aheadOfRead is what cuts a bucket at any instant from the read's now on.
type aheadOfRead struct {
	from      time.Time           // the later of the read's now and the bucket's start
	maxBefore decimal.NullDecimal // the highest level over [start, from); invalid when that is empty
	pts       []point             // the bucket's change points from from on, in time order
}

// KindsRead is a customer's gauge and unique usage being read: QueueKinds
// puts its statements on a caller's batch, so they share the caller's
// round trip; Finish completes it once the batch is closed.
type KindsRead struct {
	k               KindsUsage
	customer, meter string
	prior           map[string]decimal.Decimal
}

// QueueKinds queues on b the reads of a customer's declared gauges (meter
// "": every one; a meter without levels is left out) and unique meters
// over period p as of now: at most a row per gauge and day of the period,
// whatever the number of readings. After b is sent and closed, Finish
// answers.
func QueueKinds(b *pgx.Batch, customer, meter string, p periods.Period, now time.Time) *KindsRead {
	r := newKindsRead(customer, meter, p, now)
	for _, q := range r.reads(p) {
		b.Queue(q.sql, q.args...).Query(q.scan)
	}
	return r
}

func newKindsRead(customer, meter string, p periods.Period, now time.Time) *KindsRead {
	return &KindsRead{k: KindsUsage{start: p.Start.UTC(), end: p.End.UTC(), read: now.UTC().Truncate(time.Microsecond)},
		customer: customer, meter: meter, prior: map[string]decimal.Decimal{}}
}

// kindsQuery is one statement of a KindsRead and what reads its rows.
type kindsQuery struct {
	sql  string
	args []any
	scan func(pgx.Rows) error
}

func (r *KindsRead) reads(p periods.Period) []kindsQuery {
	var m *string
	if r.meter != "" {
		m = &r.meter
	}
	k := &r.k
	var name string
	var d dayRow
	var maxBefore pgtype.Text
	var ats []time.Time
	var deltas []string
	days := func(rows pgx.Rows) error {
		_, err := pgx.ForEachRow(rows, []any{&name, &d.start, &d.end, numericDst(&d.levelIn), nullNumericDst(&d.prefix), &d.lastAt,
			numericDst(&d.unitSec), numericDst(&d.levelOut), &maxBefore, &ats, &deltas}, func() error {
			if len(k.gauges) == 0 || k.gauges[len(k.gauges)-1].meter != name {
				k.gauges = append(k.gauges, gaugeRows{meter: name})
			}
			row := usageDay{dayRow: d}
			row.start, row.end = d.start.UTC(), d.end.UTC()
			if row.lastAt.Valid {
				row.lastAt.Time = row.lastAt.Time.UTC()
			}
			if ats != nil {
				a, err := newAhead(row.start, k.read, maxBefore, ats, deltas)
				if err != nil {
					return err
				}
				row.ahead = a
			}
			g := &k.gauges[len(k.gauges)-1]
			g.days = append(g.days, row)
			maxBefore, ats, deltas = pgtype.Text{}, nil, nil
			return nil
		})
		if err != nil {
			return fmt.Errorf("ledger: gauge usage: %w", err)
		}
		return nil
	}
	var sum decimal.Decimal
	adjustments := func(rows pgx.Rows) error {
		if _, err := pgx.ForEachRow(rows, []any{&name, numericDst(&sum)}, func() error {
			r.prior[name] = sum
			return nil
		}); err != nil {
			return fmt.Errorf("ledger: gauge usage: %w", err)
		}
		return nil
	}
	uniques := func(rows pgx.Rows) error {
		var err error
		k.Uniques, err = scanUniques(rows)
		return err
	}
	return []kindsQuery{
		{qKindGaugeDays, []any{r.customer, m, p.Start, p.End, r.k.read}, days},
		{qKindGaugeAdjustments, []any{r.customer, p.Start, m}, adjustments},
		{qUniqueUsage, []any{r.customer, p.Start, m}, uniques},
	}
}

// newAhead is a bucket's aheadOfRead from qKindGaugeDays's columns.
func newAhead(start, read time.Time, maxBefore pgtype.Text, ats []time.Time, deltas []string) (*aheadOfRead, error) {
	if len(ats) != len(deltas) {
		return nil, fmt.Errorf("bucket %s: %d change points, %d deltas", start.Format(time.RFC3339), len(ats), len(deltas))
	}
	a := &aheadOfRead{from: read, pts: make([]point, len(ats))}
	if start.After(read) {
		a.from = start
	}
	if maxBefore.Valid {
		v, err := decimal.NewFromString(maxBefore.String)
		if err != nil {
			return nil, err
		}
		a.maxBefore = decimal.NewNullDecimal(v)
	}
	for i := range ats {
		v, err := decimal.NewFromString(deltas[i])
		if err != nil {
			return nil, err
		}
		a.pts[i] = point{ats[i].UTC(), v}
	}
	return a, nil
}

// Finish answers the read once its batch is closed.
func (r *KindsRead) Finish() KindsUsage {
	k := r.k
	for i := range k.gauges {
		k.gauges[i].prior = r.prior[k.gauges[i].meter]
	}
	return k
}

// ReadKinds is QueueKinds and Finish in one round trip of its own (one per
// statement where db cannot send a batch).
func ReadKinds(ctx context.Context, db DBTX, customer, meter string, p periods.Period, now time.Time) (KindsUsage, error) {
	if bdb, ok := db.(interface {
		SendBatch(context.Context, *pgx.Batch) pgx.BatchResults
	}); ok {
		b := &pgx.Batch{}
		r := QueueKinds(b, customer, meter, p, now)
		if err := bdb.SendBatch(ctx, b).Close(); err != nil {
			return KindsUsage{}, fmt.Errorf("ledger: kinds usage: %w", err)
		}
		return r.Finish(), nil
	}
	r := newKindsRead(customer, meter, p, now)
	for _, q := range r.reads(p) {
		rows, err := db.Query(ctx, q.sql, q.args...)
		if err != nil {
			return KindsUsage{}, fmt.Errorf("ledger: kinds usage: %w", err)
		}
		if err := q.scan(rows); err != nil {
			return KindsUsage{}, err
		}
	}
	return r.Finish(), nil
}

// Gauges answers every gauge's aggregates through now (the period's end
// once it is over). A now before the read's is taken as the read's.
func (k KindsUsage) Gauges(now time.Time) []GaugeUsage {
	asOf := k.end
	if now.Before(k.read) {
		now = k.read
	}
	if now.Before(asOf) {
		asOf = now.UTC().Truncate(time.Microsecond)
	}
	out := make([]GaugeUsage, 0, len(k.gauges))
	for _, g := range k.gauges {
		u := GaugeUsage{Meter: g.meter, AsOf: asOf, PriorPeriodUnitSeconds: g.prior}
		gaugeAggregates(&u, g.days, k.start, asOf)
		out = append(out, u)
	}
	return out
}

// ReadGauge answers one gauge's aggregates over period p through now.
func ReadGauge(ctx context.Context, db DBTX, customer, meter string, p periods.Period, now time.Time) (GaugeUsage, error) {
	k, err := ReadKinds(ctx, db, customer, meter, p, now)
	if err != nil {
		return GaugeUsage{}, err
	}
	for _, g := range k.Gauges(now) {
		if g.Meter == meter {
			return g, nil
		}
	}
	asOf := p.End.UTC()
	if now.Before(asOf) {
		asOf = now.UTC().Truncate(time.Microsecond)
	}
	return GaugeUsage{Meter: meter, AsOf: asOf, Levels: []GaugeLevel{}}, nil
}

// gaugeAggregates folds a period's buckets (the first may be the last one
// before the period: its level is carried in) through asOf, at or after
// the read's now.
func gaugeAggregates(u *GaugeUsage, days []usageDay, start, asOf time.Time) {
	level := decimal.Zero
	if len(days) > 0 && days[0].start.Before(start) {
		level, days = days[0].levelOut, days[1:]
	}
	var mx decimal.NullDecimal
	u.Levels = []GaugeLevel{}
	see := func(from, to time.Time, v, last decimal.Decimal) {
		if !mx.Valid || v.GreaterThan(mx.Decimal) {
			mx = decimal.NewNullDecimal(v)
		}
		u.Levels = append(u.Levels, GaugeLevel{Start: from, End: to, Max: v, Latest: last})
	}
	us, pos := decimal.Zero, start
	for i := range days {
		r := &days[i]
		if !r.start.Before(asOf) {
			break
		}
		if r.start.After(pos) {
			us = us.Add(level.Mul(Seconds(r.start.Sub(pos))))
			see(pos, r.start, level, level)
		}
		switch {
		case !r.end.After(asOf):
			us = us.Add(r.unitSec)
			see(r.start, r.end, r.Max(), r.levelOut)
			level, pos = r.levelOut, r.end
		case !r.lastAt.Valid || r.lastAt.Time.Before(asOf):
			us = us.Add(r.unitSec.Sub(r.levelOut.Mul(Seconds(r.end.Sub(asOf)))))
			see(r.start, asOf, r.Max(), r.levelOut)
			level, pos = r.levelOut, asOf
		default:
			cutMax, cutLevel, cutSec := r.cut(asOf)
			us = us.Add(cutSec)
			see(r.start, asOf, cutMax, cutLevel)
			level, pos = cutLevel, asOf
		}
	}
	if pos.Before(asOf) {
		us = us.Add(level.Mul(Seconds(asOf.Sub(pos))))
		see(pos, asOf, level, level)
	}
	u.Max, u.Latest, u.UnitSeconds = mx.Decimal, level, us
	u.UnitHours = us.DivRound(decimal.NewFromInt(3600), 9)
	if secs := Seconds(asOf.Sub(start)); secs.Sign() > 0 {
		u.Average = us.DivRound(secs, 9)
	}
}

// cut answers a bucket with a change point at or after asOf (start <
// asOf <= its last change point, asOf at or after the read's now) over
// [start, asOf): its highest level, the level just before asOf, and its
// level-seconds. Only the change points from the read's now on are used:
// the level just before the first of them is the level carried out less
// their deltas, the level-seconds are the bucket's less those after asOf.
func (r *usageDay) cut(asOf time.Time) (mx, latest, sec decimal.Decimal) {
	a := r.ahead
	level := r.levelOut
	for _, p := range a.pts {
		level = level.Sub(p.delta)
	}
	high, pos := a.maxBefore, a.from
	raise := func(v decimal.Decimal) {
		if !high.Valid || v.GreaterThan(high.Decimal) {
			high = decimal.NewNullDecimal(v)
		}
	}
	j := 0
	for ; j < len(a.pts) && a.pts[j].at.Before(asOf); j++ {
		if a.pts[j].at.After(pos) {
			raise(level)
		}
		level, pos = level.Add(a.pts[j].delta), a.pts[j].at
	}
	if asOf.After(pos) {
		raise(level)
	}
	latest = level
	after, at := decimal.Zero, asOf
	for ; j < len(a.pts); j++ {
		after = after.Add(level.Mul(Seconds(a.pts[j].at.Sub(at))))
		level, at = level.Add(a.pts[j].delta), a.pts[j].at
	}
	after = after.Add(level.Mul(Seconds(r.end.Sub(at))))
	return high.Decimal, latest, r.unitSec.Sub(after)
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
	return scanUniques(rows)
}

// scanUniques reads qUniqueUsage's rows.
func scanUniques(rows pgx.Rows) ([]UniqueUsage, error) {
	var out []UniqueUsage
	var name string
	var perDay bool
	var day time.Time
	var n int64
	_, err := pgx.ForEachRow(rows, []any{&name, &perDay, &day, &n}, func() error {
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

// StatementKinds is the periods.KindLinesFunc of the ledger's gauges and
// unique meters: a statement's gauge and unique lines.
func StatementKinds(ctx context.Context, db periods.DBTX, customer string, p periods.Period, now time.Time) (periods.KindLines, error) {
	k, err := ReadKinds(ctx, db, customer, "", p, now)
	if err != nil {
		return periods.KindLines{}, err
	}
	var kl periods.KindLines
	for _, g := range k.Gauges(now) {
		kl.Gauges = append(kl.Gauges, periods.GaugeLine{Meter: g.Meter, Max: g.Max, Latest: g.Latest, UnitSeconds: g.UnitSeconds,
			UnitHours: g.UnitHours, Average: g.Average, PriorPeriodUnitSeconds: g.PriorPeriodUnitSeconds})
	}
	for _, u := range k.Uniques {
		kl.Uniques = append(kl.Uniques, periods.UniqueLine{Meter: u.Meter, Count: u.Count})
	}
	return kl, nil
}
