package ledger

import (
	"context"
	"fmt"
	"sort"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/shopspring/decimal"

	"github.com/tally-ledger/tally/periods"
)

// The recomputations reconciliation compares with the buckets and counts
// (docs/design.md §16): from the readings alone, by the rules, with none
// of the incremental machinery.

// GaugeReading is a recorded gauge reading.
type GaugeReading struct {
	Producer   string
	Epoch      int64
	Seq        int64
	Level      decimal.Decimal
	OccurredAt time.Time
	Final      bool
}

// GaugeReadings returns every reading of a customer's gauge.
func GaugeReadings(ctx context.Context, db DBTX, customer, meter string) ([]GaugeReading, error) {
	return gaugeReadings(ctx, db, qGaugeReadingsOf, customer, meter)
}

func gaugeReadings(ctx context.Context, db DBTX, query string, args ...any) ([]GaugeReading, error) {
	rows, err := db.Query(ctx, query, args...)
	if err != nil {
		return nil, fmt.Errorf("ledger: gauge readings: %w", err)
	}
	var out []GaugeReading
	var r GaugeReading
	_, err = pgx.ForEachRow(rows, []any{&r.Producer, &r.Epoch, &r.Seq, numericDst(&r.Level), &r.OccurredAt, &r.Final}, func() error {
		r.OccurredAt = r.OccurredAt.UTC()
		out = append(out, r)
		return nil
	})
	if err != nil {
		return nil, fmt.Errorf("ledger: gauge readings: %w", err)
	}
	return out, nil
}

// GaugeReadingsFor returns the readings of a customer's gauge that its
// aggregates over [start, asOf) depend on: of each stream, its last
// reading at or before start (the level it carries in) and those after it
// before asOf. RecomputeGauge gives the same answer from them as from
// every reading: a reading before start that a later one of its stream
// supersedes adds nothing at or after start, and a newer epoch's first
// reading ends the older epoch's level before start whether it or the
// newer epoch's last reading before start is the first one seen. What it
// reads is each stream's readings since start (twice: back from the
// newest to the last before start, and on from there), however long the
// meter's history before it.
func GaugeReadingsFor(ctx context.Context, db DBTX, customer, meter string, start, asOf time.Time) ([]GaugeReading, error) {
	return gaugeReadings(ctx, db, qGaugeReadingsFor, customer, meter, start, asOf)
}

// RecomputeGauge computes a gauge's aggregates over [start, asOf) from its
// readings: each reading holds its level (0 for a final) from its
// occurred_at until the stream's next reading or the first reading of a
// newer epoch of its producer; the customer's level is the sum.
func RecomputeGauge(rs []GaugeReading, start, asOf time.Time) GaugeUsage {
	type sk struct {
		p string
		e int64
	}
	streams := map[sk][]GaugeReading{}
	first := map[sk]time.Time{}
	for _, r := range rs {
		k := sk{r.Producer, r.Epoch}
		streams[k] = append(streams[k], r)
		if f, ok := first[k]; !ok || r.OccurredAt.Before(f) {
			first[k] = r.OccurredAt
		}
	}
	type ev struct {
		at int64
		d  decimal.Decimal
	}
	var evs []ev
	for k, srs := range streams {
		var end *time.Time
		for o, f := range first {
			if o.p == k.p && o.e > k.e && (end == nil || f.Before(*end)) {
				t := f
				end = &t
			}
		}
		sort.Slice(srs, func(i, j int) bool { return srs[i].Seq < srs[j].Seq })
		for i, r := range srs {
			to := end
			if i+1 < len(srs) && (to == nil || srs[i+1].OccurredAt.Before(*to)) {
				t := srs[i+1].OccurredAt
				to = &t
			}
			if to != nil && !r.OccurredAt.Before(*to) || r.Final || r.Level.IsZero() {
				continue
			}
			evs = append(evs, ev{r.OccurredAt.UnixMicro(), r.Level})
			if to != nil {
				evs = append(evs, ev{to.UnixMicro(), r.Level.Neg()})
			}
		}
	}
	sort.Slice(evs, func(i, j int) bool { return evs[i].at < evs[j].at })
	sw := newGaugeSweep(start, asOf)
	for _, e := range evs {
		sw.add(e.at, e.d)
	}
	return sw.usage()
}

// RecomputeGaugeFor is RecomputeGauge of the readings GaugeReadingsFor
// returns, computed as they are read: Postgres turns each reading into
// the changes of level it makes (by the same rules) and sends them in
// time order, so that nothing grows with the readings of the period (a
// gauge read every 10 seconds has 260,000 a month per stream).
func RecomputeGaugeFor(ctx context.Context, db DBTX, customer, meter string, start, asOf time.Time) (GaugeUsage, error) {
	rows, err := db.Query(ctx, qGaugeLevelChangesFor, customer, meter, start, asOf)
	if err != nil {
		return GaugeUsage{}, fmt.Errorf("ledger: gauge readings: %w", err)
	}
	sw := newGaugeSweep(start, asOf)
	var at time.Time
	var d decimal.Decimal
	_, err = pgx.ForEachRow(rows, []any{&at, numericDst(&d)}, func() error {
		sw.add(at.UnixMicro(), d)
		return nil
	})
	if err != nil {
		return GaugeUsage{}, fmt.Errorf("ledger: gauge readings: %w", err)
	}
	return sw.usage(), nil
}

// gaugeSweep sums a gauge's changes of level, given in time order (in
// microseconds), into its aggregates over [s, e).
type gaugeSweep struct {
	s, e    int64
	asOf    time.Time
	u       GaugeUsage
	level   decimal.Decimal
	pos     int64
	begun   bool // a change after s was seen: u.Max and pos are set
	pending bool // the changes at pos may go on: the level there is not final yet
}

func newGaugeSweep(start, asOf time.Time) *gaugeSweep {
	return &gaugeSweep{s: start.UnixMicro(), e: asOf.UnixMicro(), asOf: asOf, level: decimal.Zero}
}

func (g *gaugeSweep) begin() {
	if !g.begun {
		g.begun = true
		g.u.Max, g.u.UnitSeconds = g.level, decimal.Zero
		g.pos = g.s
	}
}

// settle ends the instant pos: the level at an instant is after all its
// changes.
func (g *gaugeSweep) settle() {
	if g.pending {
		g.pending = false
		if g.level.GreaterThan(g.u.Max) {
			g.u.Max = g.level
		}
	}
}

func (g *gaugeSweep) add(at int64, d decimal.Decimal) {
	if at <= g.s && !g.begun {
		g.level = g.level.Add(d)
		return
	}
	g.begin()
	if at != g.pos {
		g.settle()
	}
	if at >= g.e {
		return
	}
	g.u.UnitSeconds = g.u.UnitSeconds.Add(g.level.Mul(decimal.New(at-g.pos, -6)))
	g.level, g.pos, g.pending = g.level.Add(d), at, true
}

func (g *gaugeSweep) usage() GaugeUsage {
	g.begin()
	g.settle()
	u := g.u
	u.AsOf = g.asOf
	if g.e > g.s {
		u.UnitSeconds = u.UnitSeconds.Add(g.level.Mul(decimal.New(g.e-g.pos, -6)))
	}
	u.Latest = g.level
	u.UnitHours = u.UnitSeconds.DivRound(decimal.NewFromInt(3600), 9)
	if g.e > g.s {
		u.Average = u.UnitSeconds.DivRound(decimal.New(g.e-g.s, -6), 9)
	}
	return u
}

// GaugeMetersOf lists the gauges a customer has readings of.
func GaugeMetersOf(ctx context.Context, db DBTX, customer string) ([]string, error) {
	rows, err := db.Query(ctx, qGaugeMetersWithReadings, customer)
	if err != nil {
		return nil, fmt.Errorf("ledger: gauge meters: %w", err)
	}
	out, err := pgx.CollectRows(rows, pgx.RowTo[string])
	if err != nil {
		return nil, fmt.Errorf("ledger: gauge meters: %w", err)
	}
	return out, nil
}

// PriorPeriodMoves sums the level-seconds of a closed period billed in
// later periods, per gauge.
func PriorPeriodMoves(ctx context.Context, db DBTX, customer string, prior time.Time) (map[string]decimal.Decimal, error) {
	rows, err := db.Query(ctx, qGaugeMovesOut, customer, prior)
	if err != nil {
		return nil, fmt.Errorf("ledger: gauge adjustments: %w", err)
	}
	out := map[string]decimal.Decimal{}
	var m string
	var d decimal.Decimal
	_, err = pgx.ForEachRow(rows, []any{&m, numericDst(&d)}, func() error {
		out[m] = d
		return nil
	})
	if err != nil {
		return nil, fmt.Errorf("ledger: gauge adjustments: %w", err)
	}
	return out, nil
}

// RecountUniques counts, per unique meter, the distinct members a
// customer's readings saw in period p.
func RecountUniques(ctx context.Context, db DBTX, customer string, p periods.Period) (map[string]int64, error) {
	rows, err := db.Query(ctx, qUniqueRecount, customer, p.Start, p.End)
	if err != nil {
		return nil, fmt.Errorf("ledger: unique recount: %w", err)
	}
	out := map[string]int64{}
	var m string
	var n int64
	_, err = pgx.ForEachRow(rows, []any{&m, &n}, func() error {
		out[m] = n
		return nil
	})
	if err != nil {
		return nil, fmt.Errorf("ledger: unique recount: %w", err)
	}
	return out, nil
}

// KindCustomers lists the customers with a stream of a gauge or unique
// meter: the only ones reconciliation's gauge and unique check reads.
func KindCustomers(ctx context.Context, db DBTX) (map[string]bool, error) {
	rows, err := db.Query(ctx, qKindCustomers)
	if err != nil {
		return nil, fmt.Errorf("ledger: customers of gauges and unique meters: %w", err)
	}
	out := map[string]bool{}
	var c string
	_, err = pgx.ForEachRow(rows, []any{&c}, func() error {
		out[c] = true
		return nil
	})
	if err != nil {
		return nil, fmt.Errorf("ledger: customers of gauges and unique meters: %w", err)
	}
	return out, nil
}
