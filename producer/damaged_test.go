package producer_test

import (
	"bytes"
	"context"
	"encoding/binary"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"regexp"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	bolt "go.etcd.io/bbolt"

	"github.com/tally-ledger/tally/internal/kafkatest"
	"github.com/tally-ledger/tally/producer"
)

type usage struct{ customer, meter, q string }

// recordUnsent records us with Kafka down and stops at once, so that every
// record stays pending in dir (indexes 0, 1, … in the order of us).
func recordUnsent(t *testing.T, dir string, us []usage) int64 {
	t.Helper()
	p, err := producer.New(producer.Config{Writer: refuseAll{}, Producer: "gw-1", Dir: dir, Linger: time.Hour,
		RetryMin: time.Second, RetryMax: time.Second})
	if err != nil {
		t.Fatal(err)
	}
	for _, u := range us {
		if err := p.Record(context.Background(), u.customer, u.meter, d(u.q), time.Now().Add(-time.Minute)); err != nil {
			t.Fatal(err)
		}
	}
	epoch := p.Epoch()
	stopNow, cancel := context.WithCancel(context.Background())
	cancel()
	_ = p.Stop(stopNow)
	return epoch
}

// damagePending flips one bit of the first byte of the pending record at
// index in the state file of dir (its format byte), as a bad sector or a
// bad DIMM might, and returns the damaged value.
func damagePending(t *testing.T, dir string, index uint64) []byte {
	t.Helper()
	db, err := bolt.Open(filepath.Join(dir, "producer.db"), 0o600, &bolt.Options{Timeout: time.Second})
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	var damaged []byte
	if err := db.Update(func(tx *bolt.Tx) error {
		b := tx.Bucket([]byte("pending"))
		k := binary.BigEndian.AppendUint64(nil, index)
		v := b.Get(k)
		if v == nil {
			t.Fatalf("no pending record at index %d", index)
		}
		damaged = append([]byte(nil), v...)
		damaged[0] ^= 0x01
		return b.Put(k, damaged)
	}); err != nil {
		t.Fatal(err)
	}
	return damaged
}

// damagedValues reads the damaged bucket of the state file in dir, by
// bucket/index.
func damagedValues(t *testing.T, dir string) map[string][]byte {
	t.Helper()
	db, err := bolt.Open(filepath.Join(dir, "producer.db"), 0o600, &bolt.Options{Timeout: time.Second, ReadOnly: true})
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	out := map[string][]byte{}
	if err := db.View(func(tx *bolt.Tx) error {
		b := tx.Bucket([]byte("damaged"))
		if b == nil {
			return nil
		}
		return b.ForEach(func(k, v []byte) error {
			bucket, index, ok := bytes.Cut(k, []byte{0})
			if ok && string(bucket) == "streams" { // customer 0x00 meter
				out["streams/"+string(bytes.ReplaceAll(index, []byte{0}, []byte{'/'}))] = append([]byte(nil), v...)
				return nil
			}
			if !ok || len(index) < 8 {
				t.Errorf("damaged bucket key %q is not bucket, 0x00, index", k)
				return nil
			}
			out[fmt.Sprintf("%s/%d", bucket, binary.BigEndian.Uint64(index))] = append([]byte(nil), v...)
			return nil
		})
	}); err != nil {
		t.Fatal(err)
	}
	return out
}

type sent struct {
	seq             int64
	total, quantity string // quantity "" when the record carries none
	final           bool
	member          string
}

// byStream reads every record on the topic (one partition), by
// customer/meter, in offset order.
func byStream(t *testing.T, c *kafkatest.Cluster) map[string][]sent {
	t.Helper()
	out := map[string][]sent{}
	for _, b := range readBatches(t, c, 1) {
		for _, r := range b.Records {
			s := sent{seq: r.Seq, final: r.Final, member: r.Member}
			if r.Member == "" && !r.Level.Valid {
				s.total = r.Total.String()
			}
			if r.Quantity.Valid {
				s.quantity = r.Quantity.Decimal.String()
			}
			out[r.Customer+"/"+r.Meter] = append(out[r.Customer+"/"+r.Meter], s)
		}
	}
	return out
}

func checkSent(t *testing.T, got, want map[string][]sent) {
	t.Helper()
	for k, w := range want {
		g := got[k]
		if len(g) != len(w) {
			t.Errorf("%s: sent %+v, want %+v", k, g, w)
			continue
		}
		for i := range w {
			if g[i] != w[i] {
				t.Errorf("%s[%d]: sent %+v, want %+v", k, i, g[i], w[i])
			}
		}
	}
	for k, g := range got {
		if _, ok := want[k]; !ok {
			t.Errorf("%s: sent %+v, want nothing", k, g)
		}
	}
}

// A pending record whose value no longer decodes held back every record
// formed after it: batches were formed in one transaction that failed on
// it, so the sender retried that transaction for ever and acknowledged
// usage never reached Kafka. Now the damaged bytes are kept aside in the
// damaged bucket, counted and logged, and the others are sent; the usage
// of the damaged record is in the total of the stream's next record.
func TestADamagedPendingRecordDoesNotHoldBackTheOthers(t *testing.T) {
	dir := t.TempDir()
	epoch := recordUnsent(t, dir, []usage{
		{"acme", "api_calls", "3"}, {"acme", "api_calls", "4"}, {"acme", "api_calls", "5"}, {"globex", "gb", "1"},
	})
	raw := damagePending(t, dir, 1) // acme's seq 2
	expectPendingSetAside(t, dir, epoch, raw)
}

// expectPendingSetAside checks what a producer does with dir, whose
// pending record at index 1 (acme's seq 2 of recordUnsent's 3, 4 and 5 of
// acme/api_calls and 1 of globex/gb, in epoch) is damaged and raw now:
// the epoch goes on, the others are sent, acme's usage of seq 2 arrives in
// seq 3's total, and the record is counted and set aside as it was.
func expectPendingSetAside(t *testing.T, dir string, epoch int64, raw []byte) {
	t.Helper()
	c := newCluster(t, 1)
	reg := prometheus.NewRegistry()
	p := newProducer(t, producer.Config{Brokers: c.Addrs, Dir: dir, Registerer: reg})
	if p.Epoch() != epoch {
		t.Errorf("epoch %d after one damaged record, want %d: the rest of the state is intact", p.Epoch(), epoch)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	if err := p.Flush(ctx); err != nil {
		t.Fatalf("the records after the damaged one were not sent: %v", err)
	}
	got := byStream(t, c)
	want := map[string][]sent{
		"acme/api_calls": {{seq: 1, total: "3", quantity: "3"}, {seq: 3, total: "12", quantity: "5"}},
		"globex/gb":      {{seq: 1, total: "1", quantity: "1"}},
	}
	checkSent(t, got, want)
	if n := counter(t, reg, "tally_producer_damaged_records_total"); n != 1 {
		t.Errorf("tally_producer_damaged_records_total = %v, want 1", n)
	}
	if p.Buffered() != 0 {
		t.Errorf("buffered %d after Flush, want 0", p.Buffered())
	}
	if err := p.Stop(ctx); err != nil {
		t.Fatal(err)
	}
	if kept := damagedValues(t, dir); len(kept) != 1 || !bytes.Equal(kept["pending/1"], raw) {
		t.Errorf("damaged bucket holds %q, want the damaged bytes %q as pending/1", kept, raw)
	}
}

// When the damaged record is its stream's last, no later record carries
// its usage (none may ever come, and Stop writes no final record). The
// stream state holds that record's seq and total, so it is rebuilt from
// there: same seq and total, a new operation id, no quantity (a counter),
// the last member again at its time (a unique meter), or the final record
// again.
func TestADamagedLastRecordOfAStreamIsRebuiltFromItsState(t *testing.T) {
	dir := t.TempDir()
	recordUnsent(t, dir, []usage{
		{"acme", "api_calls", "3"}, {"acme", "api_calls", "4"}, {"globex", "gb", "1"},
	})
	damagePending(t, dir, 1) // acme's seq 2, its last

	c := newCluster(t, 1)
	reg := prometheus.NewRegistry()
	p := newProducer(t, producer.Config{Brokers: c.Addrs, Dir: dir, Registerer: reg})
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	if err := p.Flush(ctx); err != nil {
		t.Fatalf("the records after the damaged one were not sent: %v", err)
	}
	checkSent(t, byStream(t, c), map[string][]sent{
		"acme/api_calls": {{seq: 1, total: "3", quantity: "3"}, {seq: 2, total: "7"}},
		"globex/gb":      {{seq: 1, total: "1", quantity: "1"}},
	})
	if n := counter(t, reg, "tally_producer_damaged_records_total"); n != 1 {
		t.Errorf("tally_producer_damaged_records_total = %v, want 1", n)
	}
	// The stream continues after the rebuilt record.
	if err := p.Record(ctx, "acme", "api_calls", d("1"), time.Now()); err != nil {
		t.Fatal(err)
	}
	if err := p.Flush(ctx); err != nil {
		t.Fatal(err)
	}
	if got := byStream(t, c)["acme/api_calls"]; len(got) != 3 || got[2] != (sent{seq: 3, total: "8", quantity: "1"}) {
		t.Errorf("acme after the rebuilt record: %+v, want seq 3 with total 8 last", got)
	}
}

// A stored batch that did not decode made the whole state file unreadable
// at New: it was moved aside, with every other batch and pending record in
// it, and a new epoch started, so all of that acknowledged usage was never
// sent. Now the batch alone is set aside; the others are sent, the epoch
// goes on, and the damaged batch's usage reaches the ledger in the total
// of its streams' next records (here Close's final record).
func TestADamagedStoredBatchIsSetAsideAlone(t *testing.T) {
	dir := t.TempDir()
	epoch := storeBatches(t, dir)

	db, err := bolt.Open(filepath.Join(dir, "producer.db"), 0o600, &bolt.Options{Timeout: time.Second})
	if err != nil {
		t.Fatal(err)
	}
	var raw []byte
	if err := db.Update(func(tx *bolt.Tx) error {
		if n := tx.Bucket([]byte("pending")).Stats().KeyN; n != 0 {
			t.Fatalf("%d records still pending after Stop; want them all in batches", n)
		}
		b := tx.Bucket([]byte("batches"))
		k := binary.BigEndian.AppendUint64(nil, 0) // acme's batch: its first record is index 0
		if v := b.Get(k); v == nil || b.Stats().KeyN != 2 {
			t.Fatalf("want acme's batch at index 0 and globex's; have %d batches", b.Stats().KeyN)
		} else {
			raw = append([]byte(nil), v...)
		}
		raw[0] ^= 0x01
		return b.Put(k, raw)
	}); err != nil {
		t.Fatal(err)
	}
	db.Close()
	expectBatchSetAside(t, dir, epoch, raw)
}

// storeBatches records acme's 3 and 4 of api_calls and globex's 1 of gb
// in dir while Kafka refuses everything, and stops: Stop forms every
// record into a batch (one per customer: nothing is formed before, the
// linger being a minute) and gives up. It returns the epoch.
func storeBatches(t *testing.T, dir string) int64 {
	t.Helper()
	p, err := producer.New(producer.Config{Writer: refuseAll{}, Producer: "gw-1", Dir: dir, Linger: time.Minute,
		RetryMin: 10 * time.Millisecond, RetryMax: 10 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	for _, u := range []usage{{"acme", "api_calls", "3"}, {"acme", "api_calls", "4"}, {"globex", "gb", "1"}} {
		if err := p.Record(context.Background(), u.customer, u.meter, d(u.q), time.Now().Add(-time.Minute)); err != nil {
			t.Fatal(err)
		}
	}
	epoch := p.Epoch()
	stopCtx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	_ = p.Stop(stopCtx)
	return epoch
}

// expectBatchSetAside checks what a producer does with dir of
// storeBatches (epoch) whose acme batch (raw now) was damaged: the epoch
// goes on, the batch is counted and set aside, globex's batch is sent and
// Close's final records carry acme's usage.
func expectBatchSetAside(t *testing.T, dir string, epoch int64, raw []byte) {
	t.Helper()
	c := newCluster(t, 1)
	reg := prometheus.NewRegistry()
	p := newProducer(t, producer.Config{Brokers: c.Addrs, Dir: dir, Registerer: reg})
	if p.Epoch() != epoch {
		t.Errorf("epoch %d after one damaged batch, want %d: the rest of the state is intact", p.Epoch(), epoch)
	}
	if n := counter(t, reg, "tally_producer_damaged_records_total"); n != 1 {
		t.Errorf("tally_producer_damaged_records_total = %v, want 1", n)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	if err := p.Close(ctx); err != nil {
		t.Fatal(err)
	}
	checkSent(t, byStream(t, c), map[string][]sent{
		"acme/api_calls": {{seq: 3, total: "7", quantity: "0", final: true}},
		"globex/gb":      {{seq: 1, total: "1", quantity: "1"}, {seq: 2, total: "1", quantity: "0", final: true}},
	})
	if kept := damagedValues(t, dir); len(kept) != 1 || !bytes.Equal(kept["batches/0"], raw) {
		t.Errorf("damaged bucket holds %q, want the damaged batch %q as batches/0", kept, raw)
	}
}

// A stream state that did not decode made the whole state file unreadable:
// it was moved aside with every buffered record in it, never sent. The
// stream's seq and total are unknown, so the epoch cannot go on; but its
// records can still be sent. Now the state is set aside alone, a new epoch
// begins, and the old epoch's buffered records are sent.
func TestADamagedStreamStateEndsTheEpochButItsRecordsAreSent(t *testing.T) {
	dir := t.TempDir()
	epoch := recordUnsent(t, dir, []usage{{"acme", "api_calls", "3"}, {"acme", "api_calls", "4"}, {"globex", "gb", "1"}})
	db, err := bolt.Open(filepath.Join(dir, "producer.db"), 0o600, &bolt.Options{Timeout: time.Second})
	if err != nil {
		t.Fatal(err)
	}
	var raw []byte
	if err := db.Update(func(tx *bolt.Tx) error {
		b := tx.Bucket([]byte("streams"))
		k := []byte("acme\x00api_calls")
		raw = append([]byte(nil), b.Get(k)...)
		raw[0] ^= 0x01
		return b.Put(k, raw)
	}); err != nil {
		t.Fatal(err)
	}
	db.Close()
	expectStreamStateSetAside(t, dir, epoch, "acme/api_calls", raw)
}

// expectStreamStateSetAside checks what a producer does with dir, whose
// acme/api_calls stream state was damaged after recordUnsent (3 and 4 of
// acme/api_calls, 1 of globex/gb) returned epoch, and is now raw under
// the stream key (customer/meter) damaged: it starts a new epoch, counts
// and sets the state aside, sends the old epoch's records, and acme's
// next record starts at seq 1 of the new epoch.
func expectStreamStateSetAside(t *testing.T, dir string, epoch int64, damaged string, raw []byte) {
	t.Helper()
	c := newCluster(t, 1)
	reg := prometheus.NewRegistry()
	p := newProducer(t, producer.Config{Brokers: c.Addrs, Dir: dir, Registerer: reg})
	if p.Epoch() <= epoch {
		t.Errorf("epoch %d after a damaged stream state, want a new one above %d", p.Epoch(), epoch)
	}
	if n := counter(t, reg, "tally_producer_damaged_records_total"); n != 1 {
		t.Errorf("tally_producer_damaged_records_total = %v, want 1", n)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	if err := p.Record(ctx, "acme", "api_calls", d("1"), time.Now()); err != nil {
		t.Fatal(err)
	}
	if err := p.Stop(ctx); err != nil {
		t.Fatal(err)
	}
	var epochs []int64
	for _, b := range readBatches(t, c, 1) {
		for _, r := range b.Records {
			if r.Customer == "acme" {
				epochs = append(epochs, b.Epoch)
			}
		}
	}
	if len(epochs) != 3 || epochs[2] == epochs[0] {
		t.Errorf("acme's records went out in epochs %v, want its third in a new epoch", epochs)
	}
	checkSent(t, byStream(t, c), map[string][]sent{
		"acme/api_calls": {{seq: 1, total: "3", quantity: "3"}, {seq: 2, total: "7", quantity: "4"}, {seq: 1, total: "1", quantity: "1"}},
		"globex/gb":      {{seq: 1, total: "1", quantity: "1"}},
	})
	if kept := damagedValues(t, dir); len(kept) != 1 || !bytes.Equal(kept["streams/"+damaged], raw) {
		t.Errorf("damaged bucket holds %q, want the damaged state %q as streams/%s", kept, raw, damaged)
	}
}

// A pending record damaged while the producer runs (New decoded it) is set
// aside when batches are formed, and holds back nothing. The file is
// written under bbolt, as a failing disk would: bbolt reads it through a
// shared mapping, so the damaged bytes are what forming reads.
func TestAPendingRecordDamagedWhileRunningIsSetAsideWhenFormed(t *testing.T) {
	c := newCluster(t, 1)
	reg := prometheus.NewRegistry()
	dir := t.TempDir()
	// A long Linger keeps the records pending until Flush.
	p := newProducer(t, producer.Config{Brokers: c.Addrs, Dir: dir, Registerer: reg, Linger: time.Hour})
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	for _, u := range []usage{{"acme", "api_calls", "3"}, {"acme", "api_calls", "4"}, {"acme", "api_calls", "5"}, {"globex", "gb", "1"}} {
		if err := p.Record(ctx, u.customer, u.meter, d(u.q), time.Now().Add(-time.Minute)); err != nil {
			t.Fatal(err)
		}
	}
	f, err := os.OpenFile(filepath.Join(dir, "producer.db"), os.O_RDWR, 0)
	if err != nil {
		t.Fatal(err)
	}
	b, err := io.ReadAll(f)
	if err != nil {
		t.Fatal(err)
	}
	// acme's seq 2, wherever a page holds it (freed pages may hold older
	// copies of its leaf).
	rec := regexp.MustCompile(`\{"e":\d+,"o":"[0-9a-f-]+","c":"acme","m":"api_calls","s":2,`)
	hits := rec.FindAllIndex(b, -1)
	if len(hits) == 0 {
		t.Fatal("acme's seq 2 not found in the state file")
	}
	for _, h := range hits {
		if _, err := f.WriteAt([]byte{b[h[0]] ^ 0x01}, int64(h[0])); err != nil {
			t.Fatal(err)
		}
	}
	f.Close()
	if err := p.Flush(ctx); err != nil {
		t.Fatalf("the records after the damaged one were not sent: %v", err)
	}
	checkSent(t, byStream(t, c), map[string][]sent{
		"acme/api_calls": {{seq: 1, total: "3", quantity: "3"}, {seq: 3, total: "12", quantity: "5"}},
		"globex/gb":      {{seq: 1, total: "1", quantity: "1"}},
	})
	if n := counter(t, reg, "tally_producer_damaged_records_total"); n != 1 {
		t.Errorf("tally_producer_damaged_records_total = %v, want 1", n)
	}
	if p.Buffered() != 0 {
		t.Errorf("buffered %d after Flush, want 0", p.Buffered())
	}
}

// New decodes the pending records when the epoch ends (here because
// another stream's state is damaged): the stream states a damaged record
// is rebuilt from are deleted by the new epoch, so it is rebuilt before.
func TestADamagedLastRecordIsRebuiltBeforeANewEpoch(t *testing.T) {
	dir := t.TempDir()
	epoch := recordUnsent(t, dir, []usage{{"acme", "api_calls", "3"}, {"acme", "api_calls", "4"}, {"globex", "gb", "1"}})
	damagePending(t, dir, 1) // acme's seq 2, its last
	db, err := bolt.Open(filepath.Join(dir, "producer.db"), 0o600, &bolt.Options{Timeout: time.Second})
	if err != nil {
		t.Fatal(err)
	}
	if err := db.Update(func(tx *bolt.Tx) error {
		b := tx.Bucket([]byte("streams"))
		k := []byte("globex\x00gb")
		v := append([]byte(nil), b.Get(k)...)
		v[0] ^= 0x01
		return b.Put(k, v)
	}); err != nil {
		t.Fatal(err)
	}
	db.Close()

	c := newCluster(t, 1)
	reg := prometheus.NewRegistry()
	p := newProducer(t, producer.Config{Brokers: c.Addrs, Dir: dir, Registerer: reg})
	if p.Epoch() <= epoch {
		t.Errorf("epoch %d after a damaged stream state, want a new one above %d", p.Epoch(), epoch)
	}
	if n := counter(t, reg, "tally_producer_damaged_records_total"); n != 2 {
		t.Errorf("tally_producer_damaged_records_total = %v, want 2 (found by New)", n)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	if err := p.Flush(ctx); err != nil {
		t.Fatal(err)
	}
	checkSent(t, byStream(t, c), map[string][]sent{
		"acme/api_calls": {{seq: 1, total: "3", quantity: "3"}, {seq: 2, total: "7"}},
		"globex/gb":      {{seq: 1, total: "1", quantity: "1"}},
	})
}
