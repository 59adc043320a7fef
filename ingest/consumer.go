package ingest

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"strconv"
	"sync"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/segmentio/kafka-go"

	"github.com/tally-ledger/tally/internal/pause"
)

// Consumer is one ingest member. Members of one Group share the topic's
// partitions through leases in Postgres (see lease.go); each partition it
// holds is read with a kafka-go partition reader from the offset stored in
// Postgres. No Kafka consumer group decides anything.
//
// kafka-go traps this design avoids (see its issues):
//   - A Reader with a GroupID rebalances every partition on every join and
//     death (no cooperative rebalancing or static membership), may hand out
//     messages fetched before a rebalance (#1398), and its committed
//     offsets are not monotonic (#439). Only partition readers are used.
//   - A partition Reader silently skips to the first available offset when
//     the one asked for was deleted (at start and on OffsetOutOfRange while
//     reading), and retries forever on OffsetOutOfRange unless
//     OffsetOutOfRangeError is set (#891, #917). OffsetOutOfRangeError is
//     set, and every message's offset is checked against the expected one:
//     a gap is recorded as an offset jump, never skipped silently.
type Consumer struct {
	cfg       Config
	log       *slog.Logger
	m         *metrics
	transport *kafka.Transport
	client    *kafka.Client

	runCtx context.Context // Run's context, while it runs
	assign *assigner

	commitMu sync.Mutex // serialises dashboard commits to Kafka
}

// NewConsumer validates cfg and returns a Consumer. It registers the
// consumer's metrics with cfg.Registry.
func NewConsumer(cfg Config) (*Consumer, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	cfg = cfg.withDefaults()
	m, err := newMetrics(cfg.Registry, cfg.Topic)
	if err != nil {
		return nil, fmt.Errorf("ingest: register metrics: %w", err)
	}
	tr := &kafka.Transport{
		Dial:     cfg.Dialer.DialFunc,
		SASL:     cfg.Dialer.SASLMechanism,
		TLS:      cfg.Dialer.TLS,
		ClientID: cfg.Dialer.ClientID,
	}
	c := &Consumer{
		cfg:       cfg,
		log:       cfg.Logger.With("topic", cfg.Topic, "group", cfg.Group),
		m:         m,
		transport: tr,
		client:    &kafka.Client{Addr: kafka.TCP(cfg.Brokers...), Transport: tr, Timeout: 10 * time.Second},
	}
	c.assign = newAssigner(c)
	return c, nil
}

// Run registers the member and consumes the partitions it leases until ctx
// is cancelled, then finishes or rolls back the in-flight transactions,
// releases its leases and returns nil. Kafka and Postgres errors are
// retried, never returned. A Consumer runs once.
func (c *Consumer) Run(ctx context.Context) error {
	defer c.transport.CloseIdleConnections()
	a := c.assign
	a.mu.Lock()
	c.runCtx = ctx // NotReady reads it
	a.mu.Unlock()
	c.log.Info("ingest started", "brokers", c.cfg.Brokers, "process", processName)
	// The lease is renewed until the partitions have finished: an in-flight
	// transaction that finishes on shutdown still holds its partition.
	hctx, stopHeartbeat := context.WithCancel(context.WithoutCancel(ctx))
	hdone := make(chan struct{})
	go func() {
		defer close(hdone)
		a.heartbeatLoop(hctx)
	}()
	a.balanceLoop(ctx)
	a.mu.Lock()
	var dones []chan struct{}
	for _, r := range a.running {
		dones = append(dones, r.done)
	}
	a.mu.Unlock()
	for _, d := range dones {
		<-d // ctx ended: each finishes its transaction (bounded by TxTimeout) and returns
	}
	stopHeartbeat()
	<-hdone
	a.leave()
	c.m.owned.Set(0)
	c.log.Info("ingest stopped; leases released")
	return nil
}

// errFenced: the partition's lease or stored next offset was not the one
// expected; another member holds the partition or wrote it.
var errFenced = errors.New("partition lease or stored offset changed under this member (fenced)")

// partition consumes one leased partition for one claim.
type partition struct {
	c        *Consumer
	lease    lease
	id       int
	label    string
	log      *slog.Logger
	aheadLog bool // logged "stored offset ahead of the partition's end" already
	// movedLogged is when noteMoved last logged customers arriving from
	// another partition.
	movedLogged time.Time

	lastKafkaCommit time.Time
	stall           stall

	// runCtx is Consumer.Run's context: when the partition's context ends
	// while runCtx does not, the member lost or released the partition and
	// an in-flight transaction is rolled back at once instead of finished.
	runCtx context.Context
	assign *assigner
}

// leaseArgs are the named arguments of the lease fence (qLeaseHeld).
func (p *partition) leaseArgs() pgx.StrictNamedArgs {
	return pgx.StrictNamedArgs{"topic": p.c.cfg.Topic, "partition": p.id, "group": p.c.cfg.Group,
		"member": p.lease.member, "epoch": p.lease.epoch}
}

// runPartition consumes partition id under l until ctx ends or the lease is
// found gone.
func (c *Consumer) runPartition(ctx context.Context, a *assigner, id int, l lease) {
	p := &partition{c: c, lease: l, id: id, label: strconv.Itoa(id),
		log: c.log.With("partition", id, "epoch", l.epoch), runCtx: c.runCtx, assign: a}
	c.m.stalled.WithLabelValues(p.label).Set(0)
	c.m.jumps.WithLabelValues(p.label) // 0 until a jump
	p.run(ctx)
}

func (p *partition) run(ctx context.Context) {
	next, ok := p.load(ctx)
	if !ok {
		return
	}
	for attempt := 0; ctx.Err() == nil; attempt++ {
		next = p.checkStart(ctx, next)
		if ctx.Err() != nil {
			return
		}
		r := p.newReader(next)
		err := p.consume(ctx, r, &next)
		r.Close()
		if ctx.Err() != nil {
			return
		}
		switch {
		case err == nil:
			// The position moved past deleted messages: restart the reader
			// there.
			attempt = -1
		case errors.Is(err, errFenced):
			// Either this member lost the partition (another member claimed
			// it: stop reading and applying it) or the stored offset moved
			// under the lease (continue from what is stored).
			if !p.c.holds(ctx, p.id, p.lease) {
				p.c.m.leaseLost.Inc()
				p.log.Warn("partition lease lost: stopped reading and applying it")
				return
			}
			p.log.Warn("stored offset moved under this member's lease; re-reading it", "expected", next)
			if !pause.For(ctx, p.c.backoff(0)) {
				return
			}
			if next, ok = p.load(ctx); !ok {
				return
			}
			attempt = 0
		case errors.Is(err, kafka.OffsetOutOfRange):
			p.log.Warn("offset out of range; checking the partition's offsets", "offset", next)
			if !pause.For(ctx, p.c.backoff(attempt)) {
				return
			}
		default:
			p.log.Error("partition reader stopped; restarting it", "err", err)
			if !pause.For(ctx, p.c.backoff(attempt)) {
				return
			}
		}
	}
}

// load returns the stored next offset, creating the partition's row on
// first sight. It retries until it succeeds or ctx ends.
func (p *partition) load(ctx context.Context) (int64, bool) {
	for attempt := 0; ; attempt++ {
		next, err := p.readNext(ctx, true)
		if err == nil {
			return next, true
		}
		if ctx.Err() != nil {
			return 0, false
		}
		p.c.m.retries.WithLabelValues("postgres").Inc()
		p.log.Warn("cannot read the stored offset; retrying", "err", err, "attempt", attempt+1)
		if !pause.For(ctx, p.c.backoff(attempt)) {
			return 0, false
		}
	}
}

func (p *partition) readNext(ctx context.Context, ensure bool) (int64, error) {
	ctx, cancel := context.WithTimeout(ctx, p.c.cfg.TxTimeout)
	defer cancel()
	var next int64
	err := p.c.cfg.Pool.QueryRow(ctx, qSelectNextOffset, p.c.cfg.Topic, p.id).Scan(&next)
	if ensure && errors.Is(err, pgx.ErrNoRows) {
		// Insert only when missing: an INSERT ... ON CONFLICT on an existing
		// row waits for a transaction updating it, which may be a stalled
		// member's; a plain read never waits.
		if _, err := p.c.cfg.Pool.Exec(ctx, qEnsurePartition, p.c.cfg.Topic, p.id); err != nil {
			return 0, err
		}
		err = p.c.cfg.Pool.QueryRow(ctx, qSelectNextOffset, p.c.cfg.Topic, p.id).Scan(&next)
	}
	return next, err
}

// offsets returns the partition's first available offset and high
// watermark from the partition leader.
func (p *partition) offsets(ctx context.Context) (first, last int64, err error) {
	ctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	res, err := p.c.client.ListOffsets(ctx, &kafka.ListOffsetsRequest{
		Topics: map[string][]kafka.OffsetRequest{p.c.cfg.Topic: {kafka.FirstOffsetOf(p.id), kafka.LastOffsetOf(p.id)}},
	})
	if err != nil {
		return 0, 0, err
	}
	for _, po := range res.Topics[p.c.cfg.Topic] {
		if po.Partition == p.id {
			if po.Error != nil {
				return 0, 0, po.Error
			}
			return po.FirstOffset, po.LastOffset, nil
		}
	}
	return 0, 0, fmt.Errorf("list offsets: no answer for partition %d", p.id)
}

// checkStart compares the stored next offset with what the partition still
// has: an offset below the first available one is an offset jump (recorded,
// then consumption continues from the first available offset); one above the
// end is an anomaly an operator must look at (the topic was recreated or the
// broker lost data) and consumption waits there.
func (p *partition) checkStart(ctx context.Context, next int64) int64 {
	first, last, err := p.offsets(ctx)
	if err != nil {
		p.log.Warn("cannot read the partition's offsets (will read from the stored offset)", "err", err)
		return next
	}
	p.c.m.position(p.id, last-next, time.Time{})
	if next < first {
		detail := fmt.Sprintf("stored next offset %d is below the partition's first available offset %d: "+
			"%d messages were deleted (retention) before they were consumed", next, first, first-next)
		b := &microBatch{from: next, to: first, hwm: last, jumps: []jump{{from: next, to: first, detail: detail}}}
		if to, err := p.commit(ctx, b); err == nil {
			return to
		} else if errors.Is(err, errFenced) {
			if n, ok := p.load(ctx); ok {
				return n
			}
		}
		return next
	}
	p.checkAhead(next, last)
	return next
}

func (p *partition) checkAhead(next, last int64) {
	if next > last {
		p.c.m.anomalies.WithLabelValues("offset_ahead_of_end").Inc()
		if !p.aheadLog {
			p.log.Error("stored next offset is past the partition's end: the topic was recreated or the broker lost messages; "+
				"waiting for the partition to reach it (nothing is skipped)", "next_offset", next, "high_watermark", last)
			p.aheadLog = true
		}
	}
}

func (p *partition) newReader(next int64) *kafka.Reader {
	cfg := p.c.cfg
	r := kafka.NewReader(kafka.ReaderConfig{
		Brokers:               cfg.Brokers,
		Topic:                 cfg.Topic,
		Partition:             p.id,
		Dialer:                cfg.Dialer,
		MinBytes:              1,
		MaxBytes:              8 << 20,
		MaxWait:               cfg.FetchMaxWait,
		QueueCapacity:         cfg.QueueCapacity,
		ReadBackoffMin:        100 * time.Millisecond,
		ReadBackoffMax:        time.Second,
		OffsetOutOfRangeError: true,
		// Never read past the last stable offset: a transaction still open
		// is not read until it is decided.
		IsolationLevel: kafka.ReadCommitted,
		Logger:         kafkaLogger(p.log, slog.LevelDebug),
		ErrorLogger:    kafkaLogger(p.log, slog.LevelDebug),
	})
	// SetOffset on a fresh partition reader only records the offset; it
	// cannot fail before Close.
	_ = r.SetOffset(next)
	return r
}

// consume reads micro-batches and commits them until ctx ends or an error
// needs a new reader. *next is the stored next offset.
func (p *partition) consume(ctx context.Context, r *kafka.Reader, next *int64) error {
	for {
		b, ferr := p.collect(ctx, r, *next)
		if ctx.Err() != nil {
			// Shutting down: nothing of b is committed; the next owner
			// re-reads it from the stored offset.
			return ctx.Err()
		}
		if len(b.msgs) > 0 || b.to != b.from {
			to, err := p.commit(ctx, b)
			if err != nil {
				return err
			}
			*next = to
		} else if ferr == nil {
			n, err := p.idle(ctx, *next)
			if err != nil {
				return err
			}
			if n != *next {
				// Jumped forward past deleted messages: the reader must
				// restart there.
				*next = n
				return nil
			}
		}
		if ferr != nil {
			return ferr
		}
	}
}

// collect gathers one micro-batch: it waits up to PositionInterval for a first
// message, then up to MaxBatchWait (or until MaxBatchRecords) for more.
// A batch with no messages and a nil error means the partition was idle.
func (p *partition) collect(ctx context.Context, r *kafka.Reader, next int64) (*microBatch, error) {
	cfg := p.c.cfg
	b := &microBatch{from: next, to: next}
	wait := cfg.PositionInterval
	var deadline time.Time
	for b.records < cfg.MaxBatchRecords {
		var fctx context.Context
		var cancel context.CancelFunc
		if deadline.IsZero() {
			fctx, cancel = context.WithTimeout(ctx, wait)
		} else {
			fctx, cancel = context.WithDeadline(ctx, deadline)
		}
		m, err := r.FetchMessage(fctx)
		cancel()
		if err != nil {
			if ctx.Err() == nil && errors.Is(err, context.DeadlineExceeded) {
				p.classifyGaps(ctx, b)
				return b, nil
			}
			p.classifyGaps(ctx, b)
			return b, err
		}
		if deadline.IsZero() {
			deadline = time.Now().Add(cfg.MaxBatchWait)
		}
		if m.Key == nil || m.Value == nil {
			p.exactNulls(ctx, &m)
		}
		p.add(b, m)
	}
	p.classifyGaps(ctx, b)
	return b, nil
}

// exactNulls tells a null key or value from an empty one: kafka-go's
// Reader returns nil for both, but a dead letter keeps what arrived (a
// tombstone's value is NULL, an empty value is empty). It re-reads the one
// message through the protocol-level Fetch, which keeps the difference;
// tombstones and empty values are rare, so the hot path never pays for it.
// If Kafka cannot answer within a few tries, nil stays nil (stored as NULL)
// and a warning says so.
func (p *partition) exactNulls(ctx context.Context, m *kafka.Message) {
	var err error
	for attempt := 0; attempt < 5 && ctx.Err() == nil; attempt++ {
		var key, value bool // null?
		if key, value, err = p.fetchNulls(ctx, m.Offset); err == nil {
			if m.Key == nil && !key {
				m.Key = []byte{}
			}
			if m.Value == nil && !value {
				m.Value = []byte{}
			}
			return
		}
		if !pause.For(ctx, p.c.backoff(attempt)) {
			return
		}
	}
	p.log.Warn("cannot tell a null key or value from an empty one; storing it as null", "offset", m.Offset, "err", err)
}

// fetchNulls reports whether the key and the value of the message at offset
// are null.
func (p *partition) fetchNulls(ctx context.Context, offset int64) (key, value bool, err error) {
	ctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	res, err := p.c.client.Fetch(ctx, &kafka.FetchRequest{Topic: p.c.cfg.Topic, Partition: p.id, Offset: offset,
		MinBytes: 1, MaxBytes: 2 << 20, MaxWait: time.Second, IsolationLevel: kafka.ReadCommitted})
	if err != nil {
		return false, false, err
	}
	if res.Error != nil {
		return false, false, res.Error
	}
	if res.Records == nil {
		return false, false, fmt.Errorf("fetch offset %d: no records", offset)
	}
	for {
		r, err := res.Records.ReadRecord()
		if err != nil {
			return false, false, fmt.Errorf("fetch offset %d: %w", offset, err)
		}
		if r.Offset == offset {
			return r.Key == nil, r.Value == nil, nil
		}
	}
}

// add appends m to b, checking its offset.
func (p *partition) add(b *microBatch, m kafka.Message) {
	switch {
	case m.Offset < b.to:
		// A partition reader never goes back; if it ever did, the message
		// is already applied and counted.
		p.c.m.anomalies.WithLabelValues("offset_backwards").Inc()
		p.log.Error("reader returned an offset below the expected one; ignoring the message (already consumed)",
			"offset", m.Offset, "expected", b.to)
		return
	case m.Offset > b.to:
		detail := fmt.Sprintf("expected offset %d, the partition returned %d: %d messages were deleted (retention) "+
			"or are missing before they were consumed", b.to, m.Offset, m.Offset-b.to)
		b.jumps = append(b.jumps, jump{from: b.to, to: m.Offset, detail: detail})
	}
	if cause := controlRecord(m); cause != "" {
		// kafka-go's Reader hands transaction markers over as messages.
		b.skip(cause, 1)
	} else {
		b.add(m)
	}
	b.to = m.Offset + 1
	if m.HighWaterMark > b.hwm {
		b.hwm = m.HighWaterMark
	}
}

// idle runs when no message came for PositionInterval: if the partition is
// caught up, the applied-through time advances to just before the check; if
// messages were deleted under the stored offset, the jump is recorded.
func (p *partition) idle(ctx context.Context, next int64) (int64, error) {
	t0 := p.c.cfg.Clock()
	first, last, err := p.offsets(ctx)
	if err != nil {
		p.log.Debug("idle: cannot read the partition's offsets", "err", err)
		return next, nil
	}
	switch {
	case next < first:
		return p.checkStart(ctx, next), nil
	case next > last:
		p.checkAhead(next, last)
		return next, nil
	case next < last:
		// Messages exist but the reader has not delivered them yet.
		p.c.m.position(p.id, last-next, time.Time{})
		return next, nil
	}
	ctx, cancel := context.WithTimeout(ctx, p.c.cfg.TxTimeout)
	defer cancel()
	args := p.leaseArgs()
	args["from"], args["hwm"], args["through"] = next, last, t0
	tag, err := p.c.cfg.Pool.Exec(ctx, qTouchPosition, args)
	if err != nil {
		p.log.Debug("idle: cannot record the position", "err", err)
		return next, nil
	}
	if tag.RowsAffected() == 0 {
		p.c.m.fenced.Inc()
		return next, errFenced
	}
	p.aheadLog = false
	p.c.m.position(p.id, 0, t0)
	return next, nil
}

// commit applies b in one transaction, retrying failures that pass
// (connection loss, timeouts, serialization failures, deadlocks, a server
// shutting down) with backoff until it commits, is fenced, or ctx ends. Any
// other failure that repeats on retry is the database refusing something in
// b: b is then bisected until the message it refuses alone is found, that
// message becomes a store_refused dead letter and the others commit in
// order (see isolate). It returns the new stored next offset.
func (p *partition) commit(ctx context.Context, b *microBatch) (int64, error) {
	err := p.attempt(ctx, b, 2)
	var r *refusal
	if errors.As(err, &r) {
		return p.isolate(ctx, b, r)
	}
	if err != nil {
		return 0, err
	}
	return b.to, nil
}

// attempt runs b's transaction until it commits (nil), is fenced
// (errFenced), ctx ends, or it failed refusals times in a row with an error
// that is not worth retrying (a *refusal).
func (p *partition) attempt(ctx context.Context, b *microBatch, refusals int) error {
	refused := 0
	for attempt := 0; ; attempt++ {
		t0 := time.Now()
		s, err := p.tryCommit(ctx, b)
		if err == nil {
			p.committed(b, s, time.Since(t0))
			return nil
		}
		if errors.Is(err, errFenced) {
			p.c.m.fenced.Inc()
			return err
		}
		if ctx.Err() != nil {
			// The partition was lost or the member stops: rolled back; the
			// next owner re-reads the batch from the stored offset.
			return ctx.Err()
		}
		cause := "postgres"
		if !retryable(err) {
			cause = "refused"
			if refused++; refusals > 0 && refused >= refusals {
				return &refusal{err: err}
			}
		}
		p.c.m.retries.WithLabelValues(cause).Inc()
		p.retrying(ctx, b, err, attempt)
		if !pause.For(ctx, p.c.backoff(attempt)) {
			return ctx.Err()
		}
		// A failed COMMIT may have committed after all: the stored offset
		// tells.
		stored, rerr := p.readNext(ctx, false)
		switch {
		case rerr != nil:
			// Retry the transaction; its compare-and-set decides.
		case stored == b.to && b.to != b.from:
			p.log.Info("the failed commit had committed", "to", b.to)
			p.committed(b, s, time.Since(t0))
			return nil
		case stored != b.from:
			p.c.m.fenced.Inc()
			return errFenced
		}
	}
}

// committed updates metrics and, at most every KafkaCommitEvery, commits
// the offset to Kafka for dashboards (never read back). Metrics count
// records, messages and dead letters (Prometheus takes float64); no usage
// quantity is ever a metric value.
func (p *partition) committed(b *microBatch, s summary, took time.Duration) {
	m := p.c.m
	p.resumed()
	m.batches.Inc()
	m.txSeconds.Observe(took.Seconds())
	for k, n := range s.outcomes {
		if n > 0 {
			m.records.WithLabelValues(kindName(k)).Add(float64(n))
		}
	}
	m.messages.WithLabelValues("accepted").Add(float64(s.messages - s.messagesRejected))
	m.messages.WithLabelValues("rejected").Add(float64(s.messagesRejected))
	for reason, n := range s.deadLetters {
		m.deadLetters.WithLabelValues(reason).Add(float64(n))
	}
	for _, j := range b.jumps {
		m.jumps.WithLabelValues(p.label).Inc()
		p.log.Error("offset jump: messages were lost before ingest read them", "from", j.from, "to", j.to, "detail", j.detail)
	}
	for cause, n := range b.skipped {
		m.skipped.WithLabelValues(cause).Add(float64(n))
		if cause == skipAbortMarker {
			m.anomalies.WithLabelValues("aborted_transaction").Inc()
			p.log.Error("a Kafka transaction was aborted on this partition: kafka-go cannot filter aborted transactions, "+
				"so its messages were applied like any other. A producer that retries them with the same operation ids "+
				"is billed once; usage it abandoned is billed anyway: check the producer, and adjust if needed",
				"markers", n, "from", b.from, "to", b.to)
		}
	}
	lag := max(b.hwm-b.to, 0)
	m.position(p.id, lag, b.through)
	p.log.Debug("micro-batch committed", "from", b.from, "to", b.to, "messages", s.messages,
		"records", s.records, "took", took)

	every := p.c.cfg.KafkaCommitEvery
	if every < 0 || time.Since(p.lastKafkaCommit) < every || b.to == b.from {
		return
	}
	p.lastKafkaCommit = time.Now()
	if err := p.c.commitToKafka(p.id, b.to); err != nil {
		p.log.Debug("dashboard offset commit to Kafka failed (harmless)", "err", err)
	}
}

// commitToKafka commits a stored offset to the Kafka group for lag
// dashboards, as a consumer outside any generation (Kafka accepts that from
// a group with no live members); it is never read back.
func (c *Consumer) commitToKafka(partition int, offset int64) error {
	c.commitMu.Lock()
	defer c.commitMu.Unlock()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	res, err := c.client.OffsetCommit(ctx, &kafka.OffsetCommitRequest{GroupID: c.cfg.Group, GenerationID: -1,
		Topics: map[string][]kafka.OffsetCommit{c.cfg.Topic: {{Partition: partition, Offset: offset}}}})
	if err != nil {
		return err
	}
	for _, ps := range res.Topics {
		for _, p := range ps {
			if p.Error != nil {
				return p.Error
			}
		}
	}
	return nil
}

// backoff returns the capped exponential delay before retry attempt+1,
// with jitter so that members do not retry in lockstep.
func (c *Consumer) backoff(attempt int) time.Duration {
	d := c.cfg.RetryMin << min(attempt, 20)
	if d <= 0 || d > c.cfg.RetryMax {
		d = c.cfg.RetryMax
	}
	return d/2 + rand.N(d/2+1)
}

// kafkaLogger adapts kafka-go's printf logging to slog.
func kafkaLogger(log *slog.Logger, level slog.Level) kafka.Logger {
	return kafka.LoggerFunc(func(msg string, args ...any) {
		if log.Enabled(context.Background(), level) {
			log.Log(context.Background(), level, "kafka-go: "+fmt.Sprintf(msg, args...))
		}
	})
}

// txOptions: READ COMMITTED is what ledger.Apply needs.
var txOptions = pgx.TxOptions{IsoLevel: pgx.ReadCommitted}

// controlRecord recognises a transaction marker that kafka-go's Reader
// returned as a message (it does not test the control bit of the record
// batch): key = version 0 (int16) and type 0 (abort) or 1 (commit), value =
// version 0 (int16) and the coordinator epoch (int32). A message key never
// holds a NUL byte legitimately, so this cannot swallow usage.
func controlRecord(m kafka.Message) string {
	k, v := m.Key, m.Value
	if len(k) != 4 || k[0] != 0 || k[1] != 0 || k[2] != 0 || k[3] > 1 || len(v) != 6 || v[0] != 0 || v[1] != 0 {
		return ""
	}
	if k[3] == 1 {
		return skipCommitMarker
	}
	return skipAbortMarker
}

// classifyGaps keeps as offset jumps only offsets that retention deleted:
// those below the partition's first available offset. Retention deletes
// from the head of the log; a gap above the first offset is compaction
// (or a marker kafka-go did not return), no loss, and is counted as
// skipped instead of paging an operator. If the first offset cannot be
// read, every gap stays a jump: a possible loss is never hidden.
func (p *partition) classifyGaps(ctx context.Context, b *microBatch) {
	if len(b.jumps) == 0 {
		return
	}
	first, _, err := p.offsets(ctx)
	if err != nil {
		p.log.Warn("cannot read the partition's first offset to tell compaction from retention; recording the gaps as offset jumps", "err", err)
		return
	}
	b.jumps = splitGaps(b, first)
}

// splitGaps returns the part of each of b's jumps below first (retention
// loss) and counts the rest as compaction.
func splitGaps(b *microBatch, first int64) []jump {
	var lost []jump
	for _, j := range b.jumps {
		if j.to <= first {
			lost = append(lost, j)
			continue
		}
		if j.from < first {
			j.detail = fmt.Sprintf("expected offset %d, the partition's first available offset is %d: %d messages were deleted (retention) before they were consumed",
				j.from, first, first-j.from)
			lost = append(lost, jump{from: j.from, to: first, detail: j.detail})
			b.skip(skipCompaction, j.to-first)
			continue
		}
		b.skip(skipCompaction, j.to-j.from)
	}
	return lost
}
