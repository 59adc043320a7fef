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
	"github.com/jackc/pgx/v5/pgconn"
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

// deadLetter is one refused message or record, as stored.
type deadLetter struct {
	offset int64
	index  *int32 // the record's place in the message; nil: the whole message
	reason string
	field  string
	detail string
	key    []byte
	raw    []byte
	// The message header of a refused record (nil for a refused message,
	// whose raw bytes hold it), so the record can be replayed alone.
	header *wire.Batch
}

// deadLetterArgs turns a micro-batch's dead letters into the columns of
// qInsertDeadLetters, each with a new id.
func deadLetterArgs(topic string, partition int, now time.Time, dls []deadLetter) (pgx.StrictNamedArgs, error) {
	n := len(dls)
	ids, offsets, indexes := make([]uuid.UUID, n), make([]int64, n), make([]*int32, n)
	reasons, fields, details := make([]string, n), make([]*string, n), make([]string, n)
	keys, raws := make([][]byte, n), make([][]byte, n)
	producers, epochs := make([]*string, n), make([]*int64, n)
	for i, d := range dls {
		id, err := uuid.NewV7()
		if err != nil {
			return nil, err
		}
		ids[i], offsets[i], indexes[i], reasons[i], details[i], keys[i], raws[i] = id, d.offset, d.index, d.reason, wire.Text(d.detail), d.key, d.raw
		if d.field != "" {
			fields[i] = &d.field
		}
		if d.header != nil {
			producers[i], epochs[i] = &d.header.Producer, &d.header.Epoch
		}
	}
	return pgx.StrictNamedArgs{"topic": topic, "partition": partition, "created_at": now,
		"ids": ids, "offsets": offsets, "indexes": indexes, "reasons": reasons, "fields": fields,
		"details": details, "keys": keys, "raws": raws, "producers": producers, "epochs": epochs}, nil
}

// tryCommit is one attempt at b's transaction: fence the partition, apply
// the batch's records, then write what the batch did (dead letters, offset
// jumps, customers, counters) and commit, all or nothing. On a shutdown
// (the member's run context ends) the transaction runs to its end (bounded
// by TxTimeout), so the in-flight micro-batch is finished instead of
// wasted; when only the partition's context ends (the member released it
// as surplus, or another member claimed it) it is rolled back at once, so
// the partition's rows are not kept locked from its next owner.
//
// BEGIN goes in the fence's pipeline and COMMIT in the counters', so the
// transaction costs no round trip of its own for either (see openTx).
func (p *partition) tryCommit(parent context.Context, b *microBatch) (s summary, err error) {
	ctx, cancel := p.txContext(parent)
	defer cancel()

	conn, err := p.c.cfg.Pool.Acquire(ctx)
	if err != nil {
		return s, &connLost{fmt.Errorf("acquire a connection: %w", err)}
	}
	tx := openTx{conn.Conn()}
	defer func() {
		if err != nil {
			// A closed connection means the connection failed, not the
			// data (asked before the rollback hands the connection back).
			if tx.c.IsClosed() && !errors.Is(err, errFenced) {
				err = &connLost{err}
			}
			// Rollback errors add nothing: a connection left inside a
			// transaction is closed by the pool on release, and the
			// server rolls back on its own.
			_, _ = tx.c.Exec(context.WithoutCancel(ctx), "ROLLBACK")
		}
		conn.Release()
	}()

	if err := p.fence(ctx, tx, b); err != nil {
		return s, err
	}
	recs, refs := ledgerRecords(b)
	outs, err := p.apply(ctx, tx, recs)
	if err != nil {
		return s, err
	}
	s, dls, err := account(b, refs, outs)
	if err != nil {
		return s, err
	}
	if err := p.recordAndCommit(ctx, tx, b, s, dls); err != nil {
		return s, err
	}
	return s, nil
}

// openTx is a micro-batch's transaction: a pooled connection inside the
// transaction block its fence began (READ COMMITTED, what ledger.Apply
// needs). pgx.Tx would send BEGIN and COMMIT as round trips of their own;
// here they travel in the pipelines of the first and the last statements.
type openTx struct{ c *pgx.Conn }

func (t openTx) Exec(ctx context.Context, sql string, args ...any) (pgconn.CommandTag, error) {
	return t.c.Exec(ctx, sql, args...)
}

func (t openTx) Query(ctx context.Context, sql string, args ...any) (pgx.Rows, error) {
	return t.c.Query(ctx, sql, args...)
}

func (t openTx) QueryRow(ctx context.Context, sql string, args ...any) pgx.Row {
	return t.c.QueryRow(ctx, sql, args...)
}

func (t openTx) SendBatch(ctx context.Context, b *pgx.Batch) pgx.BatchResults {
	return t.c.SendBatch(ctx, b)
}

func (t openTx) Conn() *pgx.Conn { return t.c }

// txContext bounds a micro-batch transaction by TxTimeout, and ends it when
// parent ends unless the whole member is shutting down (see tryCommit).
func (p *partition) txContext(parent context.Context) (context.Context, context.CancelFunc) {
	ctx, cancel := context.WithTimeout(context.WithoutCancel(parent), p.c.cfg.TxTimeout)
	if p.runCtx == nil {
		return ctx, cancel
	}
	stop := context.AfterFunc(parent, func() {
		if p.runCtx.Err() == nil {
			cancel()
		}
	})
	return ctx, func() { stop(); cancel() }
}

// fence runs first in the transaction: it bounds how long the transaction
// may idle, then advances the partition's offset if this member still holds
// the partition's lease (share-locked until the commit, so no other member
// can claim it meanwhile) and the offset is the one it expects; otherwise
// it fails with errFenced and nothing of the batch is written. The row lock
// it takes serialises any competing member before the ledger work.
func (p *partition) fence(ctx context.Context, tx openTx, b *microBatch) error {
	cfg := p.c.cfg
	// One round trip: the transaction's BEGIN, the idle bound, then the
	// fence, pipelined.
	batch := &pgx.Batch{}
	batch.Queue(qBegin)
	// A member stalled as a whole (stopped, swapped out) mid-transaction
	// would keep the partition's row locked from the member that takes the
	// partition over: Postgres ends a transaction idle for a session
	// timeout (the member has been evicted by then).
	batch.Queue(qSetIdleTimeout, strconv.FormatInt(cfg.SessionTimeout.Milliseconds(), 10))
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
	args := p.leaseArgs()
	args["from"], args["to"], args["hwm"], args["through"] = b.from, b.to, b.hwm, through
	var advanced int64
	batch.Queue(qAdvanceOffset, args).Exec(func(tag pgconn.CommandTag) error {
		advanced = tag.RowsAffected()
		return nil
	})
	// The row lock the fence takes waits for a transaction of a member that
	// lost the partition; one stalled mid-statement (stopped in the middle
	// of a COPY or a pipelined batch) is not idle, so Postgres would never
	// end it: after a session timeout of waiting, its session is ended.
	breaker := time.AfterFunc(cfg.SessionTimeout, func() { p.c.endBlockers(tx.Conn().PgConn().PID()) })
	err := tx.SendBatch(ctx, batch).Close()
	breaker.Stop()
	if err != nil {
		return fmt.Errorf("idle timeout and advance offset: %w", err)
	}
	if advanced == 0 {
		return errFenced
	}
	return nil
}

// recordRef places a record given to the ledger: index in b.msgs, index in
// that message's valid records.
type recordRef struct{ msg, rec int }

// ledgerRecords turns every valid record of every message, in offset
// order, into a ledger record, with where each came from.
func ledgerRecords(b *microBatch) ([]ledger.Record, []recordRef) {
	n := 0
	for i := range b.msgs {
		n += len(b.msgs[i].batch.Records)
	}
	recs := make([]ledger.Record, 0, n)
	refs := make([]recordRef, 0, n)
	for i := range b.msgs {
		m := &b.msgs[i]
		for j := range m.batch.Records {
			// In UTC whole microseconds, as stored: the ledger need not
			// copy the micro-batch to make them so.
			recs = append(recs, ledger.FromWire(&m.batch, j))
			refs = append(refs, recordRef{i, j})
		}
	}
	return recs, refs
}

// apply applies the batch's records in one ledger Apply.
func (p *partition) apply(ctx context.Context, tx ledger.Tx, recs []ledger.Record) ([]ledger.Outcome, error) {
	if len(recs) == 0 {
		return nil, nil
	}
	outs, err := p.c.cfg.Ledger.Apply(ctx, tx, recs)
	if err != nil {
		return nil, fmt.Errorf("ledger apply: %w", err)
	}
	if len(outs) != len(recs) {
		return nil, fmt.Errorf("ledger apply: %d outcomes for %d records", len(outs), len(recs))
	}
	return outs, nil
}

// account counts what the batch did (messages, records, outcomes) and
// collects its dead letters: messages refused whole, records the decoder
// refused, then records the ledger rejected.
func account(b *microBatch, refs []recordRef, outs []ledger.Outcome) (summary, []deadLetter, error) {
	s := summary{deadLetters: map[string]int{}}
	var dls []deadLetter
	add := func(d deadLetter) {
		s.deadLetters[d.reason]++
		dls = append(dls, d)
	}
	for i := range b.msgs {
		m := &b.msgs[i]
		s.messages++
		if m.err != nil {
			s.messagesRejected++
			add(deadLetter{offset: m.offset, reason: string(m.err.Reason), field: m.err.Field, detail: m.err.Detail,
				key: m.key, raw: m.value})
			continue
		}
		s.records += len(m.batch.Records) + len(m.rejected)
		s.outcomes[ledger.Rejected] += len(m.rejected)
		for _, re := range m.rejected {
			idx := int32(re.Index)
			add(deadLetter{offset: m.offset, index: &idx, reason: string(re.Err.Reason), field: re.Err.Field,
				detail: re.Err.Detail, key: m.key, raw: re.Raw, header: &m.batch})
		}
	}
	for k, o := range outs {
		if o.Kind < 1 || int(o.Kind) >= len(s.outcomes) {
			return s, nil, fmt.Errorf("ledger apply: unknown outcome kind %d", o.Kind)
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
			return s, nil, fmt.Errorf("rejected record %d of the message at offset %d: no bytes", refs[k].rec, m.offset)
		}
		detail := o.Detail
		if detail == "" {
			detail = o.Reason
		}
		var field string
		if f := ledgerReasonField[o.Reason]; f != "" {
			field = fmt.Sprintf("records[%d].%s", idx, f)
		}
		add(deadLetter{offset: m.offset, index: &idx, reason: o.Reason, field: field, detail: detail, key: m.key, raw: raw, header: &m.batch})
	}
	return s, dls, nil
}

// ledgerReasonField is the record field at fault in a record the ledger
// refused, by reason, for the dead letter's field (as the decoder's name
// theirs); a reason not listed names no one field.
var ledgerReasonField = map[string]string{
	ledger.ReasonFutureTimestamp: "occurred_at",
	ledger.ReasonTotalDecreased:  "total",
	ledger.ReasonKindMismatch:    "meter",
}

// recordAndCommit writes, in one pipelined round trip, the batch's dead
// letters, offset jumps, the partition its customers arrive on and its
// counters, and commits. A statement that fails skips the rest of the
// pipeline, COMMIT included, and the transaction is rolled back. A commit
// whose answer is lost may have committed: attempt reads the stored offset
// to know.
func (p *partition) recordAndCommit(ctx context.Context, tx openTx, b *microBatch, s summary, dls []deadLetter) error {
	cfg := p.c.cfg
	now := cfg.Clock().UTC()
	batch := &pgx.Batch{}
	if len(dls) > 0 {
		args, err := deadLetterArgs(cfg.Topic, p.id, now, dls)
		if err != nil {
			return err
		}
		batch.Queue(qInsertDeadLetters, args)
	}
	for _, j := range b.jumps {
		id, err := uuid.NewV7()
		if err != nil {
			return err
		}
		batch.Queue(qInsertJump, pgx.StrictNamedArgs{"id": id, "topic": cfg.Topic, "partition": p.id, "from": j.from, "to": j.to,
			"detected_at": now, "detail": j.detail})
	}
	var moved []string
	if customers := b.customers(); len(customers) > 0 {
		batch.Queue(qNoteCustomers, cfg.Topic, p.id, customers, now).Query(func(rows pgx.Rows) error {
			var c string
			var wasThere bool
			_, err := pgx.ForEachRow(rows, []any{&c, &wasThere}, func() error {
				if wasThere {
					moved = append(moved, c)
				}
				return nil
			})
			return err
		})
	}
	batch.Queue(qAddCounters, pgx.StrictNamedArgs{"topic": cfg.Topic, "partition": p.id,
		"messages": s.messages, "messages_rejected": s.messagesRejected, "records": s.records,
		"applied": s.outcomes[ledger.Applied], "duplicate": s.outcomes[ledger.Duplicate], "conflict": s.outcomes[ledger.Conflict],
		"late_fill": s.outcomes[ledger.LateFill], "rejected": s.outcomes[ledger.Rejected]})
	batch.Queue(qCommit).Exec(func(tag pgconn.CommandTag) error {
		if tag.String() == "ROLLBACK" { // the transaction had failed
			return pgx.ErrTxCommitRollback
		}
		return nil
	})
	if err := tx.SendBatch(ctx, batch).Close(); err != nil {
		return fmt.Errorf("dead letters, counters and commit: %w", err)
	}
	p.noteMoved(moved)
	return nil
}

// noteMoved counts the customers that arrived on this partition after
// another (committed), and says so at most once a minute per partition:
// the ledger stays exact, but a customer's usage as_of and quota lag follow
// whichever partition was seen last.
func (p *partition) noteMoved(moved []string) {
	if len(moved) == 0 {
		return
	}
	p.c.m.moves.Add(float64(len(moved)))
	if now := time.Now(); now.Sub(p.movedLogged) >= time.Minute {
		p.movedLogged = now
		p.log.Warn("customers arrived on this partition after another: a producer's partitioner is not murmur2 (the SDK's), or the topic was repartitioned; usage as_of and quota lag follow the partition seen last",
			"customers", len(moved), "first", moved[0])
	}
}

// customers are the keys of the batch's decoded messages, sorted, once each.
func (b *microBatch) customers() []string {
	out := make([]string, 0, 8)
	seen := map[string]bool{}
	for i := range b.msgs {
		if m := &b.msgs[i]; m.err == nil && !seen[string(m.key)] {
			seen[string(m.key)] = true
			out = append(out, string(m.key))
		}
	}
	sort.Strings(out)
	return out
}

// endBlockers ends the sessions that keep backend pid (a micro-batch
// transaction's fence, or a claim) waiting for a partition's row lock: only
// the transaction of a member that lost the partition and stalled holds it
// that long, and ending it only rolls it back (its fence would fail anyway).
func (c *Consumer) endBlockers(pid uint32) {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	var n int
	if err := c.cfg.Pool.QueryRow(ctx, qEndBlockers, int32(pid)).Scan(&n); err != nil {
		c.log.Warn("cannot end the session holding the partition's row lock", "err", err)
		return
	}
	if n > 0 {
		c.m.anomalies.WithLabelValues("stalled_lock_holder_ended").Inc()
		c.log.Warn("ended the session of a stalled transaction holding the partition's row lock", "sessions", n)
	}
}
