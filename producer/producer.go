package producer

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
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

// maxFuture mirrors the ledger's future_timestamp rule (docs/design.md §3): usage
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
	kconns  *conns // the connections of ktrans

	// Owned by the committer goroutine.
	streams map[streamKey]*streamState // a cache of at most StreamCache; Dir has them all
	ending  bool                       // Close began writing final records: no more records
	ended   bool                       // the epoch's final records are written

	epoch atomic.Int64

	reqs          chan *request
	ctl           chan closeReq
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
	formLimit     int // pending records one form transaction moves; owned by sendLoop
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
	db, l, err := openStore(cfg.Dir, cfg.Producer, time.Now(), cfg.StreamCache)
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
	for _, d := range l.damaged {
		reportDamaged(log, m, d)
	}
	p := &Producer{
		cfg: cfg, log: log, m: m, db: db,
		streams:       l.streams,
		reqs:          make(chan *request),
		ctl:           make(chan closeReq),
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
		p.kconns = &conns{open: map[*trackedConn]struct{}{}}
		p.ktrans = &kafka.Transport{Dial: p.kconns.dial}
		p.kwriter = &kafka.Writer{
			Addr:         kafka.TCP(cfg.Brokers...),
			Topic:        cfg.Topic,
			Transport:    p.ktrans,
			Balancer:     &kafka.Murmur2Balancer{}, // the Java client's key hashing
			RequiredAcks: kafka.RequireAll,
			// One WriteMessages call carries everything to send; do not
			// wait for more (the batching is ours, by Linger).
			BatchTimeout: 2 * time.Millisecond,
			// At most one write's messages: kafka-go allocates room for
			// BatchSize messages per record batch (1<<20 cost ~100 MiB
			// of zeroed memory on every write).
			BatchSize: maxSendBatches,
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
	p.formLimit = maxFormRecords
	m.sendBudget.Set(maxSendBytes)
	m.epoch.Set(float64(l.epoch))
	m.streams.Set(float64(len(l.streams)))
	m.buffered.Set(float64(l.buffered))
	log.Info("producer started", "epoch", l.epoch, "new_epoch", l.newEpoch, "buffered", l.buffered, "batches", l.batches)
	p.sendCtx, p.stopSend = context.WithCancel(context.Background())
	go p.commitLoop()
	go p.sendLoop()
	return p, nil
}

// reportDamaged logs a damaged value of the state file (it failed its
// checksum or did not decode) and counts it: set aside in the damaged
// bucket, it is not sent.
func reportDamaged(log *slog.Logger, m *metrics, d damagedValue) {
	m.damaged.Inc()
	if d.bucket == string(bucketStreams) {
		log.Error("a stream state in the state file is damaged (it fails its checksum or does not decode); set it aside in the state file's damaged bucket and started a new epoch. "+
			"The buffered records of the old epoch are still sent; its streams get no final record",
			"bucket", d.bucket, "stream", string(bytes.ReplaceAll(d.key, []byte{0}, []byte{'/'})))
		return
	}
	if d.bucket == string(bucketMeta) {
		log.Error("the producer's "+string(d.key)+" in the state file is damaged (it fails its checksum or is not a number); set it aside in the state file's damaged bucket. "+
			"A damaged epoch starts a new epoch above every epoch the file names (the buffered records of the old one are still sent; its streams get no final record); "+
			"a damaged next_index is found again from the records and streams in the file",
			"bucket", d.bucket, "key", string(d.key))
		return
	}
	if d.bucket == string(bucketBatches) {
		log.Error("a stored batch in the state file is damaged (it fails its checksum or does not decode); set it aside in the state file's damaged bucket and sent the others. "+
			"The usage of its records reaches the ledger in the totals of their streams' next records or final records (Close)",
			"bucket", d.bucket, "key", fmt.Sprintf("%x", d.key))
		return
	}
	if r := d.rebuilt; r != nil {
		log.Error("a pending record in the state file is damaged (it fails its checksum or does not decode); set it aside in the state file's damaged bucket and rebuilt it from its stream's state",
			"bucket", d.bucket, "index", i64(d.key), "customer", r.Customer, "meter", r.Meter, "epoch", r.Epoch, "seq", r.Seq, "final", r.Final)
		return
	}
	log.Error("a pending record in the state file is damaged (it fails its checksum or does not decode); set it aside in the state file's damaged bucket. "+
		"Its usage reaches the ledger in the total of its stream's next record or final record (Close); a gauge's reading is lost",
		"bucket", d.bucket, "index", i64(d.key))
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

// closeReq asks the committer to end the epoch (Close).
type closeReq struct {
	ctx   context.Context
	reply chan error
}

// request is one Record call waiting for the committer.
type request struct {
	ctx      context.Context
	key      streamKey
	quantity decimal.Decimal
	at       time.Time
	shape    string // "" (Record), "gauge" (RecordLevel: quantity is the level) or "unique" (RecordMember)
	member   string
	idem     string       // the caller's idempotency key (Key), or ""
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
//
// With Key(k), Record is idempotent by k: a call whose key the state in Dir
// already holds (a Record with k returned nil, or became durable just
// before a crash) records nothing and returns nil, or a *KeyReusedError if
// the first call with k recorded other usage. The key is stored in the
// same disk commit as its record, so after a crash a caller retries every
// call it did not see return nil, with the same keys, and is billed exactly
// once for each.
func (p *Producer) Record(ctx context.Context, customer, meter string, quantity decimal.Decimal, occurredAt time.Time, opts ...RecordOption) error {
	return p.record(ctx, &request{key: streamKey{customer, meter}, quantity: quantity, at: occurredAt}, opts)
}

// RecordLevel records that a gauge meter's level for customer, as this
// producer sees it, is level from occurredAt on (docs/design.md §16): seats
// in use, gigabytes stored. The level holds until the next RecordLevel of
// the same customer and meter; Close ends it at 0 (a final record). The
// meter must be declared a gauge first (PUT /v1/meters/{meter} with kind
// gauge): on any other meter the ledger sets the record aside as a dead
// letter (meter_kind_mismatch). Readings are in time order: a level
// stamped before the stream's last reading is refused with an error and
// records nothing (the ledger would refuse it as a conflict). Durability,
// Key and the buffer are as for Record.
func (p *Producer) RecordLevel(ctx context.Context, customer, meter string, level decimal.Decimal, occurredAt time.Time, opts ...RecordOption) error {
	return p.record(ctx, &request{key: streamKey{customer, meter}, quantity: level, at: occurredAt, shape: "gauge"}, opts)
}

// RecordMember records that member (1–256 characters) of customer was
// active on a unique meter at occurredAt: the meter counts distinct
// members per period and day (docs/design.md §16). The meter must be
// declared unique first (PUT /v1/meters/{meter} with kind unique): on any
// other meter the ledger sets the record aside as a dead letter
// (meter_kind_mismatch). Durability, Key and the buffer are as for Record.
func (p *Producer) RecordMember(ctx context.Context, customer, meter, member string, occurredAt time.Time, opts ...RecordOption) error {
	return p.record(ctx, &request{key: streamKey{customer, meter}, at: occurredAt, shape: "unique", member: member}, opts)
}

func (p *Producer) record(ctx context.Context, r *request, opts []RecordOption) error {
	customer, meter, quantity, occurredAt := r.key.customer, r.key.meter, r.quantity, r.at
	if err := ctx.Err(); err != nil {
		return err
	}
	var o recordOptions
	for _, opt := range opts {
		opt(&o)
	}
	if err := checkKey(o); err != nil {
		return err
	}
	if err := p.checkShape(customer, meter, quantity, occurredAt, r.shape, r.member); err != nil {
		return err
	}
	// The ledger keeps microseconds (Postgres timestamptz); keeping the same
	// here makes a resent record byte-for-byte what the ledger stored.
	r.ctx, r.at, r.idem, r.done = ctx, occurredAt.UTC().Truncate(time.Microsecond), o.key, make(chan error, 1)
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
	return p.checkShape(customer, meter, q, at, "", "")
}

// checkShape is check for a record of a shape: a total (""), a level
// ("gauge", q) or a member ("unique").
func (p *Producer) checkShape(customer, meter string, q decimal.Decimal, at time.Time, shape, member string) error {
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
	rec := wire.Record{OperationID: checkID, Customer: customer, Meter: meter, Seq: 1,
		Total: q, Quantity: decimal.NewNullDecimal(q), OccurredAt: at}
	switch shape {
	case "gauge":
		rec.Total, rec.Quantity, rec.Level = decimal.Decimal{}, decimal.NullDecimal{}, decimal.NewNullDecimal(q)
	case "unique":
		if member == "" {
			return errors.New("producer: member is empty; members are 1 to 256 characters")
		}
		rec.Total, rec.Quantity, rec.Member = decimal.Decimal{}, decimal.NullDecimal{}, member
	}
	_, err := wire.Encode(wire.Batch{Schema: wire.Schema, BatchID: checkID, Producer: p.cfg.Producer, Epoch: 1,
		SentAt: at, Records: []wire.Record{rec}})
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
		case req := <-p.ctl:
			req.reply <- p.finalize(req.ctx)
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
		if p.ended || p.ending {
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
	keys := make([]streamKey, len(taken))
	for i, r := range taken {
		keys[i] = r.key
	}
	cur, err := p.loadStreams(keys)
	if err != nil {
		err = fmt.Errorf("producer: usage not recorded: read stream state: %w", err)
		for _, r := range taken {
			r.done <- err
		}
		return
	}
	known, err := p.loadKeys(taken)
	if err != nil {
		err = fmt.Errorf("producer: usage not recorded: read idempotency keys: %w", err)
		for _, r := range taken {
			r.done <- err
		}
		return
	}
	next := make(map[streamKey]streamState)
	recs := make([]storedRecord, 0, len(taken))
	ok := make([]*request, 0, len(taken))
	var newKeys []storedKey
	leaders := map[string]*request{}       // a key's first call in this group
	followers := map[*request][]*request{} // later calls with its key and usage
	for _, r := range taken {
		if r.idem != "" {
			if first, seen := known[r.idem]; seen {
				p.m.keyRepeats.Inc()
				r.done <- first.answer(r)
				continue
			}
			if l := leaders[r.idem]; l != nil {
				p.m.keyRepeats.Inc()
				if err := keyOf(l).answer(r); err != nil {
					r.done <- err
				} else {
					followers[l] = append(followers[l], r)
				}
				continue
			}
		}
		st, seen := next[r.key]
		if !seen {
			st = cur[r.key]
		}
		st.Seq++
		if r.shape != "" { // a level or a member: no running total
			if r.shape == "gauge" && r.at.Before(st.At) {
				// The ledger takes a gauge's readings in time order by
				// seq and would refuse this one as a conflict.
				r.done <- fmt.Errorf("producer: level of %s/%s at %s is before the stream's last reading (%s); a gauge's readings are recorded in time order",
					r.key.customer, r.key.meter, r.at.Format(time.RFC3339Nano), st.At.Format(time.RFC3339Nano))
				continue
			}
			st.Shape, st.Member, st.At = r.shape, r.member, r.at
			id, err := uuid.NewV7()
			if err != nil {
				r.done <- fmt.Errorf("producer: operation id: %w", err)
				continue
			}
			next[r.key] = st
			sr := storedRecord{Epoch: epoch, OperationID: id, Customer: r.key.customer, Meter: r.key.meter,
				Seq: st.Seq, Total: st.Total, OccurredAt: r.at, Member: r.member}
			if r.shape == "gauge" {
				sr.Level = decimal.NewNullDecimal(r.quantity)
			}
			recs = append(recs, sr)
			ok = append(ok, r)
			if r.idem != "" {
				leaders[r.idem] = r
				k := keyOf(r)
				k.Epoch, k.Seq, k.OperationID = epoch, st.Seq, id
				newKeys = append(newKeys, k)
			}
			continue
		}
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
		if r.idem != "" {
			leaders[r.idem] = r
			k := keyOf(r)
			k.Epoch, k.Seq, k.OperationID = epoch, st.Seq, id
			newKeys = append(newKeys, k)
		}
	}
	// A follower gets its leader's answer, whatever it is.
	answer := func(r *request, err error) {
		r.done <- err
		for _, f := range followers[r] {
			f.done <- err
		}
	}
	if err := p.store(recs, next, false, newKeys); err != nil {
		if errors.Is(err, errOutcomeUnknown) {
			err = fmt.Errorf("producer: %w", err)
		} else {
			err = fmt.Errorf("producer: usage not recorded: %w", err)
		}
		p.log.Error("storing records failed", "err", err, "records", len(recs))
		for _, r := range ok {
			answer(r, err)
		}
		return
	}
	p.m.records.Add(float64(len(ok)))
	for _, r := range ok {
		answer(r, nil)
	}
}

// store writes recs as pending and the new stream states in one
// transaction, then publishes them to the sender.
func (p *Producer) store(recs []storedRecord, states map[streamKey]streamState, endEpoch bool, keys []storedKey) error {
	if len(recs) == 0 && !endEpoch {
		return nil
	}
	first := p.nextIndex
	for i, r := range recs {
		// recs are in seq order within a stream: the last one stays.
		k := streamKey{r.Customer, r.Meter}
		if st, ok := states[k]; ok {
			st.Last = first + uint64(i) + 1
			states[k] = st
		}
	}
	err := p.db.Update(func(tx *bolt.Tx) error {
		if err := putKeys(tx, keys, time.Now(), p.cfg.KeyRetention); err != nil {
			return err
		}
		pend := tx.Bucket(bucketPending)
		for i := range recs {
			k := u64(first + uint64(i))
			v, err := sealValue(k, &recs[i])
			if err != nil {
				return err
			}
			if err := pend.Put(k, v); err != nil {
				return err
			}
		}
		sb := tx.Bucket(bucketStreams)
		for k, st := range states {
			kb := k.bytes()
			v, err := sealValue(kb, st)
			if err != nil {
				return err
			}
			if err := sb.Put(kb, v); err != nil {
				return err
			}
		}
		meta := tx.Bucket(bucketMeta)
		if endEpoch {
			if err := meta.Put(keyEpochClosed, []byte{1}); err != nil {
				return err
			}
		}
		if len(recs) > 0 && recs[0].Final {
			if err := meta.Put(keyEpochClosing, []byte{1}); err != nil {
				return err
			}
		}
		return putNumber(meta, keyNextIndex, first+uint64(len(recs)))
	})
	if err != nil {
		// A failed commit may have reached the file all the same (say, the
		// meta page was written and its fsync failed): memory no longer
		// says what the file holds. Reload: forget the cached stream
		// states (they are read back from the file), and adopt the
		// records if the file has them, so that no seq is given twice.
		p.streams = make(map[streamKey]*streamState)
		p.m.streams.Set(0)
		var have uint64
		if verr := p.db.View(func(tx *bolt.Tx) (err error) {
			have, err = number(tx.Bucket(bucketMeta), keyNextIndex)
			return err
		}); verr != nil || have != first+uint64(len(recs)) || len(recs) == 0 {
			return err
		}
		err = fmt.Errorf("%w (%d records are in the state file and will be sent: do not record them again): %w", errOutcomeUnknown, len(recs), err)
	}
	for k, st := range states {
		s := st
		p.streams[k] = &s
	}
	p.trimStreams(states)
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
	return err
}

// errOutcomeUnknown: a commit failed but its records are in the state file.
var errOutcomeUnknown = errors.New("the disk commit failed and its outcome is unknown: the usage may be billed")

// loadStreams returns the states of keys: from the cache, or read from the
// file (absent: a stream not yet seen this epoch), and caches them.
func (p *Producer) loadStreams(keys []streamKey) (map[streamKey]streamState, error) {
	out := make(map[streamKey]streamState, len(keys))
	var miss []streamKey
	for _, k := range keys {
		if st := p.streams[k]; st != nil {
			out[k] = *st
		} else if _, dup := out[k]; !dup {
			out[k] = streamState{}
			miss = append(miss, k)
		}
	}
	if len(miss) == 0 {
		return out, nil
	}
	err := p.db.View(func(tx *bolt.Tx) error {
		b := tx.Bucket(bucketStreams)
		for _, k := range miss {
			var st streamState
			kb := k.bytes()
			if v := b.Get(kb); v != nil {
				if err := openValue(kb, v, &st); err != nil {
					return fmt.Errorf("stream state %q: %w", kb, err)
				}
			}
			out[k] = st
		}
		return nil
	})
	if err != nil {
		return nil, err
	}
	for _, k := range miss {
		st := out[k]
		p.streams[k] = &st
	}
	p.trimStreams(out)
	return out, nil
}

// trimStreams evicts cached stream states beyond StreamCache, keeping
// those of keep (the ones just used). The file has them all.
func (p *Producer) trimStreams(keep map[streamKey]streamState) {
	for k := range p.streams {
		if len(p.streams) <= p.cfg.StreamCache {
			break
		}
		if _, ok := keep[k]; !ok {
			delete(p.streams, k)
		}
	}
	p.m.streams.Set(float64(len(p.streams)))
}

// finalize ends the epoch: one final record (quantity 0, same total) per
// stream that has records in it. The final records count against
// MaxBuffered like any other: they are written as room frees up (the
// sender drains meanwhile), until ctx ends. From the first of them on the
// file says the epoch is closing, so that a producer started on it after
// an interrupted Close begins a new epoch instead of continuing streams
// that already have their final record.
func (p *Producer) finalize(ctx context.Context) error {
	if p.ended {
		return nil
	}
	p.ending = true
	epoch := p.epoch.Load()
	var after []byte
	for {
		room, err := p.waitForRoom(ctx)
		if err != nil {
			return fmt.Errorf("producer: end epoch %d: %w", epoch, err)
		}
		now := time.Now().UTC().Truncate(time.Microsecond)
		var recs []storedRecord
		states := make(map[streamKey]streamState)
		more := false
		err = p.db.View(func(tx *bolt.Tx) error {
			c := tx.Bucket(bucketStreams).Cursor()
			k, v := c.First()
			if after != nil {
				k, v = c.Seek(after)
				if k != nil && bytes.Equal(k, after) {
					k, v = c.Next()
				}
			}
			for ; k != nil; k, v = c.Next() {
				if len(recs) >= room {
					more = true
					break
				}
				after = append(after[:0], k...)
				sk, ok := parseStreamKey(k)
				var st streamState
				if !ok || openValue(k, v, &st) != nil {
					return fmt.Errorf("stream state %q is unreadable", k)
				}
				if st.Seq == 0 || st.Final {
					continue
				}
				id, err := uuid.NewV7()
				if err != nil {
					return err
				}
				ns := streamState{Seq: st.Seq + 1, Total: st.Total, Final: true, Shape: st.Shape, Member: st.Member, At: st.At}
				states[sk] = ns
				fr := storedRecord{Epoch: epoch, OperationID: id, Customer: sk.customer, Meter: sk.meter,
					Seq: ns.Seq, Total: ns.Total, Quantity: decimal.Zero, OccurredAt: now, Final: true}
				switch st.Shape {
				case "gauge": // the level ends at 0 now, or at its last reading's time if that is ahead
					fr.Level = decimal.NewNullDecimal(decimal.Zero)
					if st.At.After(now) {
						fr.OccurredAt = st.At
					}
				case "unique":
					// The last member again, when it was last seen: it
					// counts nothing new. (A state written before At was
					// kept has none: now, as then.)
					fr.Member = st.Member
					if !st.At.IsZero() {
						fr.OccurredAt = st.At
					}
				}
				recs = append(recs, fr)
			}
			return nil
		})
		if err != nil {
			return fmt.Errorf("producer: end epoch %d: %w", epoch, err)
		}
		if err := p.store(recs, states, !more, nil); err != nil {
			return fmt.Errorf("producer: end epoch %d: %w", epoch, err)
		}
		if !more {
			break
		}
	}
	p.ended = true
	p.log.Info("epoch ended", "epoch", epoch)
	return nil
}

// waitForRoom waits until at least one record fits under MaxBuffered and
// returns how many do (at most maxFormRecords).
func (p *Producer) waitForRoom(ctx context.Context) (int, error) {
	for {
		p.mu.Lock()
		room := p.cfg.MaxBuffered - p.buffered
		ch := p.progress
		p.mu.Unlock()
		if room > 0 {
			return min(room, maxFormRecords), nil
		}
		select {
		case <-ch:
		case <-ctx.Done():
			return 0, fmt.Errorf("%w with MaxBuffered records waiting for Kafka", ctx.Err())
		}
	}
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
	case p.ctl <- closeReq{ctx, reply}:
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
// and continues the same streams. Bound ctx with a timeout: during a Kafka
// outage nothing can be sent, so a ctx that never ends keeps Stop waiting
// for as long as the outage lasts. When ctx ends before everything is
// sent, Stop shuts down all the same and returns an error that wraps
// ctx.Err() and says how many records stay on disk (a ctx already
// cancelled skips sending and returns no such error).
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
			// The writer finishes a write the sender gave up on on its own
			// clock (10 s an attempt, three attempts), and its Close waits
			// for it: against a broker that stopped answering, Stop would
			// wait that long past its context. The write's outcome no
			// longer matters (its batches stay on disk and are resent by
			// the next producer on Dir), so its connections are closed
			// and no new ones are made: it fails at once.
			p.kconns.closeAll()
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

// conns are the connections of the Kafka transport New builds, so that
// shutdown can end a write that waits for a broker that stopped answering.
type conns struct {
	mu     sync.Mutex
	closed bool
	open   map[*trackedConn]struct{}
}

// errShutDown: the producer is shutting down; no connection is made.
var errShutDown = errors.New("producer: shutting down")

// dial is kafka-go's default dialer (5 s timeout), tracked.
func (cs *conns) dial(ctx context.Context, network, addr string) (net.Conn, error) {
	cs.mu.Lock()
	closed := cs.closed
	cs.mu.Unlock()
	if closed {
		return nil, errShutDown
	}
	c, err := (&net.Dialer{Timeout: 5 * time.Second}).DialContext(ctx, network, addr)
	if err != nil {
		return nil, err
	}
	cs.mu.Lock()
	defer cs.mu.Unlock()
	if cs.closed {
		c.Close()
		return nil, errShutDown
	}
	tc := &trackedConn{Conn: c, cs: cs}
	cs.open[tc] = struct{}{}
	return tc, nil
}

// closeAll closes every open connection and refuses new ones.
func (cs *conns) closeAll() {
	cs.mu.Lock()
	cs.closed = true
	open := cs.open
	cs.open = map[*trackedConn]struct{}{}
	cs.mu.Unlock()
	for c := range open {
		c.Conn.Close()
	}
}

type trackedConn struct {
	net.Conn
	cs *conns
}

func (c *trackedConn) Close() error {
	c.cs.mu.Lock()
	delete(c.cs.open, c)
	c.cs.mu.Unlock()
	return c.Conn.Close()
}
