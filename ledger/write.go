package ledger

import (
	"cmp"
	"context"
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/shopspring/decimal"

	"github.com/tally-ledger/tally/internal/pguuid"
)

// write sends every change of the batch in one pipelined round trip.
func (a *applier) write(ctx context.Context, tx Tx) error {
	if err := a.copyRecords(ctx, tx); err != nil {
		return err
	}
	b := &pgx.Batch{}
	a.queueStreams(b)
	a.queueStreamPeriods(b)
	a.queueGaps(b)
	queueEntries(b, a.entries, a.now, qInsertEntries)
	if err := a.queueRollups(b); err != nil {
		return err
	}
	a.queueConflicts(b)
	a.queueFindings(b)
	if b.Len() == 0 {
		return nil
	}
	if err := tx.SendBatch(ctx, b).Close(); err != nil {
		return fmt.Errorf("ledger: write: %w", err)
	}
	return nil
}

func (a *applier) queueStreams(b *pgx.Batch) {
	var ids, seqs []int64
	var totals []string
	var finals []*int64
	for _, s := range a.streams {
		if !s.dirty {
			continue
		}
		ids = append(ids, s.id)
		seqs = append(seqs, s.lastSeq)
		totals = append(totals, s.lastTotal.String())
		var f *int64
		if s.finalSeq != 0 {
			v := s.finalSeq
			f = &v
		}
		finals = append(finals, f)
	}
	if len(ids) > 0 {
		b.Queue(qUpdateStreams, ids, seqs, totals, finals, a.now)
	}
}

// queueStreamPeriods widens the seq range of each (stream, period) the new
// records were billed in, so that the reads of a customer's period find
// them (ledger_period_records, migration 00020).
func (a *applier) queueStreamPeriods(b *pgx.Batch) {
	seqs := make([]periodSeq, len(a.newRecords))
	for i, nr := range a.newRecords {
		seqs[i] = periodSeq{nr.rec.Stream.Customer, nr.period, nr.streamID, nr.rec.Seq}
	}
	queueSeqRanges(b, seqs)
}

// periodSeq is a seq of a stream written in a customer's period.
type periodSeq struct {
	customer string
	period   time.Time
	streamID int64
	seq      int64
}

// queueSeqRanges widens the stream_periods seq range of every (stream,
// period) of seqs to hold them.
func queueSeqRanges(b *pgx.Batch, seqs []periodSeq) {
	type key struct {
		customer string
		period   int64 // unix micro
		streamID int64
	}
	ranges := map[key][2]int64{}
	for _, s := range seqs {
		k := key{s.customer, s.period.UnixMicro(), s.streamID}
		r, ok := ranges[k]
		if !ok {
			r = [2]int64{s.seq, s.seq}
		}
		ranges[k] = [2]int64{min(r[0], s.seq), max(r[1], s.seq)}
	}
	if len(ranges) == 0 {
		return
	}
	keys := make([]key, 0, len(ranges))
	for k := range ranges {
		keys = append(keys, k)
	}
	slices.SortFunc(keys, func(x, y key) int {
		return cmp.Or(strings.Compare(x.customer, y.customer), cmp.Compare(x.period, y.period), cmp.Compare(x.streamID, y.streamID))
	})
	n := len(keys)
	cust, period := make([]string, n), make([]time.Time, n)
	sid, lo, hi := make([]int64, n), make([]int64, n), make([]int64, n)
	for i, k := range keys {
		cust[i], period[i], sid[i] = k.customer, time.UnixMicro(k.period).UTC(), k.streamID
		lo[i], hi[i] = ranges[k][0], ranges[k][1]
	}
	b.Queue(qUpsertStreamPeriods, pgx.StrictNamedArgs{"customer": cust, "period_start": period, "stream_id": sid,
		"min_seq": lo, "max_seq": hi})
}

func (a *applier) queueGaps(b *pgx.Batch) {
	var delSID, delFrom []int64
	var sid, from, to []int64
	var cust, meter, lower, upper []string
	var upperQ []*string
	var unmoved []string
	var bp, bb []time.Time
	for _, s := range a.streams {
		for _, g := range s.gaps {
			switch {
			case g.gone && g.fromDB:
				delSID, delFrom = append(delSID, s.id), append(delFrom, g.from)
			case !g.gone && !g.fromDB:
				sid, from, to = append(sid, s.id), append(from, g.from), append(to, g.to)
				cust, meter = append(cust, s.key.Customer), append(meter, s.key.Meter)
				lower, upper = append(lower, g.lower.String()), append(upper, g.upper.String())
				upperQ = append(upperQ, nullString(g.upperQuantity))
				unmoved = append(unmoved, g.unmoved.String())
				bp, bb = append(bp, g.billedPeriod), append(bb, g.billedBucket)
			}
		}
	}
	// Delete before insert: a split gap may reuse its from_seq.
	if len(delSID) > 0 {
		b.Queue(qDeleteGaps, delSID, delFrom)
	}
	if len(sid) > 0 {
		b.Queue(qInsertGaps, pgx.StrictNamedArgs{"stream_id": sid, "from_seq": from, "to_seq": to, "customer": cust, "meter": meter,
			"lower_total": lower, "upper_total": upper, "upper_quantity": upperQ, "billed_period": bp, "billed_bucket": bb,
			"opened_at": a.now, "unmoved": unmoved})
	}
}

func queueEntries(b *pgx.Batch, entries []entry, now time.Time, query string) *pgx.QueuedQuery {
	n := len(entries)
	if n == 0 {
		return nil
	}
	ids, ops := make([]uuid.UUID, n), make([]uuid.UUID, n)
	kind, cust, meter, amt := make([]string, n), make([]string, n), make([]string, n), make([]string, n)
	period, bucket, occ := make([]time.Time, n), make([]time.Time, n), make([]time.Time, n)
	prior := make([]*time.Time, n)
	reason, actor := make([]*string, n), make([]*string, n)
	sid, seq := make([]*int64, n), make([]*int64, n)
	hash := make([][]byte, n)
	for i := range entries {
		if entries[i].id == uuid.Nil {
			entries[i].id = uuid.Must(uuid.NewV7())
		}
		e := entries[i]
		ids[i], hash[i] = e.id, e.requestHash
		kind[i], ops[i], cust[i], meter[i], amt[i] = e.kind, e.operationID, e.customer, e.meter, e.amount.String()
		period[i], bucket[i], prior[i], occ[i] = e.period, e.bucket, e.priorPeriod, e.occurredAt
		reason[i], actor[i], sid[i], seq[i] = e.reason, e.actor, e.streamID, e.seq
	}
	return b.Queue(query, pgx.StrictNamedArgs{"id": pguuid.Slice(ids), "kind": kind, "operation_id": pguuid.Slice(ops), "customer": cust,
		"meter": meter, "amount": amt, "period_start": period, "bucket": bucket, "prior_period": prior, "occurred_at": occ,
		"reason": reason, "actor": actor, "stream_id": sid, "seq": seq, "request_hash": hash, "created_at": now})
}

// queueRollups upserts the batch's hourly rollups and, summed by local
// day, its daily rollups.
func (a *applier) queueRollups(b *pgx.Batch) error {
	days := map[rollupKey]decimal.Decimal{}
	for k, q := range a.rollups {
		day, err := Day(a.calendars[k.customer], time.UnixMicro(k.period), time.UnixMicro(k.bucket))
		if err != nil {
			return fmt.Errorf("ledger: customer %q: %w", k.customer, err)
		}
		dk := rollupKey{k.customer, k.meter, k.period, day.UnixMicro()}
		days[dk] = days[dk].Add(q)
	}
	queueSums(b, qUpsertRollups, a.rollups)
	queueSums(b, qUpsertDailyRollups, days)
	return nil
}

// queueSums queues query (an upsert of $1 customer, $2 meter, $3 period,
// $4 bucket or day, $5 quantity) for the non-zero sums, in key order so
// concurrent upserts lock rows in one order.
func queueSums(b *pgx.Batch, query string, sums map[rollupKey]decimal.Decimal) {
	keys := make([]rollupKey, 0, len(sums))
	for k, q := range sums {
		if !q.IsZero() {
			keys = append(keys, k)
		}
	}
	if len(keys) == 0 {
		return
	}
	slices.SortFunc(keys, func(x, y rollupKey) int {
		return cmp.Or(strings.Compare(x.customer, y.customer), strings.Compare(x.meter, y.meter),
			cmp.Compare(x.period, y.period), cmp.Compare(x.bucket, y.bucket))
	})
	n := len(keys)
	cust, meter, qty := make([]string, n), make([]string, n), make([]string, n)
	period, bucket := make([]time.Time, n), make([]time.Time, n)
	for i, k := range keys {
		cust[i], meter[i], qty[i] = k.customer, k.meter, sums[k].String()
		period[i], bucket[i] = time.UnixMicro(k.period).UTC(), time.UnixMicro(k.bucket).UTC()
	}
	b.Queue(query, cust, meter, period, bucket, qty)
}

func (a *applier) queueConflicts(b *pgx.Batch) {
	n := len(a.conflicts)
	if n == 0 {
		return
	}
	ids, ops := make([]uuid.UUID, n), make([]uuid.UUID, n)
	existing := make([]*uuid.UUID, n)
	reason, cust, meter := make([]string, n), make([]string, n), make([]string, n)
	sid, seq := make([]int64, n), make([]int64, n)
	payload, hash := make([][]byte, n), make([][]byte, n)
	for i, c := range a.conflicts {
		ids[i] = uuid.Must(uuid.NewV7())
		reason[i], ops[i], sid[i], seq[i] = c.reason, c.rec.OperationID, c.streamID, c.rec.Seq
		cust[i], meter[i], existing[i] = c.rec.Stream.Customer, c.rec.Stream.Meter, c.existingOp
		payload[i], hash[i] = conflictPayload(c.rec)
	}
	// jsonb[] from text: pass the payloads as strings.
	ps := make([]string, n)
	for i := range payload {
		ps[i] = string(payload[i])
	}
	b.Queue(qInsertConflicts, pgx.StrictNamedArgs{"id": pguuid.Slice(ids), "reason": reason, "operation_id": pguuid.Slice(ops),
		"stream_id": sid, "seq": seq, "customer": cust, "meter": meter, "existing_operation_id": pguuid.NullSlice(existing),
		"payload": ps, "payload_hash": hash, "detected_at": a.now})
}

func (a *applier) queueFindings(b *pgx.Batch) {
	n := len(a.findings)
	if n == 0 {
		return
	}
	ids := make([]uuid.UUID, n)
	kind, cust, meter, detail := make([]string, n), make([]string, n), make([]string, n), make([]string, n)
	sid, seq := make([]*int64, n), make([]*int64, n)
	period := make([]*time.Time, n)
	amt := make([]*string, n)
	for i, f := range a.findings {
		ids[i] = uuid.Must(uuid.NewV7())
		kind[i], cust[i], meter[i], detail[i] = f.kind, f.customer, f.meter, f.detail
		sid[i], seq[i], period[i] = f.streamID, f.seq, f.period
		if f.amount != nil {
			s := f.amount.String()
			amt[i] = &s
		}
	}
	b.Queue(qInsertFindings, pgx.StrictNamedArgs{"id": pguuid.Slice(ids), "kind": kind, "customer": cust, "meter": meter,
		"stream_id": sid, "seq": seq, "period_start": period, "amount": amt, "detail": detail, "created_at": a.now})
}

func nullString(d decimal.NullDecimal) *string {
	if !d.Valid {
		return nil
	}
	s := d.Decimal.String()
	return &s
}
