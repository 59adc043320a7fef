package ingest

import (
	"context"
	"errors"
	"fmt"
	"sort"
	"strconv"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/segmentio/kafka-go"

	"github.com/tally-ledger/tally/ingest/wire"
	"github.com/tally-ledger/tally/ledger"
)

// microBatch is consecutive messages of one partition, committed together.
type microBatch struct {
	from, to int64     // stored next offset before and after the batch
	hwm      int64     // the partition's high watermark as last seen
	through  time.Time // the newest Kafka timestamp of the batch's messages
	msgs     []message
	records  int // records in decoded messages; a message refused whole counts 1 (for sizing only)
	jumps    []jump
	// Offsets that held no message for ingest and are no loss: by cause
	// (skipCompaction, skipCommitMarker, skipAbortMarker).
	skipped map[string]int64
}

// Causes of offsets skipped legitimately.
const (
	skipCompaction   = "compaction"         // a gap above the partition's first offset: compaction removed it
	skipCommitMarker = "transaction_commit" // a transaction's commit marker
	skipAbortMarker  = "transaction_abort"  // a transaction's abort marker
)

func (b *microBatch) skip(cause string, n int64) {
	if b.skipped == nil {
		b.skipped = map[string]int64{}
	}
	b.skipped[cause] += n
}

// message is one Kafka message and what Decode made of it.
type message struct {
	offset   int64
	time     time.Time // the Kafka timestamp
	key      []byte
	value    []byte
	batch    wire.Batch
	index    []int // index[i]: position in the message of batch.Records[i]
	rejected []wire.RecordError
	err      *wire.Error // the whole message was refused
}

// jump is a range of offsets Kafka no longer had when this consumer got there.
type jump struct {
	from, to int64
	detail   string
}

func (b *microBatch) add(m kafka.Message) {
	msg := message{offset: m.Offset, time: m.Time, key: m.Key, value: m.Value}
	wb, index, rejected, err := decode(m.Key, m.Value)
	if err != nil {
		var we *wire.Error
		if !errors.As(err, &we) {
			// Decode documents *wire.Error; anything else is still a refusal
			// of the whole message, never a silent drop.
			we = &wire.Error{Reason: wire.ReasonBadJSON, Detail: err.Error()}
		}
		msg.err = we
		b.records++
	} else {
		msg.batch, msg.index, msg.rejected = wb, index, rejected
		b.records += len(wb.Records) + len(rejected)
	}
	if m.Time.After(b.through) {
		b.through = m.Time
	}
	b.msgs = append(b.msgs, msg)
}

// decode is wire.Decode, except that a decoder panic refuses the message
// (a dead letter) instead of crashing every member that reads it, forever.
func decode(key, value []byte) (b wire.Batch, index []int, rejected []wire.RecordError, err error) {
	defer func() {
		if r := recover(); r != nil {
			b, index, rejected = wire.Batch{}, nil, nil
			err = &wire.Error{Reason: wire.ReasonBadJSON, Detail: fmt.Sprintf("the decoder failed on this message (a bug in Tally; replay it after the fix): %v", r)}
		}
	}()
	return wire.Decode(key, value)
}

// summary is what one committed micro-batch did.
type summary struct {
	messages, messagesRejected int
	records                    int
	outcomes                   [ledger.Rejected + 1]int // by ledger.Kind
	deadLetters                map[string]int           // by reason
}

func kindName(k int) string { return ledger.Kind(k).String() }

// deadLetters collects the rows of one qInsertDeadLetters statement.
type deadLetters struct {
	ids     []uuid.UUID
	offsets []int64
	indexes []*int32
	reasons []string
	fields  []*string
	details []string
	keys    [][]byte
	raws    [][]byte
	// The message header of a refused record (nil for a refused message,
	// whose raw bytes hold it), so the record can be replayed alone.
	producers []*string
	epochs    []*int64
}

func (d *deadLetters) add(offset int64, index *int32, reason, field, detail string, key, raw []byte, hdr *wire.Batch) error {
	id, err := uuid.NewV7()
	if err != nil {
		return err
	}
	var f *string
	if field != "" {
		f = &field
	}
	d.ids = append(d.ids, id)
	d.offsets = append(d.offsets, offset)
	d.indexes = append(d.indexes, index)
	d.reasons = append(d.reasons, reason)
	d.fields = append(d.fields, f)
	d.details = append(d.details, detail)
	d.keys = append(d.keys, key)
	d.raws = append(d.raws, raw)
	var producer *string
	var epoch *int64
	if hdr != nil {
		producer, epoch = &hdr.Producer, &hdr.Epoch
	}
	d.producers = append(d.producers, producer)
	d.epochs = append(d.epochs, epoch)
	return nil
}

// args are the named arguments of qInsertDeadLetters.
func (d *deadLetters) args(topic string, partition int, now time.Time) pgx.NamedArgs {
	return pgx.NamedArgs{"topic": topic, "partition": partition, "created_at": now,
		"ids": d.ids, "offsets": d.offsets, "indexes": d.indexes, "reasons": d.reasons, "fields": d.fields,
		"details": d.details, "keys": d.keys, "raws": d.raws, "producers": d.producers, "epochs": d.epochs}
}

// tryCommit is one attempt at b's transaction. On a shutdown (the member's
// run context ends) the transaction runs to its end (bounded by TxTimeout),
// so the in-flight micro-batch is finished instead of wasted; when only the
// partition's context ends (the member lost it: rebalance, lease claimed by
// another member) it is rolled back at once, so the partition's row is not
// kept locked from its next owner.
func (p *partition) tryCommit(parent context.Context, b *microBatch) (s summary, err error) {
	cfg := p.c.cfg
	ctx, cancel := context.WithTimeout(context.WithoutCancel(parent), cfg.TxTimeout)
	defer cancel()
	if p.runCtx != nil {
		stop := context.AfterFunc(parent, func() {
			if p.runCtx.Err() == nil {
				cancel()
			}
		})
		defer stop()
	}

	tx, err := cfg.Pool.BeginTx(ctx, txOptions)
	if err != nil {
		return s, &connLost{fmt.Errorf("begin: %w", err)}
	}
	defer func() {
		if err != nil {
			// A closed connection means the connection failed, not the
			// data (asked before Rollback hands the connection back).
			if tx.Conn().IsClosed() && !errors.Is(err, errFenced) {
				err = &connLost{err}
			}
			// Rollback errors add nothing: the connection is discarded and
			// the server rolls back on its own.
			_ = tx.Rollback(context.WithoutCancel(ctx))
		}
	}()

	// A member stalled as a whole (stopped, swapped out) mid-transaction
	// would keep the partition's row locked from the member that takes the
	// partition over: Postgres ends a transaction idle for a session
	// timeout (the member has been evicted by then).
	if _, err = tx.Exec(ctx, qSetIdleTimeout, strconv.FormatInt(cfg.SessionTimeout.Milliseconds(), 10)); err != nil {
		return s, fmt.Errorf("set idle timeout: %w", err)
	}

	// Kafka timestamps come from producers' clocks: one ahead of ours must
	// not claim completeness for a time that has not come yet.
	var through *time.Time
	if !b.through.IsZero() {
		t := b.through.UTC()
		if now := cfg.Clock().UTC(); t.After(now) {
			t = now
		}
		through = &t
	}
	// The row lock this takes waits for a transaction of a member that lost
	// the partition; one stalled mid-statement (stopped in the middle of a
	// COPY or a pipelined batch) is not idle, so Postgres would never end
	// it: after a session timeout of waiting, its session is ended.
	breaker := time.AfterFunc(cfg.SessionTimeout, func() { p.endBlockers(tx.Conn().PgConn().PID()) })
	tag, err := tx.Exec(ctx, qAdvanceOffset, cfg.Topic, p.id, b.from, b.to, b.hwm, through, p.gen.MemberID, p.gen.ID)
	breaker.Stop()
	if err != nil {
		return s, fmt.Errorf("advance offset: %w", err)
	}
	if tag.RowsAffected() == 0 {
		return s, errFenced
	}

	// Every valid record of every message, in offset order, in one Apply.
	type ref struct {
		msg, rec int // index in b.msgs, index in the message's valid records
	}
	var recs []ledger.Record
	var refs []ref
	for i := range b.msgs {
		m := &b.msgs[i]
		for j, r := range m.batch.Records {
			recs = append(recs, ledger.Record{
				OperationID: r.OperationID,
				Stream:      ledger.StreamKey{Producer: m.batch.Producer, Epoch: m.batch.Epoch, Customer: r.Customer, Meter: r.Meter},
				Seq:         r.Seq,
				Total:       r.Total,
				Quantity:    r.Quantity,
				OccurredAt:  r.OccurredAt,
				Final:       r.Final,
			})
			refs = append(refs, ref{i, j})
		}
	}
	var outs []ledger.Outcome
	if len(recs) > 0 {
		outs, err = cfg.Ledger.Apply(ctx, tx, recs)
		if err != nil {
			return s, fmt.Errorf("ledger apply: %w", err)
		}
		if len(outs) != len(recs) {
			return s, fmt.Errorf("ledger apply: %d outcomes for %d records", len(outs), len(recs))
		}
	}

	s.deadLetters = map[string]int{}
	var dl deadLetters
	addDL := func(offset int64, index *int32, reason, field, detail string, key, raw []byte, hdr *wire.Batch) error {
		s.deadLetters[reason]++
		return dl.add(offset, index, reason, field, detail, key, raw, hdr)
	}
	for i := range b.msgs {
		m := &b.msgs[i]
		s.messages++
		if m.err != nil {
			s.messagesRejected++
			if err := addDL(m.offset, nil, string(m.err.Reason), m.err.Field, m.err.Detail, m.key, m.value, nil); err != nil {
				return s, err
			}
			continue
		}
		n := len(m.batch.Records) + len(m.rejected)
		s.records += n
		s.outcomes[ledger.Rejected] += len(m.rejected)
		for _, re := range m.rejected {
			idx := int32(re.Index)
			if err := addDL(m.offset, &idx, string(re.Err.Reason), re.Err.Field, re.Err.Detail, m.key, re.Raw, &m.batch); err != nil {
				return s, err
			}
		}
	}
	for k, o := range outs {
		if o.Kind < 1 || int(o.Kind) >= len(s.outcomes) {
			return s, fmt.Errorf("ledger apply: unknown outcome kind %d", o.Kind)
		}
		s.outcomes[o.Kind]++
		if o.Kind != ledger.Rejected {
			continue
		}
		m := &b.msgs[refs[k].msg]
		idx := int32(m.index[refs[k].rec])
		// The record's exact bytes in the message (the header, producer
		// and epoch, is in the message at the same offset).
		raw := m.batch.RecordBytes(m.value, refs[k].rec)
		if raw == nil {
			return s, fmt.Errorf("rejected record %d of the message at offset %d: no bytes", refs[k].rec, m.offset)
		}
		detail := o.Detail
		if detail == "" {
			detail = o.Reason
		}
		if err := addDL(m.offset, &idx, o.Reason, "", detail, m.key, raw, &m.batch); err != nil {
			return s, err
		}
	}

	now := cfg.Clock().UTC()
	batch := &pgx.Batch{}
	if len(dl.ids) > 0 {
		batch.Queue(qInsertDeadLetters, dl.args(cfg.Topic, p.id, now))
	}
	for _, j := range b.jumps {
		id, err := uuid.NewV7()
		if err != nil {
			return s, err
		}
		batch.Queue(qInsertJump, id, cfg.Topic, p.id, j.from, j.to, now, j.detail)
	}
	customers := make([]string, 0, 8)
	seen := map[string]bool{}
	for i := range b.msgs {
		if m := &b.msgs[i]; m.err == nil && !seen[string(m.key)] {
			seen[string(m.key)] = true
			customers = append(customers, string(m.key))
		}
	}
	if len(customers) > 0 {
		sort.Strings(customers)
		batch.Queue(qNoteCustomers, cfg.Topic, p.id, customers, now)
	}
	batch.Queue(qAddCounters, cfg.Topic, p.id, s.messages, s.messagesRejected, s.records,
		s.outcomes[ledger.Applied], s.outcomes[ledger.Duplicate], s.outcomes[ledger.Conflict],
		s.outcomes[ledger.LateFill], s.outcomes[ledger.Rejected])
	if err := tx.SendBatch(ctx, batch).Close(); err != nil {
		return s, fmt.Errorf("dead letters and counters: %w", err)
	}
	if err := tx.Commit(ctx); err != nil {
		return s, fmt.Errorf("commit: %w", err)
	}
	return s, nil
}

// endBlockers ends the sessions that keep backend pid (this member's
// micro-batch transaction) waiting for the partition's row lock: only the
// transaction of a member that lost the partition and stalled holds it that
// long, and ending it only rolls it back (its offset compare-and-set would
// fail anyway).
func (p *partition) endBlockers(pid uint32) {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	var n int
	if err := p.c.cfg.Pool.QueryRow(ctx, qEndBlockers, int32(pid)).Scan(&n); err != nil {
		p.log.Warn("cannot end the session holding the partition's row lock", "err", err)
		return
	}
	if n > 0 {
		p.c.m.anomalies.WithLabelValues("stalled_lock_holder_ended").Inc()
		p.log.Warn("ended the session of a stalled transaction holding the partition's row lock", "sessions", n)
	}
}
