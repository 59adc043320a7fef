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
// read's now with a change point at or after it (isAhead) gets ahead from
// Finish: it is cut at any later now from its row and that, never from
// all its points.
type usageDay struct {
	dayRow
	isAhead bool
	ahead   *aheadOfRead
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
	// kind is meter's declared kind (meter "": unread).
	kind MeterKind
}

// QueueKinds queues on b the reads of a customer's declared gauges and
// unique meters over period p as of now: at most a row per gauge and day
// of the period, whatever the number of readings. Meter "" is every one
// with data (a level, or members in the period); a named meter declared a
// gauge or unique meter is answered without data too, at zero, so that its
// answer has its kind's shape from its declaration on. After b is sent
// and closed, Finish answers.
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
	var isAhead bool
	days := func(rows pgx.Rows) error {
		_, err := pgx.ForEachRow(rows, []any{&name, &d.start, &d.end, numericDst(&d.levelIn), nullNumericDst(&d.prefix), &d.lastAt,
			numericDst(&d.unitSec), numericDst(&d.levelOut), &isAhead}, func() error {
			if len(k.gauges) == 0 || k.gauges[len(k.gauges)-1].meter != name {
				k.gauges = append(k.gauges, gaugeRows{meter: name})
			}
			row := usageDay{dayRow: d, isAhead: isAhead}
			row.start, row.end = d.start.UTC(), d.end.UTC()
			if row.lastAt.Valid {
				row.lastAt.Time = row.lastAt.Time.UTC()
			}
			g := &k.gauges[len(k.gauges)-1]
			g.days = append(g.days, row)
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
	qs := []kindsQuery{
		{qKindGaugeDays, []any{r.customer, m, p.Start, p.End, r.k.read}, days},
		{qKindGaugeAdjustments, []any{r.customer, p.Start, m}, adjustments},
		{qUniqueUsage, []any{r.customer, p.Start, m}, uniques},
	}
	if r.meter != "" {
		r.kind = Counter // undeclared
		declared := func(rows pgx.Rows) error {
			if _, err := pgx.ForEachRow(rows, []any{&name, &r.kind}, func() error { return nil }); err != nil {
				return fmt.Errorf("ledger: kinds usage: %w", err)
			}
			return nil
		}
		qs = append(qs, kindsQuery{qSelectKinds, []any{[]string{r.meter}}, declared})
	}
	return qs
}

// declaredWithoutData adds the named meter, when it is a gauge or unique
// meter the read found no data of, at zero: a gauge without a level (zero
// throughout, as before its first reading), a unique meter without members.
func (r *KindsRead) declaredWithoutData(k *KindsUsage) {
	switch {
	case r.kind == Gauge && len(k.gauges) == 0:
		k.gauges = []gaugeRows{{meter: r.meter, prior: decimal.Zero}}
	case r.kind == Unique && len(k.Uniques) == 0:
		k.Uniques = []UniqueUsage{{Meter: r.meter, Days: []UniqueDay{}}}
	}
}

// Finish answers the read once its batch is closed. A bucket ending after
// the read's now with change points at or after it (a reading stamped
// ahead of now: rare) gets what cuts it at any later now: those points,
// read here (at most the skew window's), and the highest level before
// now, which its row tells unless those points rose above every level
// before now while the level just before now is lower; then, rarer
// still, the bucket's change points before now are read too.
func (r *KindsRead) Finish(ctx context.Context, db DBTX) (KindsUsage, error) {
	k := r.k
	r.declaredWithoutData(&k)
	for i := range k.gauges {
		g := &k.gauges[i]
		g.prior = r.prior[g.meter]
		for j := range g.days {
			d := &g.days[j]
			if !d.isAhead {
				continue
			}
			from := k.read
			if d.start.After(from) {
				from = d.start
			}
			pts, err := r.points(ctx, db, g.meter, from, d.end)
			if err != nil {
				return k, err
			}
			a, err := d.aheadOf(from, pts)
			if err != nil {
				return k, err
			}
			if a == nil {
				if a, err = r.readAhead(ctx, db, g.meter, d, from, pts); err != nil {
					return k, err
				}
			}
			d.ahead = a
		}
	}
	return k, nil
}

// points reads a gauge's change points in [from, to).
func (r *KindsRead) points(ctx context.Context, db DBTX, meter string, from, to time.Time) ([]point, error) {
	rows, err := db.Query(ctx, qGaugePointsBetween, r.customer, meter, from, to)
	if err != nil {
		return nil, fmt.Errorf("ledger: gauge usage: %w", err)
	}
	var out []point
	var p point
	if _, err := pgx.ForEachRow(rows, []any{&p.at, numericDst(&p.delta)}, func() error {
		out = append(out, point{p.at.UTC(), p.delta})
		return nil
	}); err != nil {
		return nil, fmt.Errorf("ledger: gauge usage: %w", err)
	}
	return out, nil
}

// aheadOf is the bucket's aheadOfRead from its row and its change points
// from from (the later of the read's now and its start) on, or nil when
// they do not tell its highest level before from.
func (d *usageDay) aheadOf(from time.Time, pts []point) (*aheadOfRead, error) {
	a := &aheadOfRead{from: from, pts: pts}
	if !d.lastAt.Valid || d.lastAt.Time.Before(a.from) {
		return nil, fmt.Errorf("ledger: gauge usage: bucket %s: change points at or after %s beyond its last one",
			d.start.Format(time.RFC3339), a.from.Format(time.RFC3339Nano))
	}
	if !a.from.After(d.start) {
		return a, nil // [start, from) is empty
	}
	// The level just before from, and the highest over [from, lastAt).
	level := d.levelOut
	for _, p := range pts {
		level = level.Sub(p.delta)
	}
	before := level
	var after decimal.NullDecimal
	pos := a.from
	for _, p := range pts {
		if p.at.After(pos) && (!after.Valid || level.GreaterThan(after.Decimal)) {
			after = decimal.NewNullDecimal(level)
		}
		level, pos = level.Add(p.delta), p.at
	}
	// prefix is the highest level over [start, lastAt), which holds
	// [start, from) (lastAt >= from > start), so it is that span's when
	// nothing after from reaches it, or when the level just before from
	// (that span's last) is it.
	switch {
	case !d.prefix.Valid:
		return nil, nil
	case !after.Valid, d.prefix.Decimal.GreaterThan(after.Decimal), d.prefix.Decimal.Equal(before):
		a.maxBefore = d.prefix
		return a, nil
	}
	return nil, nil
}

// readAhead is the bucket's aheadOfRead from its change points before
// from, read here (the bucket starts before from: aheadOf answers the
// others).
func (r *KindsRead) readAhead(ctx context.Context, db DBTX, meter string, d *usageDay, from time.Time, pts []point) (*aheadOfRead, error) {
	a := &aheadOfRead{from: from, pts: pts}
	before, err := r.points(ctx, db, meter, d.start, from)
	if err != nil {
		return nil, err
	}
	level, pos := d.levelIn, d.start
	raise := func() {
		if !a.maxBefore.Valid || level.GreaterThan(a.maxBefore.Decimal) {
			a.maxBefore = decimal.NewNullDecimal(level)
		}
	}
	for _, p := range before {
		if p.at.After(pos) {
			raise()
		}
		level, pos = level.Add(p.delta), p.at
	}
	if from.After(pos) {
		raise()
	}
	return a, nil
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
		return r.Finish(ctx, db)
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
	return r.Finish(ctx, db)
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
	if !mx.Valid { // asOf is the period's start: the level carried in is its max
		mx = decimal.NewNullDecimal(level)
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
