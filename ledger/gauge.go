package ledger

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"sort"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgtype"
	"github.com/shopspring/decimal"

	"github.com/tally-ledger/tally/internal/locks"
	"github.com/tally-ledger/tally/internal/pguuid"
	"github.com/tally-ledger/tally/periods"
)

// A gauge stream's level holds from a reading's occurred_at until the
// stream's next reading (by seq), or until the stream ends: at the first
// reading of a newer epoch of the same producer, customer and meter. A
// final reading's level is 0. A customer's level is the sum of its
// streams'. Applying a reading changes the stream's level over exactly the
// interval the reading governs, by a constant (its level minus the level
// of the reading before it); that change becomes two change points of the
// customer's level (gauge_points), and gauge_days.go folds change points
// into the buckets the aggregates are read from.

// gaugeReading is a recorded reading as the gauge path sees it.
type gaugeReading struct {
	seq   int64
	op    uuid.UUID
	level decimal.Decimal // as sent
	at    time.Time
	final bool
}

// effective is the level the reading sets: 0 after a final.
func (r gaugeReading) effective() decimal.Decimal {
	if r.final {
		return decimal.Zero
	}
	return r.level
}

type gaugeStream struct {
	id        int64
	key       StreamKey
	dbLastSeq int64
	lastSeq   int64
	finalSeq  int64
	hasState  bool // has readings (a gauge_streams row, or one from this batch)
	lastLevel decimal.Decimal
	lastAt    time.Time
	firstAt   time.Time
	endsAt    *time.Time
	// known holds the readings this batch knows of: the last one, the
	// neighbours of late seqs, the batch's own.
	known map[int64]gaugeReading
	dirty bool
}

// prevOf and nextOf are the known readings just below and above seq.
func (s *gaugeStream) prevOf(seq int64) (gaugeReading, bool) {
	var best gaugeReading
	found := false
	for k, r := range s.known {
		if k < seq && (!found || k > best.seq) {
			best, found = r, true
		}
	}
	return best, found
}

func (s *gaugeStream) nextOf(seq int64) (gaugeReading, bool) {
	var best gaugeReading
	found := false
	for k, r := range s.known {
		if k > seq && (!found || k < best.seq) {
			best, found = r, true
		}
	}
	return best, found
}

// cmKey is a customer's gauge.
type cmKey struct{ customer, meter string }

type gaugeApplier struct {
	*applier
	gstreams map[StreamKey]*gaugeStream
	gbyID    map[int64]*gaugeStream
	gops     map[uuid.UUID]gaugeStored
	// points are the changes of each customer level: unix micro → delta.
	points   map[cmKey]map[int64]decimal.Decimal
	readings []gaugeNew
	// opOf is the operation that made each customer gauge change (for
	// prior-period adjustments).
	opOf             map[cmKey]uuid.UUID
	gaugeAdjustments []gaugeAdjustment
	newest           map[sibKey]int64
	siblings         map[sibKey][]*gaugeStream
}

type gaugeStored struct {
	streamID int64
	gaugeReading
}

type gaugeNew struct {
	r        *Record
	streamID int64
	late     bool
}

// applyGauges is Apply for the records of gauge meters. Like counters
// (see load in apply.go), it looks up only the operation ids of records at
// or below their stream's last seq; a new record whose id is recorded
// anyway makes the readings' insert insert less, and the batch is undone
// to a savepoint and applied again with every id looked up.
//
// With checkKind, its first round trip also reads the meters' kinds; earlier
// is as for applyCounters (see applyKinds).
func (l *Ledger) applyGauges(ctx context.Context, tx Tx, recs []Record, checkKind MeterKind, earlier map[uuid.UUID]MeterKind) ([]Outcome, error) {
	out, err := l.applyGaugesOnce(ctx, tx, recs, false, checkKind, earlier)
	if !errors.Is(err, errOperationTaken) {
		return out, err
	}
	if _, err := tx.Exec(ctx, qRollbackToKinds); err != nil {
		return nil, fmt.Errorf("ledger: undo the attempt: %w", err)
	}
	return l.applyGaugesOnce(ctx, tx, recs, true, "", earlier)
}

func (l *Ledger) applyGaugesOnce(ctx context.Context, tx Tx, recs []Record, lookupAll bool, checkKind MeterKind, earlier map[uuid.UUID]MeterKind) ([]Outcome, error) {
	now := l.now().UTC().Truncate(time.Microsecond)
	a := &gaugeApplier{applier: &applier{
		lookupAll: lookupAll, checkKind: checkKind, now: now, out: make([]Outcome, len(recs)), recs: normalised(recs),
		streams:   map[StreamKey]*stream{},
		calendars: map[string]periods.Schedule{}, closed: map[periodKey]bool{}, rollups: map[rollupKey]decimal.Decimal{},
		elsewhere: maps.Clone(earlier),
	}, gstreams: map[StreamKey]*gaugeStream{}, gbyID: map[int64]*gaugeStream{}, gops: make(map[uuid.UUID]gaugeStored, len(recs)),
		points: map[cmKey]map[int64]decimal.Decimal{}, opOf: map[cmKey]uuid.UUID{}}
	valid := a.validateReadings()
	if len(valid) == 0 {
		return a.out, nil
	}
	if err := a.load(ctx, tx, valid); err != nil {
		return nil, err
	}
	for _, i := range valid {
		if err := a.apply(i); err != nil {
			return nil, err
		}
	}
	if err := a.write(ctx, tx); err != nil {
		return nil, err
	}
	return a.out, nil
}

func (a *gaugeApplier) load(ctx context.Context, tx Tx, valid []int) error {
	var customers []string
	seenC := map[string]bool{}
	var keys []StreamKey
	var lockC, lockM []string
	seenCM := map[cmKey]bool{}
	minAt := a.now
	for _, i := range valid {
		r := &a.recs[i]
		if !seenC[r.Stream.Customer] {
			seenC[r.Stream.Customer] = true
			customers = append(customers, r.Stream.Customer)
		}
		if _, ok := a.gstreams[r.Stream]; !ok {
			a.gstreams[r.Stream] = nil
			keys = append(keys, r.Stream)
		}
		if cm := (cmKey{r.Stream.Customer, r.Stream.Meter}); !seenCM[cm] {
			seenCM[cm] = true
			lockC, lockM = append(lockC, cm.customer), append(lockM, cm.meter)
		}
		if r.OccurredAt.Before(minAt) {
			minAt = r.OccurredAt
		}
	}
	sort.Strings(customers)
	b := &pgx.Batch{}
	if !a.lookupAll {
		b.Queue(qSavepointKinds)
	}
	if a.checkKind != "" {
		a.queueKindsCheck(b, keys)
	}
	a.queueCustomers(b, customers, minAt)
	a.queueStreamState(b, keys)
	b.Queue(qLockCustomerMeters, locks.GaugeLevel, lockC, lockM)
	// The gauge state of the streams, keyed like the streams just created
	// and locked, in the same round trip.
	producers, epochs, custs, meters := streamArrays(keys)
	b.Queue(qGaugeStreams, producers, epochs, custs, meters).Query(func(rows pgx.Rows) error {
		var id int64
		var st gaugeStreamRow
		_, err := pgx.ForEachRow(rows, st.dst(&id), func() error {
			g, err := a.gaugeOf(id)
			if err == nil {
				st.into(g)
			}
			return err
		})
		return err
	})
	b.Queue(qGaugeNewerEpochs, producers, epochs, custs, meters).Query(func(rows pgx.Rows) error {
		var id int64
		var at pgtype.Timestamptz
		_, err := pgx.ForEachRow(rows, []any{&id, &at}, func() error {
			g, err := a.gaugeOf(id)
			if err == nil && at.Valid && (g.endsAt == nil || at.Time.Before(*g.endsAt)) {
				t := at.Time.UTC()
				g.endsAt = &t
			}
			return err
		})
		return err
	})
	b.Queue(qGaugeOlderEpochs, producers, epochs, custs, meters, minAt).Query(func(rows pgx.Rows) error {
		var id int64
		var k StreamKey
		var st gaugeStreamRow
		dst := append([]any{&id, &k.Producer, &k.Epoch, &k.Customer, &k.Meter}, st.dst(nil)[1:]...)
		_, err := pgx.ForEachRow(rows, dst, func() error {
			if _, ok := a.gbyID[id]; ok {
				return nil
			}
			if _, batch := a.gstreams[k]; batch {
				return nil // a stream of this batch: loaded above
			}
			g := &gaugeStream{id: id, key: k, known: map[int64]gaugeReading{}}
			st.into(g)
			g.dbLastSeq = g.lastSeq
			a.gstreams[k], a.gbyID[id] = g, g
			return nil
		})
		return err
	})
	ops := make([]uuid.UUID, len(valid))
	for j, i := range valid {
		ops[j] = a.recs[i].OperationID
	}
	a.queueOtherKinds(b, ops, Gauge)
	if err := tx.SendBatch(ctx, b).Close(); err != nil {
		return fmt.Errorf("ledger: gauge load: %w", err)
	}
	if a.kindsDiffer() {
		return errKindsDiffer
	}
	for _, k := range keys {
		if a.streams[k] == nil {
			return fmt.Errorf("ledger: stream %+v was not created", k)
		}
		if _, err := a.gaugeOf(a.streams[k].id); err != nil {
			return err
		}
	}
	// The operation ids that may be recorded, looked up only when there
	// are some.
	if ops := a.recordable(valid); len(ops) > 0 {
		b = &pgx.Batch{}
		b.Queue(qGaugeByOperation, pguuid.Slice(ops)).Query(func(rows pgx.Rows) error {
			var op pgtype.UUID
			var s gaugeStored
			_, err := pgx.ForEachRow(rows, []any{&op, &s.streamID, &s.seq, numericDst(&s.level), &s.at, &s.final}, func() error {
				s.op = op.Bytes
				s.at = s.at.UTC()
				a.gops[op.Bytes] = s
				return nil
			})
			return err
		})
		if err := tx.SendBatch(ctx, b).Close(); err != nil {
			return fmt.Errorf("ledger: gauge load: %w", err)
		}
	}

	// Late seqs: the recorded readings at and around them. Older epochs
	// still reporting after minAt: their readings from then on.
	var lateS, lateQ []int64
	for _, i := range valid {
		r := &a.recs[i]
		g := a.gstreams[r.Stream]
		if _, ok := a.gops[r.OperationID]; ok {
			continue
		}
		if r.Seq <= g.dbLastSeq {
			lateS, lateQ = append(lateS, g.id), append(lateQ, r.Seq)
		}
	}
	// Streams a newer epoch of the batch may end while they still report.
	var older []*gaugeStream
	for _, g := range a.gbyID {
		if g.hasState && g.lastAt.After(minAt) && a.hasNewerEpoch(g) {
			older = append(older, g)
		}
	}
	if len(lateS) == 0 && len(older) == 0 {
		return nil
	}
	b = &pgx.Batch{}
	collect := func(rows pgx.Rows) error {
		var sid int64
		var op pgtype.UUID
		var r gaugeReading
		_, err := pgx.ForEachRow(rows, []any{&sid, &r.seq, &op, numericDst(&r.level), &r.at, &r.final}, func() error {
			r.op, r.at = op.Bytes, r.at.UTC()
			a.gbyID[sid].known[r.seq] = r
			return nil
		})
		return err
	}
	if len(lateS) > 0 {
		b.Queue(qGaugeNeighbours, lateS, lateQ).Query(collect)
	}
	for _, g := range older {
		b.Queue(qGaugeReadingsFrom, g.id, minAt).Query(collect)
	}
	if err := tx.SendBatch(ctx, b).Close(); err != nil {
		return fmt.Errorf("ledger: gauge load neighbours: %w", err)
	}
	return nil
}

// gaugeOf is the gauge state of the batch's stream id (locked by
// queueStreamState's statement, earlier in the same round trip).
func (a *gaugeApplier) gaugeOf(id int64) (*gaugeStream, error) {
	if g, ok := a.gbyID[id]; ok {
		return g, nil
	}
	s := a.byID[id]
	if s == nil {
		return nil, fmt.Errorf("ledger: gauge stream %d is not among the batch's locked streams", id)
	}
	g := &gaugeStream{id: s.id, key: s.key, dbLastSeq: s.lastSeq, lastSeq: s.lastSeq, known: make(map[int64]gaugeReading, a.perStream)}
	a.gstreams[s.key], a.gbyID[id] = g, g
	return g, nil
}

// sibKey is a stream without its epoch: its epochs are siblings.
type sibKey struct{ producer, customer, meter string }

func sibOf(k StreamKey) sibKey { return sibKey{k.Producer, k.Customer, k.Meter} }

// hasNewerEpoch reports whether a stream of the batch is a newer epoch of
// g's producer, customer and meter.
func (a *gaugeApplier) hasNewerEpoch(g *gaugeStream) bool {
	if a.newest == nil {
		a.newest = map[sibKey]int64{}
		for k := range a.gstreams {
			a.newest[sibOf(k)] = max(a.newest[sibOf(k)], k.Epoch)
		}
	}
	return a.newest[sibOf(g.key)] > g.key.Epoch
}

// siblingsOf lists the loaded streams of g's producer, customer and meter
// (every epoch); the set is complete once load has returned.
func (a *gaugeApplier) siblingsOf(g *gaugeStream) []*gaugeStream {
	if a.siblings == nil {
		a.siblings = map[sibKey][]*gaugeStream{}
		for _, o := range a.gbyID {
			a.siblings[sibOf(o.key)] = append(a.siblings[sibOf(o.key)], o)
		}
	}
	return a.siblings[sibOf(g.key)]
}

// gaugeStreamRow scans gauge_streams.
type gaugeStreamRow struct {
	lastSeq int64
	level   decimal.Decimal
	lastAt  time.Time
	firstAt time.Time
	endsAt  pgtype.Timestamptz
}

func (st *gaugeStreamRow) dst(id *int64) []any {
	return []any{id, &st.lastSeq, numericDst(&st.level), &st.lastAt, &st.firstAt, &st.endsAt}
}

func (st *gaugeStreamRow) into(g *gaugeStream) {
	g.hasState = true
	g.lastSeq = max(g.lastSeq, st.lastSeq)
	g.lastLevel, g.lastAt, g.firstAt = st.level, st.lastAt.UTC(), st.firstAt.UTC()
	if st.endsAt.Valid {
		t := st.endsAt.Time.UTC()
		g.endsAt = &t
	}
	// The last reading is known: it is where an in-order reading's
	// interval starts from. Its level here is the effective one.
	g.known[st.lastSeq] = gaugeReading{seq: st.lastSeq, level: st.level, at: g.lastAt}
}

// apply decides one gauge reading's outcome and records the level change.
func (a *gaugeApplier) apply(i int) error {
	r := &a.recs[i]
	g := a.gstreams[r.Stream]
	rd := gaugeReading{seq: r.Seq, op: r.OperationID, level: r.Level, at: r.OccurredAt, final: r.Final}

	if detail, ok := a.reusedElsewhere(r, Gauge); ok {
		a.gconflict(i, g, ReasonOperationReused, &r.OperationID, detail)
		return nil
	}
	if prev, ok := a.gops[r.OperationID]; ok {
		if prev.streamID == g.id && prev.seq == r.Seq && prev.level.Equal(r.Level) && prev.at.Equal(r.OccurredAt) && prev.final == r.Final {
			a.out[i] = Outcome{Kind: Duplicate}
			return nil
		}
		a.gconflict(i, g, ReasonOperationReused, &prev.op,
			fmt.Sprintf("operation_id %s was first recorded with other content (stream %d seq %d level %s); the first write stands",
				r.OperationID, prev.streamID, prev.seq, prev.level))
		return nil
	}
	if k, ok := g.known[r.Seq]; ok {
		var existing *uuid.UUID
		if k.op != uuid.Nil {
			existing = &k.op
		}
		a.gconflict(i, g, ReasonSeqReused, existing,
			fmt.Sprintf("seq %d of this stream is already recorded under operation_id %s; the first write stands", r.Seq, k.op))
		return nil
	}
	var prev, next gaugeReading
	var hasPrev, hasNext bool
	if r.Seq > g.lastSeq { // in order: the last reading is the one before, none after
		prev, hasPrev = g.known[g.lastSeq]
	} else {
		prev, hasPrev = g.prevOf(r.Seq)
		next, hasNext = g.nextOf(r.Seq)
	}
	if hasPrev && r.OccurredAt.Before(prev.at) || hasNext && r.OccurredAt.After(next.at) {
		a.gconflict(i, g, ReasonTimeOrder, nil,
			fmt.Sprintf("occurred_at %s of seq %d is not between its neighbours' (seq %d at %s, seq %d at %s): a gauge's readings are in time order",
				r.OccurredAt.Format(time.RFC3339Nano), r.Seq, prev.seq, prev.at.Format(time.RFC3339Nano), next.seq, next.at.Format(time.RFC3339Nano)))
		return nil
	}

	// The interval this reading governs, and the level it replaces there.
	var end *time.Time
	if hasNext {
		t := next.at
		end = &t
	}
	if g.endsAt != nil && (end == nil || g.endsAt.Before(*end)) {
		end = g.endsAt
	}
	was := decimal.Zero
	if hasPrev {
		was = prev.effective()
	}
	a.change(g.key, r.OperationID, r.OccurredAt, end, rd.effective().Sub(was))

	late := r.Seq < g.lastSeq
	g.known[r.Seq] = rd
	a.gops[r.OperationID] = gaugeStored{streamID: g.id, gaugeReading: rd}
	if !g.hasState || r.OccurredAt.Before(g.firstAt) {
		g.firstAt = r.OccurredAt
	}
	if !late {
		g.lastSeq, g.lastLevel, g.lastAt = r.Seq, rd.effective(), r.OccurredAt
		if r.Final {
			g.finalSeq = r.Seq
		}
	}
	g.hasState, g.dirty = true, true
	a.readings = append(a.readings, gaugeNew{r: r, streamID: g.id, late: late})

	// This stream ends every older epoch still running at its reading.
	for _, o := range a.siblingsOf(g) {
		if o.key.Epoch >= g.key.Epoch || (o.endsAt != nil && !r.OccurredAt.Before(*o.endsAt)) {
			continue
		}
		a.endStream(o, r.OccurredAt, r.OperationID)
	}
	kind := Applied
	if late {
		kind = LateFill
	}
	p, err := a.periodOf(r.Stream.Customer, r.OccurredAt)
	if err != nil {
		return err
	}
	a.out[i] = Outcome{Kind: kind, Period: p.Start.UTC()}
	return nil
}

// endStream moves stream o's end from where it was to at: its level is 0
// from then on.
func (a *gaugeApplier) endStream(o *gaugeStream, at time.Time, op uuid.UUID) {
	old := o.endsAt
	t := at
	o.endsAt, o.dirty = &t, true
	if !o.hasState {
		return
	}
	// The stream's known readings in order, from the one in force at `at`.
	seqs := make([]int64, 0, len(o.known))
	for k := range o.known {
		seqs = append(seqs, k)
	}
	sort.Slice(seqs, func(i, j int) bool { return seqs[i] < seqs[j] })
	level := decimal.Zero
	for _, k := range seqs {
		if r := o.known[k]; !r.at.After(at) {
			level = r.effective()
		}
	}
	// −level over [at, old), stepping with the readings inside it.
	cur := at
	for _, k := range seqs {
		r := o.known[k]
		if !r.at.After(at) {
			continue
		}
		if old != nil && !r.at.Before(*old) {
			break
		}
		rt := r.at
		a.change(o.key, op, cur, &rt, level.Neg())
		cur, level = r.at, r.effective()
	}
	a.change(o.key, op, cur, old, level.Neg())
}

// change adds c to the customer's level over [from, to) (to nil: forever).
func (a *gaugeApplier) change(k StreamKey, op uuid.UUID, from time.Time, to *time.Time, c decimal.Decimal) {
	if c.IsZero() || (to != nil && !from.Before(*to)) {
		return
	}
	cm := cmKey{k.Customer, k.Meter}
	pts := a.points[cm]
	if pts == nil {
		pts = make(map[int64]decimal.Decimal, 2*a.perStream) // a reading starts a level and may end one
		a.points[cm] = pts
	}
	pts[from.UnixMicro()] = pts[from.UnixMicro()].Add(c)
	if to != nil {
		pts[to.UnixMicro()] = pts[to.UnixMicro()].Sub(c)
	}
	a.opOf[cm] = op
}

func (a *gaugeApplier) gconflict(i int, g *gaugeStream, reason string, existing *uuid.UUID, detail string) {
	a.out[i] = Outcome{Kind: Conflict, Reason: reason, Detail: detail}
	a.conflicts = append(a.conflicts, conflictRow{reason: reason, rec: &a.recs[i], streamID: g.id, existingOp: existing})
}
