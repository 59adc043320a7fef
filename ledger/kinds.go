package ledger

import (
	"context"
	"errors"
	"fmt"
	"time"
	"unicode/utf8"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgtype"

	"github.com/tally-ledger/tally/amount"
	"github.com/tally-ledger/tally/internal/locks"
	"github.com/tally-ledger/tally/internal/pguuid"
	"github.com/tally-ledger/tally/periods"
)

// MaxMemberLength is the longest member a unique record may carry, in
// characters.
const MaxMemberLength = 256

// applyKinds is Apply's dispatch point: it reads the kinds of the batch's
// meters (holding locks.MeterKinds shared, so no kind changes until the
// transaction ends), rejects records whose shape is not their meter's
// kind, and applies each kind's records on its own path. Outcomes are in
// the records' order; each path is exactly what applying its records one
// at a time would give. The kinds share one thing, operation ids: an id
// names one usage report whatever its kind, so each path looks the batch's
// ids up in the other kinds' tables too, and within one batch the first
// record to carry an id claims it for its kind (a later record of another
// kind reusing it is a conflict, even should the first be refused).
func (l *Ledger) applyKinds(ctx context.Context, tx Tx, recs []Record) ([]Outcome, error) {
	// The common case, a batch of one shape: that kind's path reads the
	// kinds in its own first round trip, and gives the batch back (undone
	// to its savepoint) when a meter is not of that kind.
	shape := Counter
	for i := range recs {
		s := recs[i].Shape
		if s == "" {
			s = Counter
		}
		if i > 0 && s != shape {
			shape = ""
			break
		}
		shape = s
	}
	if shape != "" && len(recs) > 0 {
		var out []Outcome
		var err error
		undo := qRollbackToKinds
		switch shape {
		case Gauge:
			out, err = l.applyGauges(ctx, tx, recs, Gauge, nil)
		case Unique:
			out, err = l.applyUniques(ctx, tx, recs, Unique, nil)
		default:
			out, err = l.applyCounters(ctx, tx, recs, Counter, nil)
			undo = qRollbackToApply
		}
		if !errors.Is(err, errKindsDiffer) {
			return out, err
		}
		if _, err := tx.Exec(ctx, undo); err != nil {
			return nil, fmt.Errorf("ledger: undo the attempt: %w", err)
		}
	}
	seen := map[string]bool{}
	var meters []string
	for i := range recs {
		if m := recs[i].Stream.Meter; !seen[m] {
			seen[m] = true
			meters = append(meters, m)
		}
	}
	kinds := make(map[string]MeterKind, len(meters))
	b := &pgx.Batch{}
	b.Queue(qLockMeterKindsShared, locks.MeterKinds)
	b.Queue(qSelectKinds, meters).Query(func(rows pgx.Rows) error {
		var name, kind string
		_, err := pgx.ForEachRow(rows, []any{&name, &kind}, func() error {
			kinds[name] = MeterKind(kind)
			return nil
		})
		return err
	})
	if err := tx.SendBatch(ctx, b).Close(); err != nil {
		return nil, fmt.Errorf("ledger: meter kinds: %w", err)
	}
	out := make([]Outcome, len(recs))
	var byKind [3][]int                  // counter, gauge, unique
	claimed := map[uuid.UUID]MeterKind{} // by the first record carrying the id
	var earlier [3]map[uuid.UUID]MeterKind
	for i := range recs {
		r := &recs[i]
		shape := r.Shape
		if shape == "" {
			shape = Counter
		}
		kind, ok := kinds[r.Stream.Meter]
		if !ok {
			kind = Counter
		}
		if shape != kind {
			out[i] = Outcome{Kind: Rejected, Reason: ReasonKindMismatch,
				Detail: fmt.Sprintf("meter %q is a %s (it takes %s) but the record carries %s", r.Stream.Meter, kind, carries(kind), carries(shape))}
			continue
		}
		k := 0
		switch kind {
		case Gauge:
			k = 1
		case Unique:
			k = 2
		}
		byKind[k] = append(byKind[k], i)
		if first, ok := claimed[r.OperationID]; !ok {
			claimed[r.OperationID] = kind
		} else if first != kind {
			if earlier[k] == nil {
				earlier[k] = map[uuid.UUID]MeterKind{}
			}
			earlier[k][r.OperationID] = first
		}
	}
	paths := [3]func(context.Context, Tx, []Record, MeterKind, map[uuid.UUID]MeterKind) ([]Outcome, error){l.applyCounters, l.applyGauges, l.applyUniques}
	for k, idx := range byKind {
		if len(idx) == 0 {
			continue
		}
		sub := make([]Record, len(idx))
		for j, i := range idx {
			sub[j] = recs[i]
		}
		o, err := paths[k](ctx, tx, sub, "", earlier[k])
		if err != nil {
			return nil, err
		}
		for j, i := range idx {
			out[i] = o[j]
		}
	}
	return out, nil
}

// errKindsDiffer: a batch of one shape names a meter of another kind, or
// (counters) a meter of another kind now exists that the Ledger had not
// seen (see applier.load); applyKinds undoes the attempt and applies the
// batch the general way, which reads every kind.
var errKindsDiffer = errors.New("ledger: a meter of the batch is not of its records' kind")

// queueKindsCheck takes locks.MeterKinds shared (as applyKinds does) and
// reads the kinds of the batch's meters, for kindsDiffer.
func (a *applier) queueKindsCheck(b *pgx.Batch, keys []StreamKey) {
	seen := map[string]bool{}
	a.kindsRead = map[string]MeterKind{}
	for _, k := range keys {
		if !seen[k.Meter] {
			seen[k.Meter] = true
			a.kindMeters = append(a.kindMeters, k.Meter)
		}
	}
	b.Queue(qLockMeterKindsShared, locks.MeterKinds)
	b.Queue(qSelectKinds, a.kindMeters).Query(func(rows pgx.Rows) error {
		var name, kind string
		_, err := pgx.ForEachRow(rows, []any{&name, &kind}, func() error {
			a.kindsRead[name] = MeterKind(kind)
			return nil
		})
		return err
	})
}

// kindsDiffer reports whether a meter read by queueKindsCheck is not of
// the kind checked (an undeclared meter is a counter).
func (a *applier) kindsDiffer() bool {
	if a.checkKind == "" {
		return false
	}
	for _, m := range a.kindMeters {
		k, ok := a.kindsRead[m]
		if !ok {
			k = Counter
		}
		if k != a.checkKind {
			return true
		}
	}
	return false
}

// carries names the field a kind's records carry.
func carries(k MeterKind) string {
	switch k {
	case Gauge:
		return "a level"
	case Unique:
		return "a member"
	}
	return "a total"
}

// checkReading is Apply's own guard for gauge and unique records (the wire
// decoder gives friendlier errors first).
func (r *Record) checkReading() error {
	var errs []error
	if r.OperationID == [16]byte{} {
		errs = append(errs, errors.New("operation_id: missing"))
	}
	if r.Stream.Producer == "" || r.Stream.Customer == "" || r.Stream.Meter == "" {
		errs = append(errs, errors.New("stream: producer, customer and meter are required"))
	}
	if r.Stream.Epoch < 1 {
		errs = append(errs, fmt.Errorf("epoch: %d is not positive", r.Stream.Epoch))
	}
	if r.Seq < 1 {
		errs = append(errs, fmt.Errorf("seq: %d is not positive", r.Seq))
	}
	switch r.Shape {
	case Gauge:
		if r.Level.Sign() < 0 {
			errs = append(errs, fmt.Errorf("level: %s is negative", r.Level))
		} else if err := amount.Check(r.Level); err != nil {
			errs = append(errs, fmt.Errorf("level: %w", err))
		}
	case Unique:
		if n := utf8.RuneCountInString(r.Member); n < 1 || n > MaxMemberLength || !utf8.ValidString(r.Member) {
			errs = append(errs, fmt.Errorf("member: must be 1-%d characters of UTF-8", MaxMemberLength))
		}
	}
	if r.OccurredAt.IsZero() {
		errs = append(errs, errors.New("occurred_at: missing"))
	}
	return errors.Join(errs...)
}

// validateReadings rejects the gauge and unique records Apply cannot
// take, returning the indexes of the rest.
func (a *applier) validateReadings() []int {
	valid := make([]int, 0, len(a.recs))
	for i := range a.recs {
		r := &a.recs[i]
		if err := r.checkReading(); err != nil {
			a.out[i] = Outcome{Kind: Rejected, Reason: ReasonInvalid, Detail: err.Error()}
			continue
		}
		if r.OccurredAt.After(a.now.Add(MaxClockSkew)) {
			a.out[i] = Outcome{Kind: Rejected, Reason: ReasonFutureTimestamp,
				Detail: fmt.Sprintf("occurred_at %s is more than %s ahead of the ledger clock (%s)",
					r.OccurredAt.Format(time.RFC3339Nano), MaxClockSkew, a.now.Format(time.RFC3339))}
			continue
		}
		valid = append(valid, i)
	}
	return valid
}

// DayBucket is the bucket gauge and unique aggregates are kept by: the
// local day containing t in the zone of t's period (the calendar in force
// at the period's start), from its first instant to the next day's
// (periods.DayStart: where the clocks skip midnight, the instant they jump
// past it, not time.Date's answer, an instant of the day before), cut at
// the period's boundaries.
func DayBucket(s periods.Schedule, t time.Time) (start, end, period time.Time, err error) {
	p, err := s.PeriodAt(t)
	if err != nil {
		return start, end, period, err
	}
	loc, err := s.CalendarAt(p.Start).Location()
	if err != nil {
		return start, end, period, err
	}
	y, m, d := t.In(loc).Date()
	ds, de := periods.DayStart(loc, y, m, d), periods.DayStart(loc, y, m, d+1)
	if ds.Before(p.Start) {
		ds = p.Start
	}
	if de.After(p.End) {
		de = p.End
	}
	return ds.UTC(), de.UTC(), p.Start.UTC(), nil
}

// queueOtherKinds loads which of the batch's operation ids a reading or
// record of another kind than own already holds, into a.elsewhere. The
// counter path pays for it only once a gauge or unique meter is declared.
func (a *applier) queueOtherKinds(b *pgx.Batch, opIDs []uuid.UUID, own MeterKind) {
	if a.elsewhere == nil {
		a.elsewhere = map[uuid.UUID]MeterKind{}
	}
	b.Queue(qOperationsOfOtherKinds, pguuid.Slice(opIDs), string(own)).Query(func(rows pgx.Rows) error {
		var op pgtype.UUID
		var kind string
		_, err := pgx.ForEachRow(rows, []any{&op, &kind}, func() error {
			a.elsewhere[op.Bytes] = MeterKind(kind)
			return nil
		})
		return err
	})
}

// reusedElsewhere says why r, of kind own, is a conflict when a record of
// another kind holds its operation id.
func (a *applier) reusedElsewhere(r *Record, own MeterKind) (string, bool) {
	k, ok := a.elsewhere[r.OperationID]
	if !ok || k == own {
		return "", false
	}
	return fmt.Sprintf("operation_id %s is already held by a record of a %s meter: an operation id names one usage report whatever its meter's kind; the first write stands",
		r.OperationID, k), true
}
