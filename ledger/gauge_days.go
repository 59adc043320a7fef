package ledger

import (
	"context"
	"fmt"
	"sort"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgtype"
	"github.com/shopspring/decimal"

	"github.com/tally-ledger/tally/internal/pgcopy"
	"github.com/tally-ledger/tally/internal/pguuid"
)

// dayRow is one gauge bucket (a row of gauge_days): enough to answer its
// max and level-seconds, and to take a change point at or after its last
// one, or a constant shift, without reading its change points.
type dayRow struct {
	start, end, period time.Time
	levelIn            decimal.Decimal     // the level just before start
	prefix             decimal.NullDecimal // max over [start, lastAt); invalid when that is empty
	lastAt             pgtype.Timestamptz  // the last change point in the bucket
	unitSec            decimal.Decimal     // ∫ level over [start, end)
	levelOut           decimal.Decimal     // the level from lastAt (or start) to end
	exists             bool
}

// Seconds is d in seconds, exact to the microsecond.
func Seconds(d time.Duration) decimal.Decimal { return decimal.New(d.Microseconds(), -6) }

// Max is the highest level in the bucket.
func (d *dayRow) Max() decimal.Decimal {
	if d.prefix.Valid && d.prefix.Decimal.GreaterThan(d.levelOut) {
		return d.prefix.Decimal
	}
	return d.levelOut
}

// shift adds c to the level over the whole bucket.
func (d *dayRow) shift(c decimal.Decimal) {
	if c.IsZero() {
		return
	}
	d.levelIn, d.levelOut = d.levelIn.Add(c), d.levelOut.Add(c)
	if d.prefix.Valid {
		d.prefix.Decimal = d.prefix.Decimal.Add(c)
	}
	d.unitSec = d.unitSec.Add(c.Mul(Seconds(d.end.Sub(d.start))))
}

// after reports whether a change at t may be appended: no change point of
// the bucket lies after it.
func (d *dayRow) after(t time.Time) bool { return !d.lastAt.Valid || !t.Before(d.lastAt.Time) }

// appendPoint adds c to the level from t (at or after the last change
// point) to the bucket's end.
func (d *dayRow) appendPoint(t time.Time, c decimal.Decimal) {
	last := d.start
	if d.lastAt.Valid {
		last = d.lastAt.Time
	}
	if t.After(last) {
		d.prefix = decimal.NewNullDecimal(decimal.Max(d.levelOut, d.prefixOr(d.levelOut)))
	}
	d.unitSec = d.unitSec.Add(c.Mul(Seconds(d.end.Sub(t))))
	d.levelOut = d.levelOut.Add(c)
	d.lastAt = pgtype.Timestamptz{Time: t, Valid: true}
}

func (d *dayRow) prefixOr(v decimal.Decimal) decimal.Decimal {
	if d.prefix.Valid {
		return d.prefix.Decimal
	}
	return v
}

// recompute rebuilds the bucket from its level carried in and all its
// change points (sorted by time).
func (d *dayRow) recompute(pts []point) {
	level, prev := d.levelIn, d.start
	d.prefix, d.lastAt, d.unitSec = decimal.NullDecimal{}, pgtype.Timestamptz{}, decimal.Zero
	for _, p := range pts {
		if p.at.After(prev) {
			d.prefix = decimal.NewNullDecimal(decimal.Max(level, d.prefixOr(level)))
			d.unitSec = d.unitSec.Add(level.Mul(Seconds(p.at.Sub(prev))))
			prev = p.at
		}
		level = level.Add(p.delta)
		d.lastAt = pgtype.Timestamptz{Time: p.at, Valid: true}
	}
	d.unitSec = d.unitSec.Add(level.Mul(Seconds(d.end.Sub(prev))))
	d.levelOut = level
}

type point struct {
	at    time.Time
	delta decimal.Decimal
}

// sortedPoints returns a gauge's new change points in time order, without
// those that cancel out.
func sortedPoints(m map[int64]decimal.Decimal) []point {
	out := make([]point, 0, len(m))
	for at, d := range m {
		if !d.IsZero() {
			out = append(out, point{time.UnixMicro(at).UTC(), d})
		}
	}
	sort.Slice(out, func(i, j int) bool { return out[i].at.Before(out[j].at) })
	return out
}

// gaugeWork is one customer gauge's change in this batch.
type gaugeWork struct {
	cm     cmKey
	pts    []point
	before *dayRow             // the last bucket before the first point's
	rows   map[int64]*dayRow   // by start (unix micro): the buckets from the first point's to the last's
	dbPts  map[int64][]point   // the stored change points of buckets to recompute
	buck   map[int64]time.Time // each new point's bucket start
}

// write sends the gauge batch's changes: the readings, stream state,
// change points, the buckets they touch, prior-period adjustments and
// findings, conflicts.
func (a *gaugeApplier) write(ctx context.Context, tx Tx) error {
	cms := make([]cmKey, 0, len(a.points))
	for cm := range a.points {
		cms = append(cms, cm)
	}
	sort.Slice(cms, func(i, j int) bool {
		return cms[i].customer < cms[j].customer || cms[i].customer == cms[j].customer && cms[i].meter < cms[j].meter
	})
	var works []*gaugeWork
	for _, cm := range cms {
		pts := sortedPoints(a.points[cm])
		if len(pts) == 0 {
			continue
		}
		w := &gaugeWork{cm: cm, pts: pts, rows: map[int64]*dayRow{}, dbPts: map[int64][]point{}, buck: map[int64]time.Time{}}
		for _, p := range pts {
			start, end, period, err := DayBucket(a.calendars[cm.customer], p.at)
			if err != nil {
				return fmt.Errorf("ledger: gauge bucket: %w", err)
			}
			w.buck[p.at.UnixMicro()] = start
			if _, ok := w.rows[start.UnixMicro()]; !ok {
				w.rows[start.UnixMicro()] = &dayRow{start: start, end: end, period: period}
			}
		}
		works = append(works, w)
	}
	if len(works) > 0 {
		if err := a.loadDays(ctx, tx, works); err != nil {
			return err
		}
	}
	b := &pgx.Batch{}
	for _, w := range works {
		a.fold(w)
		if err := a.priorPeriods(w); err != nil {
			return err
		}
	}
	a.queueGaugeWrites(b, works)
	a.queueConflicts(b)
	a.queueFindings(b)
	if b.Len() > 0 {
		if err := tx.SendBatch(ctx, b).Close(); err != nil {
			return fmt.Errorf("ledger: gauge write: %w", err)
		}
	}
	return a.copyReadings(ctx, tx)
}

// gaugeColumns are the columns of qCopyGaugeReadings, in order.
var gaugeColumns = []string{"stream_id", "seq", "operation_id", "customer", "meter", "level", "occurred_at", "final",
	"late_fill", "ingested_at"}

// copyReadings writes the new readings with one binary COPY, as
// copyRecords does the counters' records.
func (a *gaugeApplier) copyReadings(ctx context.Context, tx Tx) error {
	return a.copyRows(ctx, tx, "gauge_readings", gaugeColumns, qCopyGaugeReadings, len(a.readings), 128, func(buf []byte, i int) ([]byte, error) {
		g := &a.readings[i]
		buf, err := pgcopy.Numeric(appendKeyFields(buf, g.streamID, g.r), g.r.Level)
		if err != nil {
			return nil, fmt.Errorf("level: %w", err)
		}
		buf = pgcopy.Time(buf, g.r.OccurredAt)
		buf = pgcopy.Bool(buf, g.r.Final)
		buf = pgcopy.Bool(buf, g.late)
		return pgcopy.Time(buf, a.now), nil
	})
}

// loadDays reads the buckets each gauge's new points fall in or cover,
// and the change points of those a point lands before the last change of.
func (a *gaugeApplier) loadDays(ctx context.Context, tx Tx, works []*gaugeWork) error {
	n := len(works)
	cs, ms, los, his := make([]string, n), make([]string, n), make([]time.Time, n), make([]time.Time, n)
	byCM := map[cmKey]*gaugeWork{}
	for j, w := range works {
		cs[j], ms[j] = w.cm.customer, w.cm.meter
		los[j], his[j] = w.buck[w.pts[0].at.UnixMicro()], w.buck[w.pts[len(w.pts)-1].at.UnixMicro()]
		byCM[w.cm] = w
	}
	b := &pgx.Batch{}
	b.Queue(qGaugeDays, cs, ms, los, his).Query(func(rows pgx.Rows) error {
		var c, m string
		var d dayRow
		_, err := pgx.ForEachRow(rows, []any{&c, &m, &d.start, &d.end, &d.period, numericDst(&d.levelIn), nullNumericDst(&d.prefix),
			&d.lastAt, numericDst(&d.unitSec), numericDst(&d.levelOut)}, func() error {
			w := byCM[cmKey{c, m}]
			row := d
			row.start, row.end, row.period, row.exists = d.start.UTC(), d.end.UTC(), d.period.UTC(), true
			if row.lastAt.Valid {
				row.lastAt.Time = row.lastAt.Time.UTC()
			}
			if row.start.Before(w.buck[w.pts[0].at.UnixMicro()]) {
				w.before = &row
			} else {
				w.rows[row.start.UnixMicro()] = &row
			}
			return nil
		})
		return err
	})
	if err := tx.SendBatch(ctx, b).Close(); err != nil {
		return fmt.Errorf("ledger: gauge buckets: %w", err)
	}
	// Buckets where a new point lands before a stored one: recomputed.
	var rc, rm []string
	var rlo, rhi []time.Time
	for _, w := range works {
		need := map[int64]bool{}
		for _, p := range w.pts {
			k := w.buck[p.at.UnixMicro()].UnixMicro()
			if d := w.rows[k]; d.exists && !d.after(p.at) && !need[k] {
				need[k] = true
				rc, rm, rlo, rhi = append(rc, w.cm.customer), append(rm, w.cm.meter), append(rlo, d.start), append(rhi, d.end)
				w.dbPts[k] = []point{}
			}
		}
	}
	if len(rc) == 0 {
		return nil
	}
	b = &pgx.Batch{}
	b.Queue(qGaugePointsIn, rc, rm, rlo, rhi).Query(func(rows pgx.Rows) error {
		var c, m string
		var p point
		_, err := pgx.ForEachRow(rows, []any{&c, &m, &p.at, numericDst(&p.delta)}, func() error {
			w := byCM[cmKey{c, m}]
			p.at = p.at.UTC()
			start, _, _, err := DayBucket(a.calendars[c], p.at)
			if err != nil {
				return err
			}
			w.dbPts[start.UnixMicro()] = append(w.dbPts[start.UnixMicro()], p)
			return nil
		})
		return err
	})
	if err := tx.SendBatch(ctx, b).Close(); err != nil {
		return fmt.Errorf("ledger: gauge change points: %w", err)
	}
	return nil
}

// fold applies a gauge's new points to its buckets, in time order: each
// bucket takes the level carried in from the one before (a bucket without
// a row holds the previous row's level throughout), then its own points.
func (a *gaugeApplier) fold(w *gaugeWork) {
	starts := make([]int64, 0, len(w.rows))
	for k := range w.rows {
		starts = append(starts, k)
	}
	sort.Slice(starts, func(i, j int) bool { return starts[i] < starts[j] })
	carry := decimal.Zero
	if w.before != nil {
		carry = w.before.levelOut
	}
	byBucket := map[int64][]point{}
	for _, p := range w.pts {
		k := w.buck[p.at.UnixMicro()].UnixMicro()
		byBucket[k] = append(byBucket[k], p)
	}
	for _, k := range starts {
		d := w.rows[k]
		if d.exists {
			d.shift(carry.Sub(d.levelIn))
		} else {
			d.levelIn, d.levelOut = carry, carry
			d.unitSec = carry.Mul(Seconds(d.end.Sub(d.start)))
		}
		if stored, ok := w.dbPts[k]; ok {
			merged := map[int64]decimal.Decimal{}
			for _, p := range stored {
				merged[p.at.UnixMicro()] = merged[p.at.UnixMicro()].Add(p.delta)
			}
			for _, p := range byBucket[k] {
				merged[p.at.UnixMicro()] = merged[p.at.UnixMicro()].Add(p.delta)
			}
			all := make([]point, 0, len(merged))
			for at, dl := range merged {
				all = append(all, point{time.UnixMicro(at).UTC(), dl})
			}
			sort.Slice(all, func(i, j int) bool { return all[i].at.Before(all[j].at) })
			d.recompute(all)
		} else {
			for _, p := range byBucket[k] {
				d.appendPoint(p.at, p.delta)
			}
		}
		carry = d.levelOut
	}
}

// priorPeriods turns the change of a gauge's level-seconds in closed
// periods into prior-period adjustments in the first period not closed,
// and notes a finding for each such period (its max may have changed too):
// a frozen statement never changes. The change in a period is exact from
// the points alone: a point (t, c) adds c for the rest of time.
func (a *gaugeApplier) priorPeriods(w *gaugeWork) error {
	c := w.cm.customer
	var closed []int64
	for k, v := range a.closed {
		if v && k.customer == c {
			closed = append(closed, k.start)
		}
	}
	sort.Slice(closed, func(i, j int) bool { return closed[i] < closed[j] })
	for _, startMicro := range closed {
		// An error below fails the micro-batch: skipping the period would
		// leave its prior-period adjustment unbilled.
		p, err := a.calendars[c].PeriodAt(time.UnixMicro(startMicro))
		if err != nil {
			return fmt.Errorf("ledger: customer %q: closed period at %s: %w", c, time.UnixMicro(startMicro).UTC(), err)
		}
		delta := decimal.Zero
		touched := false
		for _, pt := range w.pts {
			if !pt.at.Before(p.End) {
				continue
			}
			touched = true
			from := pt.at
			if from.Before(p.Start) {
				from = p.Start
			}
			delta = delta.Add(pt.delta.Mul(Seconds(p.End.Sub(from))))
		}
		if !touched {
			continue
		}
		own := p.Start.UTC()
		into, _, _, err := a.billingPlace(c, p.Start)
		if err != nil {
			return err
		}
		if !delta.IsZero() {
			a.gaugeAdjustments = append(a.gaugeAdjustments, gaugeAdjustment{customer: c, meter: w.cm.meter,
				period: into, prior: own, unitSeconds: delta, op: a.opOf[w.cm]})
		}
		d := delta
		a.findings = append(a.findings, finding{kind: FindingGaugeAfterClose, customer: c, meter: w.cm.meter, period: &own, amount: &d,
			detail: fmt.Sprintf("a gauge reading changed the level in closed period %s (unit_seconds %s, billed in period %s as a prior-period adjustment); its max may differ from the frozen statement's",
				p.Name, delta, into.Format(time.RFC3339))})
	}
	return nil
}

// FindingGaugeAfterClose: a late gauge reading changed a closed period.
const FindingGaugeAfterClose = "gauge_changed_after_close"

type gaugeAdjustment struct {
	customer, meter string
	period, prior   time.Time
	unitSeconds     decimal.Decimal
	op              uuid.UUID
}

func (a *gaugeApplier) queueGaugeWrites(b *pgx.Batch, works []*gaugeWork) {
	var gs []*gaugeStream
	for _, g := range a.gbyID {
		if g.dirty && g.hasState {
			gs = append(gs, g)
		}
	}
	sort.Slice(gs, func(i, j int) bool { return gs[i].id < gs[j].id })
	if n := len(gs); n > 0 {
		sid, seq := make([]int64, n), make([]int64, n)
		cs, ms, lv := make([]string, n), make([]string, n), make([]string, n)
		last, first := make([]time.Time, n), make([]time.Time, n)
		ends := make([]pgtype.Timestamptz, n)
		var fsid, fseq []int64
		var ffinal []*int64
		for j, g := range gs {
			sid[j], seq[j], cs[j], ms[j], lv[j] = g.id, g.lastSeq, g.key.Customer, g.key.Meter, g.lastLevel.String()
			last[j], first[j] = g.lastAt, g.firstAt
			if g.endsAt != nil {
				ends[j] = pgtype.Timestamptz{Time: *g.endsAt, Valid: true}
			}
			if g.lastSeq > g.dbLastSeq {
				fsid, fseq = append(fsid, g.id), append(fseq, g.lastSeq)
				var f *int64
				if g.finalSeq != 0 {
					v := g.finalSeq
					f = &v
				}
				ffinal = append(ffinal, f)
			}
		}
		b.Queue(qUpsertGaugeStreams, pgx.StrictNamedArgs{"stream_id": sid, "customer": cs, "meter": ms, "last_seq": seq,
			"last_level": lv, "last_at": last, "first_at": first, "ends_at": ends})
		if len(fsid) > 0 {
			b.Queue(qUpdateStreamSeqs, fsid, fseq, ffinal, a.now)
		}
	}
	var pc, pm, pd []string
	var pa []time.Time
	var dc, dm, dli, dpre, dus, dlo []string
	var dst, den, dper []time.Time
	var dlast []pgtype.Timestamptz
	var sc, sm, ss []string
	var sa []time.Time
	for _, w := range works {
		for _, p := range w.pts {
			pc, pm, pa, pd = append(pc, w.cm.customer), append(pm, w.cm.meter), append(pa, p.at), append(pd, p.delta.String())
		}
		starts := make([]int64, 0, len(w.rows))
		for k := range w.rows {
			starts = append(starts, k)
		}
		sort.Slice(starts, func(i, j int) bool { return starts[i] < starts[j] })
		for _, k := range starts {
			d := w.rows[k]
			dc, dm, dst, den, dper = append(dc, w.cm.customer), append(dm, w.cm.meter), append(dst, d.start), append(den, d.end), append(dper, d.period)
			var pre string
			if d.prefix.Valid {
				pre = d.prefix.Decimal.String()
			}
			dli, dpre, dus, dlo, dlast = append(dli, d.levelIn.String()), append(dpre, pre), append(dus, d.unitSec.String()),
				append(dlo, d.levelOut.String()), append(dlast, d.lastAt)
		}
		total := decimal.Zero
		for _, p := range w.pts {
			total = total.Add(p.delta)
		}
		if !total.IsZero() {
			sc, sm, sa, ss = append(sc, w.cm.customer), append(sm, w.cm.meter), append(sa, time.UnixMicro(starts[len(starts)-1]).UTC()), append(ss, total.String())
		}
	}
	if len(pc) > 0 {
		b.Queue(qUpsertGaugePoints, pgx.StrictNamedArgs{"customer": pc, "meter": pm, "at": pa, "delta": pd})
	}
	if len(dc) > 0 {
		pre := make([]*string, len(dpre))
		for j := range dpre {
			if dpre[j] != "" {
				pre[j] = &dpre[j]
			}
		}
		b.Queue(qUpsertGaugeDays, pgx.StrictNamedArgs{"customer": dc, "meter": dm, "day_start": dst, "day_end": den,
			"period_start": dper, "level_in": dli, "max_prefix": pre, "last_at": dlast, "unit_seconds": dus, "level_out": dlo})
	}
	if len(sc) > 0 {
		b.Queue(qShiftGaugeDays, pgx.StrictNamedArgs{"customer": sc, "meter": sm, "after": sa, "shift": ss})
	}
	if n := len(a.gaugeAdjustments); n > 0 {
		ids, ops := make([]pgtype.UUID, n), make([]pgtype.UUID, n)
		cs, ms, us := make([]string, n), make([]string, n), make([]string, n)
		ps, pr := make([]time.Time, n), make([]time.Time, n)
		for j, g := range a.gaugeAdjustments {
			ids[j], ops[j] = pguuid.Of(uuid.Must(uuid.NewV7())), pguuid.Of(g.op)
			cs[j], ms[j], us[j], ps[j], pr[j] = g.customer, g.meter, g.unitSeconds.String(), g.period, g.prior
		}
		b.Queue(qInsertGaugeAdjustments, pgx.StrictNamedArgs{"id": ids, "customer": cs, "meter": ms, "period_start": ps,
			"prior_period": pr, "unit_seconds": us, "operation_id": ops, "now": a.now})
	}
}
