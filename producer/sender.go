package producer

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"math/rand/v2"
	"time"

	"github.com/google/uuid"
	"github.com/segmentio/kafka-go"
	"github.com/shopspring/decimal"
	bolt "go.etcd.io/bbolt"

	"github.com/tally-ledger/tally/ingest/wire"
)

// Bounds of one round of work of the sender.
const (
	maxFormRecords = 50_000  // pending records turned into batches per transaction
	maxSendBatches = 256     // batches per WriteMessages call
	maxSendBytes   = 8 << 20 // bytes per WriteMessages call
)

// sendLoop forms batches when they are due and sends stored batches in
// the order they were formed, until stopped.
func (p *Producer) sendLoop() {
	defer close(p.sendDone)
	attempt := 0
	for p.sendCtx.Err() == nil {
		formErr := p.formDue()
		if formErr != nil {
			// A full disk fails a commit that needs more pages than the
			// file has free: form fewer records at a time, and send the
			// batches already formed all the same, whose deletion frees
			// pages. Otherwise a disk filled by the state file itself
			// would keep every acknowledged record from Kafka for good.
			p.formLimit = max(p.formLimit/2, 1)
			p.log.Error("forming batches failed; retrying", "err", formErr, "next_records", p.formLimit)
		}
		sent, err := p.sendSome()
		if err != nil {
			if p.sendCtx.Err() != nil {
				return
			}
			p.m.sendErrors.Inc()
			d := p.backoff(attempt)
			p.log.Warn("sending batches to Kafka failed; retrying the same batches", "err", err, "attempt", attempt+1, "retry_in", d)
			if !p.sleep(d) {
				return
			}
			attempt++
			continue
		}
		if formErr != nil && !sent {
			if !p.sleep(p.backoff(attempt)) {
				return
			}
			attempt++
			continue
		}
		attempt = 0
		if sent {
			continue
		}
		p.mu.Lock()
		wait := time.Duration(-1)
		if p.pending > 0 {
			wait = max(p.cfg.Linger-time.Since(p.pendingSince), time.Millisecond)
		}
		p.mu.Unlock()
		var timer <-chan time.Time
		var t *time.Timer
		if wait >= 0 {
			t = time.NewTimer(wait)
			timer = t.C
		}
		select {
		case <-p.wake:
		case <-timer:
		case <-p.sendCtx.Done():
		}
		if t != nil {
			t.Stop()
		}
	}
}

func (p *Producer) backoff(attempt int) time.Duration {
	d := p.cfg.RetryMin << min(attempt, 20)
	if d <= 0 || d > p.cfg.RetryMax {
		d = p.cfg.RetryMax
	}
	return d/2 + rand.N(d/2+1)
}

func (p *Producer) sleep(d time.Duration) bool {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
		return true
	case <-p.sendCtx.Done():
		return false
	}
}

// formDue turns pending records into stored batches when enough records
// wait, the oldest waited Linger, or a Flush asked for them.
func (p *Producer) formDue() error {
	for {
		p.mu.Lock()
		due := p.pending > 0 && (p.pending >= p.cfg.MaxBatchRecords ||
			time.Since(p.pendingSince) >= p.cfg.Linger || p.formTarget > p.nextIndex-uint64(p.pending))
		p.mu.Unlock()
		if !due {
			return nil
		}
		n, err := p.form()
		if err != nil {
			return err
		}
		if p.formLimit < maxFormRecords {
			p.formLimit = min(2*p.formLimit, maxFormRecords)
		}
		if n < maxFormRecords {
			return nil
		}
	}
}

// form moves up to formLimit pending records into batches, in one
// transaction: batches per (customer, epoch), in record order, each within
// MaxBatchRecords and MaxBatchBytes. It returns the records moved.
func (p *Producer) form() (int, error) {
	type group struct {
		first uint64
		recs  []storedRecord
		idx   []uint64
	}
	var moved int
	var formed int
	var damaged []damagedValue
	err := p.db.Update(func(tx *bolt.Tx) error {
		moved, formed, damaged = 0, 0, nil
		pend := tx.Bucket(bucketPending)
		var keys, bad [][]byte
		var recs []*storedRecord // recs[i] is at keys[i]; nil: damaged, not rebuilt
		var badAt []int
		c := pend.Cursor()
		for k, v := c.First(); k != nil && len(keys) < p.formLimit; k, v = c.Next() {
			k = append([]byte(nil), k...)
			keys = append(keys, k)
			var r storedRecord
			if err := openValue(k, v, &r); err != nil {
				// Damaged (New checks pending records only when the
				// epoch ends); it must not hold back the records behind
				// it.
				bad, badAt = append(bad, k), append(badAt, len(recs))
				recs = append(recs, nil)
				continue
			}
			recs = append(recs, &r)
		}
		if len(bad) > 0 {
			var err error
			if damaged, err = salvagePending(tx, bad, p.epoch.Load(), time.Now()); err != nil {
				return err
			}
			for i, d := range damaged { // in the order of bad
				recs[badAt[i]] = d.rebuilt
			}
		}
		groups := make(map[[2]any]*group)
		var order []*group
		for i, k := range keys {
			r := recs[i]
			if r == nil {
				continue
			}
			gk := [2]any{r.Customer, r.Epoch}
			g := groups[gk]
			if g == nil {
				g = &group{first: uint64(i64(k))}
				groups[gk] = g
				order = append(order, g)
			}
			g.recs = append(g.recs, *r)
			g.idx = append(g.idx, uint64(i64(k)))
		}
		batches := tx.Bucket(bucketBatches)
		now := time.Now().UTC()
		for _, g := range order {
			for start := 0; start < len(g.recs); start += p.cfg.MaxBatchRecords {
				end := min(start+p.cfg.MaxBatchRecords, len(g.recs))
				n, err := p.putBatches(batches, g.recs[start:end], g.idx[start:end], now)
				if err != nil {
					return err
				}
				formed += n
			}
		}
		for _, k := range keys {
			if err := pend.Delete(k); err != nil {
				return err
			}
		}
		moved = len(keys)
		return nil
	})
	if err != nil {
		return 0, err
	}
	lost := 0 // set aside and not rebuilt: no longer buffered
	for _, d := range damaged {
		reportDamaged(p.log, p.m, d)
		if d.rebuilt == nil {
			lost++
		}
	}
	p.mu.Lock()
	p.pending -= moved
	if p.pending > 0 {
		p.pendingSince = time.Now()
	}
	p.buffered -= lost
	p.m.buffered.Set(float64(p.buffered))
	p.broadcast()
	p.mu.Unlock()
	p.log.Debug("batches formed", "records", moved, "batches", formed)
	return moved, nil
}

// putBatches encodes recs as one message, halving it until it fits
// MaxBatchBytes, and stores the result under the index of its first record.
func (p *Producer) putBatches(b *bolt.Bucket, recs []storedRecord, idx []uint64, now time.Time) (int, error) {
	id, err := uuid.NewV7()
	if err != nil {
		return 0, err
	}
	batch := wire.Batch{Schema: wire.Schema, BatchID: id, Producer: p.cfg.Producer, Epoch: recs[0].Epoch, SentAt: now,
		Records: make([]wire.Record, len(recs))}
	for i, r := range recs {
		batch.Records[i] = wire.Record{OperationID: r.OperationID, Customer: r.Customer, Meter: r.Meter, Seq: r.Seq,
			Total: r.Total, Quantity: decimal.NewNullDecimal(r.Quantity), OccurredAt: r.OccurredAt, Final: r.Final}
		if r.NoQuantity { // rebuilt from its stream's state (salvagePending)
			batch.Records[i].Quantity = decimal.NullDecimal{}
		}
		if r.Level.Valid || r.Member != "" { // a gauge or unique record carries no total or quantity
			batch.Records[i].Total, batch.Records[i].Quantity = decimal.Decimal{}, decimal.NullDecimal{}
			batch.Records[i].Level, batch.Records[i].Member = r.Level, r.Member
		}
	}
	value, err := wire.Encode(batch)
	var we *wire.Error
	if (err == nil && len(value) > p.cfg.MaxBatchBytes) || (errors.As(err, &we) && we.Reason == wire.ReasonMessageTooLarge) {
		if len(recs) == 1 {
			return 0, fmt.Errorf("one record encodes to %d bytes, above MaxBatchBytes %d", len(value), p.cfg.MaxBatchBytes)
		}
		h := len(recs) / 2
		n1, err := p.putBatches(b, recs[:h], idx[:h], now)
		if err != nil {
			return 0, err
		}
		n2, err := p.putBatches(b, recs[h:], idx[h:], now)
		return n1 + n2, err
	}
	if err != nil {
		// Record checked every field, so this is a bug; the records stay
		// pending and the error is logged on every round, never dropped.
		return 0, fmt.Errorf("encode batch: %w", err)
	}
	k := u64(idx[0])
	v, err := sealValue(k, storedBatch{Key: recs[0].Customer, Value: value, Records: len(recs)})
	if err != nil {
		return 0, err
	}
	return 1, b.Put(k, v)
}

// sendSome sends the oldest stored batches in one write and deletes those
// Kafka acknowledged. It reports whether there was anything to send.
//
// A write carries at most sendBudget bytes of batches. Kafka refuses a
// record batch above its message.max.bytes for one partition ("[10]
// Message Size Too Large"); the writer built by New keeps each partition
// within MaxPartitionBytes, and a refusal all the same (a lower topic
// limit, or a Writer of the caller's) halves sendBudget for the next writes
// and, when one message alone is refused, splits its stored batch in two.
// So any backlog drains, whatever the broker's limit, as long as one record
// fits in it.
func (p *Producer) sendSome() (bool, error) {
	var keys, bad [][]byte
	var msgs []kafka.Message
	var counts []int
	size := 0
	err := p.db.View(func(tx *bolt.Tx) error {
		c := tx.Bucket(bucketBatches).Cursor()
		for k, v := c.First(); k != nil && len(msgs) < maxSendBatches; k, v = c.Next() {
			var b storedBatch
			if err := openValue(k, v, &b); err != nil {
				// New checked it, so it was damaged since; it must not
				// hold back the batches behind it.
				bad = append(bad, append([]byte(nil), k...))
				continue
			}
			if len(msgs) > 0 && size+len(b.Value) > p.sendBudget {
				break
			}
			keys = append(keys, append([]byte(nil), k...))
			msgs = append(msgs, kafka.Message{Key: []byte(b.Key), Value: b.Value})
			counts = append(counts, b.Records)
			size += len(b.Value)
		}
		return nil
	})
	if err == nil && len(bad) > 0 {
		err = p.setBatchesAside(bad)
	}
	if err != nil || len(msgs) == 0 {
		return false, err
	}
	ctx, cancel := context.WithTimeout(p.sendCtx, p.cfg.WriteTimeout)
	werr := p.writer.WriteMessages(ctx, msgs...)
	cancel()
	acked := make([]bool, len(msgs))
	tooLarge := make([]bool, len(msgs))
	var wes kafka.WriteErrors
	var mtl kafka.MessageTooLargeError
	switch {
	case werr == nil:
		for i := range acked {
			acked[i] = true
		}
	case errors.As(werr, &wes) && len(wes) == len(msgs):
		for i, e := range wes {
			acked[i] = e == nil
			tooLarge[i] = errors.Is(e, kafka.MessageSizeTooLarge)
		}
	case errors.Is(werr, kafka.MessageSizeTooLarge) || errors.As(werr, &mtl):
		for i := range tooLarge {
			tooLarge[i] = true
		}
	}
	var done [][]byte
	records, refused := 0, 0
	for i, ok := range acked {
		if ok {
			done = append(done, keys[i])
			records += counts[i]
		}
		if tooLarge[i] {
			refused++
		}
	}
	if len(done) > 0 {
		// A crash before this commit resends these batches: the ledger
		// counts them as duplicates.
		if err := p.db.Update(func(tx *bolt.Tx) error {
			b := tx.Bucket(bucketBatches)
			for _, k := range done {
				if err := b.Delete(k); err != nil {
					return err
				}
			}
			return nil
		}); err != nil {
			return true, fmt.Errorf("delete acknowledged batches: %w", err)
		}
		p.m.batchesSent.Add(float64(len(done)))
		p.mu.Lock()
		p.buffered -= records
		p.m.buffered.Set(float64(p.buffered))
		p.broadcast()
		p.mu.Unlock()
	}
	if refused > 0 {
		return true, p.tooLarge(keys, tooLarge, size, werr)
	}
	p.sendOK++
	if p.sendOK >= budgetRegrow && p.sendBudget < maxSendBytes {
		// A refusal may have been a partition's burst; try more again.
		p.sendBudget = min(2*p.sendBudget, maxSendBytes)
		p.sendOK = 0
		p.m.sendBudget.Set(float64(p.sendBudget))
	}
	if werr != nil {
		return true, fmt.Errorf("%d of %d batches not acknowledged: %w", len(msgs)-len(done), len(msgs), werr)
	}
	return true, nil
}

// setBatchesAside moves damaged stored batches (they fail their checksum
// or do not decode) to the damaged bucket. How many records each held is
// unknown (it is in the damaged value): they stay counted as buffered until the next New
// counts again.
func (p *Producer) setBatchesAside(keys [][]byte) error {
	if err := p.db.Update(func(tx *bolt.Tx) error {
		for _, k := range keys {
			if err := setAside(tx, bucketBatches, k); err != nil {
				return err
			}
		}
		return nil
	}); err != nil {
		return fmt.Errorf("set aside damaged stored batches: %w", err)
	}
	for _, k := range keys {
		reportDamaged(p.log, p.m, damagedValue{bucket: string(bucketBatches), key: k})
	}
	return nil
}

// budgetRegrow is how many writes without a size refusal double a lowered
// sendBudget again.
const budgetRegrow = 64

// tooLarge reacts to Kafka refusing messages of a write of size bytes as
// too large: a write of several messages is retried at once with half the
// bytes; a message refused alone has its batch split in two. Only a single
// record above the broker's limit is an error (retried with backoff, and
// logged, for as long as it takes: nothing is skipped).
func (p *Producer) tooLarge(keys [][]byte, refused []bool, size int, werr error) error {
	n := 0
	for _, r := range refused {
		if r {
			n++
		}
	}
	p.m.tooLarge.Add(float64(n))
	p.sendOK = 0
	if len(keys) > 1 {
		p.sendBudget = max(size/2, 1)
		p.m.sendBudget.Set(float64(p.sendBudget))
		p.log.Warn("Kafka refused messages as too large; sending fewer bytes per write",
			"refused", n, "of", len(keys), "bytes", size, "next_bytes", p.sendBudget, "err", werr)
		return nil
	}
	split, err := p.split(keys[0])
	if err != nil {
		return fmt.Errorf("split a batch Kafka refused as too large: %w", err)
	}
	if !split {
		return fmt.Errorf("kafka refuses a message of one record (%d bytes) as too large; raise the topic's max.message.bytes: %w", size, werr)
	}
	p.m.splits.Inc()
	p.log.Warn("Kafka refused a batch as too large; split it in two", "bytes", size, "err", werr)
	return nil
}

// split replaces the stored batch at key by its two halves: the first keeps
// the key, the second gets the key's index followed by its offset in the
// original batch, so both sort where the batch was and Flush still sees the
// lowest index. The records, their operation ids, seqs and totals are those
// of the batch, so a half the ledger already has is a duplicate. False if
// the batch holds one record.
func (p *Producer) split(key []byte) (bool, error) {
	split := false
	err := p.db.Update(func(tx *bolt.Tx) error {
		b := tx.Bucket(bucketBatches)
		v := b.Get(key)
		if v == nil {
			return nil // acknowledged meanwhile
		}
		var sb storedBatch
		if err := openValue(key, v, &sb); err != nil {
			return fmt.Errorf("stored batch %x is unreadable: %w", key, err)
		}
		batch, _, rejected, err := wire.Decode([]byte(sb.Key), sb.Value)
		if err != nil || len(rejected) > 0 {
			return fmt.Errorf("stored batch %x does not decode: %v %v", key, err, rejected)
		}
		if len(batch.Records) < 2 {
			return nil
		}
		var base uint32
		if len(key) == 12 {
			base = binary.BigEndian.Uint32(key[8:])
		}
		h := len(batch.Records) / 2
		for i, part := range [][]wire.Record{batch.Records[:h], batch.Records[h:]} {
			id, err := uuid.NewV7()
			if err != nil {
				return err
			}
			value, err := wire.Encode(wire.Batch{Schema: wire.Schema, BatchID: id, Producer: batch.Producer,
				Epoch: batch.Epoch, SentAt: batch.SentAt, Records: part})
			if err != nil {
				return fmt.Errorf("encode half of batch %x: %w", key, err)
			}
			k := key
			if i == 1 {
				k = binary.BigEndian.AppendUint32(append([]byte(nil), key[:8]...), base+uint32(h))
			}
			nv, err := sealValue(k, storedBatch{Key: sb.Key, Value: value, Records: len(part)})
			if err != nil {
				return err
			}
			if err := b.Put(k, nv); err != nil {
				return err
			}
		}
		split = true
		return nil
	})
	return split, err
}
