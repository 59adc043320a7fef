package producer

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"sync/atomic"
	"time"

	"github.com/google/uuid"
	"github.com/segmentio/kafka-go"
	"github.com/shopspring/decimal"
	bolt "go.etcd.io/bbolt"

	"github.com/tally-ledger/tally/ingest/wire"
)

// Errors returned by Record.
var (
	// ErrBufferFull: MaxBuffered records are waiting for Kafka and
	// BlockWhenFull is off. The usage was not recorded; try again later.
	ErrBufferFull = errors.New("producer: buffer full: MaxBuffered records are waiting for Kafka")
	// ErrClosed: Close or Stop was called. The usage was not recorded.
	ErrClosed = errors.New("producer: closed")
)

// maxFuture mirrors the ledger's future_timestamp rule (SPEC §3): usage
// more than 5 minutes ahead of ingest is refused, so it is refused here,
// where the caller can still act on the error.
const maxFuture = 5 * time.Minute

// maxGroup bounds how many Record calls share one commit.
const maxGroup = 4096

// Producer records usage durably and sends it to Kafka. Its methods are
// safe for concurrent use. Make one per Dir with New; end it with Close (or
// Stop).
type Producer struct {
	cfg     Config
	log     *slog.Logger
	m       *metrics
	db      *bolt.DB
	writer  MessageWriter
	kwriter *kafka.Writer // the writer New built, closed by Close
	ktrans  *kafka.Transport

	// Owned by the committer goroutine.
	streams map[streamKey]*streamState
	ended   bool // the epoch's final records are written

	epoch atomic.Int64

	reqs          chan *request
	ctl           chan chan error
	closing       chan struct{}
	closeOnce     sync.Once
	stopCommit    chan struct{}
	committerDone chan struct{}
	sendCtx       context.Context
	stopSend      context.CancelFunc
	sendDone      chan struct{}
	wake          chan struct{}
	sendBudget    int // bytes of stored batches per write; owned by sendLoop
	sendOK        int // writes without a size refusal since the budget last changed
	shutOnce      sync.Once
	shutErr       error

	mu           sync.Mutex
	nextIndex    uint64    // index of the next record stored
	pending      int       // records not yet in a batch
	pendingSince time.Time // when pending last went from 0 to >0
	formTarget   uint64    // Flush: form every record below this index now
	buffered     int       // records not yet acknowledged by Kafka
	progress     chan struct{}
}

// New opens (or creates) the state in cfg.Dir, starts a new epoch if the
// state was new, lost, unreadable or ended by Close, and starts sending
// what is buffered.
func New(cfg Config) (*Producer, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	cfg = cfg.withDefaults()
	log := cfg.Logger.With("producer", cfg.Producer)
	db, l, err := openStore(cfg.Dir, cfg.Producer, time.Now())
	if err != nil {
		return nil, err
	}
	if l.renamed != "" {
		log.Error("producer state was unreadable; moved it aside and started a new epoch",
			"moved_to", l.renamed, "epoch", l.epoch)
	}
	m, err := newMetrics(cfg.Registerer, cfg.Producer)
	if err != nil {
		db.Close()
		return nil, fmt.Errorf("producer: register metrics: %w", err)
	}
	p := &Producer{
		cfg: cfg, log: log, m: m, db: db,
		streams:       l.streams,
		reqs:          make(chan *request),
		ctl:           make(chan chan error),
		closing:       make(chan struct{}),
		stopCommit:    make(chan struct{}),
		committerDone: make(chan struct{}),
		sendDone:      make(chan struct{}),
		wake:          make(chan struct{}, 1),
		nextIndex:     l.nextIndex,
		pending:       l.pending,
		pendingSince:  l.oldest,
		buffered:      l.buffered,
		progress:      make(chan struct{}),
	}
	p.epoch.Store(l.epoch)
	if cfg.Writer != nil {
		p.writer = cfg.Writer
	} else {
		p.ktrans = &kafka.Transport{}
		p.kwriter = &kafka.Writer{
			Addr:         kafka.TCP(cfg.Brokers...),
			Topic:        cfg.Topic,
			Transport:    p.ktrans,
			Balancer:     &kafka.Murmur2Balancer{}, // the Java client's key hashing
			RequiredAcks: kafka.RequireAll,
			// One WriteMessages call carries everything to send; do not
			// wait for more (the batching is ours, by Linger).
			BatchTimeout: 2 * time.Millisecond,
			BatchSize:    1 << 20,
			// kafka-go puts the messages of one partition into record
			// batches of at most BatchBytes (its estimate: 22 bytes per
			// record on top of key and value, above the real overhead);
			// the 128 bytes left are for the batch header (61 bytes).
			BatchBytes:      int64(cfg.MaxPartitionBytes - 128),
			MaxAttempts:     3,
			WriteBackoffMin: 50 * time.Millisecond,
			WriteBackoffMax: time.Second,
		}
		p.writer = p.kwriter
	}
	p.sendBudget = maxSendBytes
	m.sendBudget.Set(maxSendBytes)
	m.epoch.Set(float64(l.epoch))
	m.buffered.Set(float64(l.buffered))
	log.Info("producer started", "epoch", l.epoch, "new_epoch", l.newEpoch, "buffered", l.buffered, "batches", l.batches)
	p.sendCtx, p.stopSend = context.WithCancel(context.Background())
	go p.commitLoop()
	go p.sendLoop()
	return p, nil
}

// Epoch is the producer's current epoch.
func (p *Producer) Epoch() int64 { return p.epoch.Load() }

// Buffered is the number of records durable on disk and not yet
// acknowledged by Kafka.
func (p *Producer) Buffered() int {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.buffered
}

// request is one Record call waiting for the committer.
type request struct {
	ctx      context.Context
	key      streamKey
	quantity decimal.Decimal
	at       time.Time
	state    atomic.Int32 // reqWaiting → reqTaken (committer) or reqCancelled (caller)
	done     chan error
}

const (
	reqWaiting int32 = iota
	reqTaken
	reqCancelled
)

// claim marks r as the committer's; false if its caller gave up first.
func (r *request) claim() bool { return r.state.CompareAndSwap(reqWaiting, reqTaken) }

// Record adds quantity of meter used by customer at occurredAt. It returns
// nil once the usage, with its seq and running total, is fsynced to Dir;
// from then on it is billed exactly once. On error nothing was recorded.
//
// Customer and meter ids are 1–128 characters of [A-Za-z0-9._:-];
// quantity is >= 0 with at most 38 significant digits and 9 after the
// point; occurredAt decides the accounting period, may be at most 5
// minutes in the future, and is kept to the microsecond.
//
// Concurrent calls share one disk commit. When the buffer is full, Record
// blocks (Config.BlockWhenFull) until there is room or ctx ends, or returns
// ErrBufferFull.
func (p *Producer) Record(ctx context.Context, customer, meter string, quantity decimal.Decimal, occurredAt time.Time) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	if err := p.check(customer, meter, quantity, occurredAt); err != nil {
		return err
	}
	// The ledger keeps microseconds (Postgres timestamptz); keeping the same
	// here makes a resent record byte-for-byte what the ledger stored.
	r := &request{ctx: ctx, key: streamKey{customer, meter}, quantity: quantity, at: occurredAt.UTC().Truncate(time.Microsecond), done: make(chan error, 1)}
	select {
	case p.reqs <- r:
	case <-p.closing:
		return ErrClosed
	case <-p.committerDone:
		return ErrClosed
	case <-ctx.Done():
		return ctx.Err()
	}
	select {
	case err := <-r.done:
		return err
	case <-ctx.Done():
		if r.state.CompareAndSwap(reqWaiting, reqCancelled) {
			return ctx.Err()
		}
		// The committer took it: its outcome is the answer.
		return <-r.done
	}
}

// checkID is fixed so that check can use wire.Encode's rules without
// generating UUIDs.
var checkID = uuid.MustParse("00000000-0000-7000-8000-000000000001")

// check refuses, before anything is stored, usage that the wire format or
// the ledger would refuse.
func (p *Producer) check(customer, meter string, q decimal.Decimal, at time.Time) error {
	if q.Sign() < 0 {
		return fmt.Errorf("producer: quantity %s is negative; usage is never below zero (record corrections as ledger adjustments)", q)
	}
	if at.IsZero() {
		return errors.New("producer: occurredAt is the zero time; pass when the usage happened")
	}
	if now := time.Now(); at.After(now.Add(maxFuture)) {
		return fmt.Errorf("producer: occurredAt %s is more than %v in the future (now %s); the ledger would refuse it",
			at.UTC().Format(time.RFC3339Nano), maxFuture, now.UTC().Format(time.RFC3339))
	}
	_, err := wire.Encode(wire.Batch{Schema: wire.Schema, BatchID: checkID, Producer: p.cfg.Producer, Epoch: 1,
		SentAt: at, Records: []wire.Record{{OperationID: checkID, Customer: customer, Meter: meter, Seq: 1,
			Total: q, Quantity: decimal.NewNullDecimal(q), OccurredAt: at}}})
	if err != nil {
		return fmt.Errorf("producer: usage refused: %w", err)
	}
	return nil
}

// commitLoop is the only writer of stream state: it gives each record its
// seq and total and stores groups of concurrent Record calls in one
// transaction.
func (p *Producer) commitLoop() {
	defer close(p.committerDone)
	for {
		var group []*request
		select {
		case r := <-p.reqs:
			group = append(group, r)
		case reply := <-p.ctl:
			reply <- p.finalize()
			continue
		case <-p.stopCommit:
			return
		}
	drain:
		for len(group) < maxGroup {
			select {
			case r := <-p.reqs:
				group = append(group, r)
			default:
				break drain
			}
		}
		p.commitGroup(group)
	}
}

func (p *Producer) commitGroup(group []*request) {
	taken := make([]*request, 0, len(group))
	for _, r := range group {
		if p.ended {
			if r.claim() {
				r.done <- ErrClosed
			}
			continue
		}
		if !p.room(len(taken) + 1) {
			if !p.cfg.BlockWhenFull {
				if r.claim() {
					r.done <- ErrBufferFull
				}
				continue
			}
			p.commit(taken)
			taken = taken[:0]
			if !p.waitRoom(r) {
				continue
			}
		}
		if r.claim() {
			taken = append(taken, r)
		}
	}
	p.commit(taken)
}

func (p *Producer) room(n int) bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.buffered+n <= p.cfg.MaxBuffered
}

// waitRoom waits until one more record fits. False if r's caller gave up
// or the producer is stopping (r is then answered).
func (p *Producer) waitRoom(r *request) bool {
	for {
		p.mu.Lock()
		ok := p.buffered+1 <= p.cfg.MaxBuffered
		ch := p.progress
		p.mu.Unlock()
		if ok {
			return true
		}
		select {
		case <-ch:
		case <-r.ctx.Done():
			return false // the caller cancels r itself
		case <-p.closing:
			if r.claim() {
				r.done <- ErrClosed
			}
			return false
		}
	}
}

// commit stores taken in one transaction and answers each.
func (p *Producer) commit(taken []*request) {
	if len(taken) == 0 {
		return
	}
	epoch := p.epoch.Load()
	next := make(map[streamKey]streamState)
	recs := make([]storedRecord, 0, len(taken))
	ok := make([]*request, 0, len(taken))
	for _, r := range taken {
		st, seen := next[r.key]
		if !seen {
			if cur := p.streams[r.key]; cur != nil {
				st = *cur
			}
		}
		st.Seq++
		st.Total = st.Total.Add(r.quantity)
		if st.Total.Coefficient().BitLen() > 120 { // near the 38-digit limit: let the wire rules decide
			if err := p.check(r.key.customer, r.key.meter, st.Total, r.at); err != nil {
				r.done <- fmt.Errorf("producer: the stream's running total would exceed the wire limits: %w", err)
				continue
			}
		}
		id, err := uuid.NewV7()
		if err != nil {
			r.done <- fmt.Errorf("producer: operation id: %w", err)
			continue
		}
		next[r.key] = st
		recs = append(recs, storedRecord{Epoch: epoch, OperationID: id, Customer: r.key.customer, Meter: r.key.meter,
			Seq: st.Seq, Total: st.Total, Quantity: r.quantity, OccurredAt: r.at})
		ok = append(ok, r)
	}
	if err := p.store(recs, next, false); err != nil {
		err = fmt.Errorf("producer: usage not recorded: %w", err)
		p.log.Error("storing records failed", "err", err, "records", len(recs))
		for _, r := range ok {
			r.done <- err
		}
		return
	}
	p.m.records.Add(float64(len(ok)))
	for _, r := range ok {
		r.done <- nil
	}
}

// store writes recs as pending and the new stream states in one
// transaction, then publishes them to the sender.
func (p *Producer) store(recs []storedRecord, states map[streamKey]streamState, endEpoch bool) error {
	if len(recs) == 0 && !endEpoch {
		return nil
	}
	first := p.nextIndex
	err := p.db.Update(func(tx *bolt.Tx) error {
		pend := tx.Bucket(bucketPending)
		for i := range recs {
			v, err := json.Marshal(&recs[i])
			if err != nil {
				return err
			}
			if err := pend.Put(u64(first+uint64(i)), v); err != nil {
				return err
			}
		}
		sb := tx.Bucket(bucketStreams)
		for k, st := range states {
			v, err := json.Marshal(st)
			if err != nil {
				return err
			}
			if err := sb.Put(k.bytes(), v); err != nil {
				return err
			}
		}
		meta := tx.Bucket(bucketMeta)
		if endEpoch {
			if err := meta.Put(keyEpochClosed, []byte{1}); err != nil {
				return err
			}
		}
		return meta.Put(keyNextIndex, u64(first+uint64(len(recs))))
	})
	if err != nil {
		return err
	}
	for k, st := range states {
		s := st
		p.streams[k] = &s
	}
	n := len(recs)
	p.mu.Lock()
	p.nextIndex = first + uint64(n)
	if p.pending == 0 {
		p.pendingSince = time.Now()
	}
	p.pending += n
	p.buffered += n
	p.m.buffered.Set(float64(p.buffered))
	p.mu.Unlock()
	p.poke()
	return nil
}

// finalize ends the epoch: one final record (quantity 0, same total) per
// stream that has records in it.
func (p *Producer) finalize() error {
	if p.ended {
		return nil
	}
	epoch := p.epoch.Load()
	now := time.Now().UTC().Truncate(time.Microsecond)
	var recs []storedRecord
	states := make(map[streamKey]streamState)
	for k, st := range p.streams {
		if st.Seq == 0 {
			continue
		}
		id, err := uuid.NewV7()
		if err != nil {
			return err
		}
		ns := streamState{Seq: st.Seq + 1, Total: st.Total}
		states[k] = ns
		recs = append(recs, storedRecord{Epoch: epoch, OperationID: id, Customer: k.customer, Meter: k.meter,
			Seq: ns.Seq, Total: ns.Total, Quantity: decimal.Zero, OccurredAt: now, Final: true})
	}
	if err := p.store(recs, states, true); err != nil {
		return fmt.Errorf("producer: end epoch %d: %w", epoch, err)
	}
	p.ended = true
	p.log.Info("epoch ended", "epoch", epoch, "streams", len(recs))
	return nil
}

func (p *Producer) poke() {
	select {
	case p.wake <- struct{}{}:
	default:
	}
}

// broadcast wakes everyone waiting for progress. Call with p.mu held.
func (p *Producer) broadcast() {
	close(p.progress)
	p.progress = make(chan struct{})
}

// Flush forms batches of everything recorded before the call and waits
// until Kafka acknowledged all of it, or ctx ends.
func (p *Producer) Flush(ctx context.Context) error {
	select {
	case <-p.sendDone:
		return ErrClosed
	default:
	}
	p.mu.Lock()
	target := p.nextIndex
	p.formTarget = max(p.formTarget, target)
	p.mu.Unlock()
	p.poke()
	for {
		p.mu.Lock()
		ch := p.progress
		p.mu.Unlock()
		low, err := p.lowWater()
		if err != nil {
			return fmt.Errorf("producer: flush: %w", err)
		}
		if low >= target {
			return nil
		}
		select {
		case <-ch:
		case <-ctx.Done():
			return fmt.Errorf("producer: flush: %w (%d records still buffered on disk; they are sent later)", ctx.Err(), p.Buffered())
		case <-p.sendDone:
			return ErrClosed
		}
	}
}

// lowWater is the index of the oldest record not yet acknowledged by
// Kafka, or MaxUint64 when there is none.
func (p *Producer) lowWater() (uint64, error) {
	low := ^uint64(0)
	err := p.db.View(func(tx *bolt.Tx) error {
		for _, b := range [][]byte{bucketPending, bucketBatches} {
			if k, _ := tx.Bucket(b).Cursor().First(); k != nil {
				low = min(low, uint64(i64(k)))
			}
		}
		return nil
	})
	return low, err
}

// Close ends the epoch and shuts down: it stops accepting records, appends
// a final record (quantity 0) to every stream of the epoch, sends
// everything buffered, and closes. If ctx ends first, what is unsent stays
// on disk and the next producer on Dir sends it (in a new epoch for new
// records). Close returns the first error.
func (p *Producer) Close(ctx context.Context) error {
	p.closeOnce.Do(func() { close(p.closing) })
	reply := make(chan error, 1)
	var err error
	select {
	case p.ctl <- reply:
		err = <-reply
	case <-p.committerDone:
		return p.shutdown() // closed or stopped before
	case <-ctx.Done():
		err = fmt.Errorf("producer: close: %w before the epoch could end", ctx.Err())
	}
	if ferr := p.Flush(ctx); err == nil && !errors.Is(ferr, ErrClosed) {
		err = ferr
	}
	return errors.Join(err, p.shutdown())
}

// Stop shuts down without ending the epoch: it stops accepting records and
// sends what is buffered until ctx ends (pass a cancelled ctx to stop at
// once). Whatever is unsent stays on disk; the next producer on Dir sends it
// and continues the same streams.
func (p *Producer) Stop(ctx context.Context) error {
	p.closeOnce.Do(func() { close(p.closing) })
	var err error
	if ctx.Err() == nil {
		if ferr := p.Flush(ctx); !errors.Is(ferr, ErrClosed) {
			err = ferr
		}
	}
	return errors.Join(err, p.shutdown())
}

func (p *Producer) shutdown() error {
	p.shutOnce.Do(func() {
		close(p.stopCommit)
		<-p.committerDone
		p.stopSend()
		<-p.sendDone
		var errs []error
		if p.kwriter != nil {
			errs = append(errs, p.kwriter.Close())
			p.ktrans.CloseIdleConnections()
		}
		errs = append(errs, p.db.Close())
		p.m.unregister(p.cfg.Registerer)
		p.log.Info("producer stopped", "epoch", p.epoch.Load(), "buffered", p.Buffered())
		p.shutErr = errors.Join(errs...)
	})
	return p.shutErr
}
