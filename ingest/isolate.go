package ingest

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"strings"
	"syscall"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/shopspring/decimal"

	"github.com/tally-ledger/tally/ingest/wire"
	"github.com/tally-ledger/tally/internal/pause"
	"github.com/tally-ledger/tally/ledger"
)

// ReasonStoreRefused is the dead-letter reason of a message the database
// refused: its micro-batch failed the same way on retry with an error that
// is not a connection, timeout, serialization or deadlock failure, and the
// message failed alone once the batch was bisected. The detail holds the
// SQLSTATE and the database's message. Replay it after fixing the cause.
const ReasonStoreRefused = "store_refused"

// StallAfter is how long a partition retries a failing micro-batch before
// it is reported stalled (/v1/ingest/status, /readyz, the
// tally_ingest_partition_stalled metric and an ERROR log line).
const StallAfter = time.Minute

// refusal is a micro-batch failure that retrying will not cure.
type refusal struct{ err error }

func (r *refusal) Error() string { return r.err.Error() }
func (r *refusal) Unwrap() error { return r.err }

// connLost marks a failure after which the transaction's connection was
// closed: whatever the error says, the connection (not the data) failed.
type connLost struct{ err error }

func (c *connLost) Error() string { return c.err.Error() }
func (c *connLost) Unwrap() error { return c.err }

// retryable reports whether err is a failure that retrying the same
// transaction can cure: connection loss, timeouts, serialization failures,
// deadlocks, lock timeouts, a server shutting down or out of resources.
// Anything else (a constraint, an encoding error, a raised exception, a bug)
// fails the same way again.
func retryable(err error) bool {
	var pe *pgconn.PgError
	if errors.As(err, &pe) {
		switch pe.Code {
		case "40001", "40P01", "40003", // serialization failure, deadlock, completion unknown
			"55P03", "55006", // lock not available, object in use
			"25P03", // idle-in-transaction timeout
			"25006": // read-only transaction: a standby, during a failover
			return true
		}
		switch pe.Code[:min(2, len(pe.Code))] {
		case "08", // connection exception
			"53",       // insufficient resources: disk full, out of memory, too many connections
			"57",       // operator intervention: admin or crash shutdown, statement timeout, cannot connect now
			"58",       // system error (I/O)
			"42",       // undefined table or column, insufficient privilege: the schema, not the data
			"3D", "3F": // invalid database or schema name
			return true
		}
		return false
	}
	var cl *connLost
	var ce *pgconn.ConnectError
	var ne net.Error
	return errors.As(err, &cl) || errors.As(err, &ce) || errors.As(err, &ne) ||
		errors.Is(err, context.DeadlineExceeded) || errors.Is(err, context.Canceled) ||
		errors.Is(err, io.EOF) || errors.Is(err, io.ErrUnexpectedEOF) || errors.Is(err, net.ErrClosed) ||
		errors.Is(err, syscall.ECONNRESET) || errors.Is(err, syscall.ECONNREFUSED) || errors.Is(err, syscall.EPIPE) ||
		pgconn.Timeout(err) || pgconn.SafeToRetry(err) || strings.Contains(err.Error(), "closed pool")
}

// isolate commits b, which the database refused (r), by bisection: each
// half is committed on its own, in offset order, and a half that is refused
// again is split again, until the message refused alone is found; that
// message becomes a store_refused dead letter in a transaction of its own.
// Every other message is applied exactly once and the stored offset moves
// through b's range without a gap. A batch holding a single bad message
// among n costs about 2·log2(n) extra transactions, once.
func (p *partition) isolate(ctx context.Context, b *microBatch, r *refusal) (int64, error) {
	switch len(b.msgs) {
	case 0:
		// Only offset jumps: no message to blame. Retry (the partition is
		// reported stalled after StallAfter).
		return b.to, p.attempt(ctx, b, -1)
	case 1:
		for round := 0; ; round++ {
			cerr := p.canary(ctx)
			if cerr == nil {
				// The database takes a harmless record. The message is
				// blamed only if it is refused again after that: a fault
				// cured between its refusal and the canary (a trigger
				// dropped, a privilege granted) must not cost it.
				err := p.attempt(ctx, b, 1)
				if !errors.As(err, &r) {
					return b.to, err // committed (nil), fenced, or ctx ended
				}
				break
			}
			// The database refuses a harmless record too: the fault is
			// not this message's (a broken schema, revoked privileges,
			// or Postgres is unreachable). Dead-lettering would refuse
			// every message one by one; retry instead, visibly, until
			// the message commits or the canary passes.
			p.log.Error("the database refuses any record, not only this message's: retrying until it is fixed (nothing is dead-lettered)",
				"offset", b.msgs[0].offset, "err", r.err, "canary_err", cerr)
			if !pause.For(ctx, p.c.backoff(round)) {
				return 0, ctx.Err()
			}
			err := p.attempt(ctx, b, 1)
			if !errors.As(err, &r) {
				return b.to, err // committed (nil), fenced, or ctx ended
			}
		}
		rb := b.refuse(r.err)
		m := &rb.msgs[0]
		p.log.Error("the database refuses this message: stored as a store_refused dead letter, the partition moves on; "+
			"fix the cause, then replay the dead letter", "offset", m.offset, "err", r.err)
		// The dead letter holds only bytes and sanitized text; if even it
		// is refused, retry (visible as a stall) rather than lose it.
		return rb.to, p.attempt(ctx, rb, -1)
	}
	p.log.Warn("micro-batch refused by the database; bisecting it to find the message refused alone",
		"from", b.from, "to", b.to, "messages", len(b.msgs), "err", r.err)
	for _, half := range b.split() {
		err := p.attempt(ctx, half, 1)
		var hr *refusal
		if errors.As(err, &hr) {
			_, err = p.isolate(ctx, half, hr)
		}
		if err != nil {
			return 0, err
		}
	}
	return b.to, nil
}

// canary applies a harmless record in a transaction that is always rolled
// back: it tells a message the database refuses from a database that
// refuses everything.
func (p *partition) canary(parent context.Context) error {
	cfg := p.c.cfg
	ctx, cancel := context.WithTimeout(context.WithoutCancel(parent), cfg.TxTimeout)
	defer cancel()
	tx, err := cfg.Pool.BeginTx(ctx, txOptions)
	if err != nil {
		return err
	}
	defer func() { _ = tx.Rollback(context.WithoutCancel(ctx)) }()
	id, err := uuid.NewV7()
	if err != nil {
		return err
	}
	_, err = cfg.Ledger.Apply(ctx, tx, []ledger.Record{{OperationID: id,
		Stream: ledger.StreamKey{Producer: "tally-canary", Epoch: 1, Customer: "tally-canary", Meter: "tally-canary"},
		Seq:    1, Total: decimal.Zero, OccurredAt: cfg.Clock().UTC().Add(-time.Minute)}})
	return err
}

// split returns b's two halves by message: consecutive ranges of offsets,
// each with its own offset jumps and newest timestamp.
func (b *microBatch) split() [2]*microBatch {
	mid := len(b.msgs) / 2
	cut := b.msgs[mid].offset // the right half starts at its first message, or at the jump before it
	for _, j := range b.jumps {
		if j.to == cut {
			cut = j.from
		}
	}
	var h [2]*microBatch
	for i, msgs := range [2][]message{b.msgs[:mid], b.msgs[mid:]} {
		s := &microBatch{from: b.from, to: cut, hwm: b.hwm, msgs: msgs}
		if i == 1 {
			s.from, s.to = cut, b.to
		}
		for _, j := range b.jumps {
			if j.from >= s.from && j.to <= s.to {
				s.jumps = append(s.jumps, j)
			}
		}
		for _, m := range msgs {
			s.records += m.records()
			if m.time.After(s.through) {
				s.through = m.time
			}
		}
		h[i] = s
	}
	return h
}

// refuse returns b (one message) with that message refused whole as
// store_refused, its records not applied.
func (b *microBatch) refuse(err error) *microBatch {
	m := b.msgs[0]
	rb := *b
	rb.msgs = []message{{offset: m.offset, key: m.key, value: m.value, time: m.time,
		err: &wire.Error{Reason: wire.Reason(ReasonStoreRefused), Detail: refusedDetail(err)}}}
	rb.records = 1
	return &rb
}

func (m *message) records() int {
	if m.err != nil {
		return 1
	}
	return len(m.batch.Records) + len(m.rejected)
}

// refusedDetail describes the database's refusal as valid UTF-8 text without
// NUL bytes (a text column refuses those: the dead letter must not fail the
// way its message did).
func refusedDetail(err error) string {
	var d string
	var pe *pgconn.PgError
	if errors.As(err, &pe) {
		d = fmt.Sprintf("the database refused this message alone (SQLSTATE %s: %s", pe.Code, pe.Message)
		if pe.Detail != "" {
			d += "; " + pe.Detail
		}
		if pe.ConstraintName != "" {
			d += "; constraint " + pe.ConstraintName
		}
		d += ")"
	} else {
		d = "the database refused this message alone (" + err.Error() + ")"
	}
	d += "; fix the cause, then replay this dead letter"
	return strings.ReplaceAll(strings.ToValidUTF8(d, "\uFFFD"), "\x00", `\u0000`)
}

// stall is a partition's run of failed attempts.
type stall struct {
	since    time.Time // first failure of the run; zero when the last attempt committed
	reported bool      // the stalled ERROR line was written and the gauge set
}

// retrying records a failed attempt: a log line, the stall gauge and log
// line once the run passes StallAfter, and (best effort, outside the failed
// transaction) the partition's retrying_since and last_error for the API.
func (p *partition) retrying(ctx context.Context, b *microBatch, err error, attempt int) {
	now := p.c.cfg.Clock()
	if p.stall.since.IsZero() {
		p.stall.since = now
	}
	level := slog.LevelWarn
	if attempt >= 5 {
		level = slog.LevelError // not a blip any more
	}
	p.log.Log(ctx, level, "micro-batch transaction failed; rolled back, will retry the same batch",
		"err", err, "attempt", attempt+1, "from", b.from, "to", b.to, "retrying_for", now.Sub(p.stall.since).Round(time.Millisecond))
	if !p.stall.reported && now.Sub(p.stall.since) >= p.c.cfg.StallAfter {
		p.stall.reported = true
		p.c.m.stalled.WithLabelValues(p.label).Set(1)
		p.assign.setStalled(p.id, p.stall.since)
		p.log.Error("partition stalled: no usage on it has been applied for over a minute, so its customers' usage, as_of "+
			"and quota decisions are frozen. A connection, timeout or resource error means Postgres is unreachable, "+
			"overloaded or out of disk or connections: fix that and ingest resumes by itself, losing nothing. "+
			"Any other error that persists is a bug in Tally: report it with this line",
			"since", p.stall.since.UTC(), "err", err, "from", b.from, "to", b.to)
	}
	wctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 2*time.Second)
	defer cancel()
	msg := strings.ReplaceAll(strings.ToValidUTF8(err.Error(), "\uFFFD"), "\x00", `\u0000`)
	args := p.leaseArgs()
	// retrying_since is read against Postgres's clock (a partition is
	// stalled StallAfter after it by now()), so it is written by that
	// clock: the run's length, not this host's time.
	args["from"], args["retrying_us"], args["error"] = b.from, now.Sub(p.stall.since).Microseconds(), msg
	if _, werr := p.c.cfg.Pool.Exec(wctx, qNoteRetrying, args); werr != nil {
		p.log.Debug("cannot record the retrying state", "err", werr)
	}
}

// resumed ends a run of failed attempts (the batch committed: the
// transaction cleared retrying_since and last_error).
func (p *partition) resumed() {
	if p.stall.since.IsZero() {
		return
	}
	if p.stall.reported {
		p.c.m.stalled.WithLabelValues(p.label).Set(0)
		p.assign.setStalled(p.id, time.Time{})
		p.log.Warn("partition resumed after a stall", "stalled_for", time.Since(p.stall.since).Round(time.Second))
	}
	p.stall = stall{}
}
