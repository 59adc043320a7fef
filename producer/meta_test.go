package producer_test

import (
	"context"
	"encoding/binary"
	"math/bits"
	"path/filepath"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	bolt "go.etcd.io/bbolt"

	"github.com/tally-ledger/tally/producer"
)

// flipMeta flips bit of the number stored under key in the state file's
// meta bucket (its last 8 bytes, whatever precedes them kept), as a bad
// sector might; bit -1 is the highest bit set, so the number falls. It
// returns the number before and after.
func flipMeta(t *testing.T, dir, key string, bit int) (before, after uint64) {
	t.Helper()
	db, err := bolt.Open(filepath.Join(dir, "producer.db"), 0o600, &bolt.Options{Timeout: time.Second})
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	if err := db.Update(func(tx *bolt.Tx) error {
		b := tx.Bucket([]byte("meta"))
		v := append([]byte(nil), b.Get([]byte(key))...)
		if len(v) < 8 {
			t.Fatalf("meta %s is %d bytes, want at least 8", key, len(v))
		}
		n := v[len(v)-8:]
		before = binary.BigEndian.Uint64(n)
		if bit < 0 {
			bit = bits.Len64(before) - 1
		}
		after = before ^ 1<<bit
		binary.BigEndian.PutUint64(n, after)
		return b.Put([]byte(key), v)
	}); err != nil {
		t.Fatal(err)
	}
	return before, after
}

// A bit flip in the stored epoch was taken as the epoch: the producer went
// on in an epoch below the one its records had been sent in, with the
// seqs of the old one, and the ledger takes a stream's records of an older
// epoch as superseded: usage recorded and acknowledged, never billed. The
// epoch is sealed like every value now: a damaged one ends the epoch, and
// the new one is above every epoch the file still names.
func TestADamagedEpochStartsANewEpochAboveTheOld(t *testing.T) {
	dir := t.TempDir()
	epoch := recordUnsent(t, dir, []usage{{"acme", "api_calls", "3"}, {"acme", "api_calls", "4"}})
	if before, _ := flipMeta(t, dir, "epoch", -1); before != uint64(epoch) {
		t.Fatalf("stored epoch %d, Epoch() said %d", before, epoch)
	}

	c := newCluster(t, 1)
	reg := prometheus.NewRegistry()
	p := newProducer(t, producer.Config{Brokers: c.Addrs, Dir: dir, Registerer: reg})
	if p.Epoch() <= epoch {
		t.Errorf("epoch %d after the stored epoch %d was damaged, want a new epoch above %d", p.Epoch(), epoch, epoch)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	if err := p.Record(ctx, "acme", "api_calls", d("5"), time.Now()); err != nil {
		t.Fatal(err)
	}
	if err := p.Flush(ctx); err != nil {
		t.Fatal(err)
	}
	type rec struct{ epoch, seq int64 }
	var got []rec
	for _, b := range readBatches(t, c, 1) {
		for _, r := range b.Records {
			got = append(got, rec{b.Epoch, r.Seq})
		}
	}
	want := []rec{{epoch, 1}, {epoch, 2}, {p.Epoch(), 1}}
	if len(got) != len(want) {
		t.Fatalf("sent (epoch, seq) %v, want %v", got, want)
	}
	for i := range want {
		if got[i] != want[i] {
			t.Errorf("sent (epoch, seq) %v, want %v", got, want)
			break
		}
	}
	if n := counter(t, reg, "tally_producer_damaged_records_total"); n != 1 {
		t.Errorf("tally_producer_damaged_records_total = %v, want 1", n)
	}
}

// A bit flip in the stored next record index made the next Record reuse
// the index of a record still waiting to be sent and overwrite it: globex's
// only record was replaced by acme's next, and globex's usage never
// reached Kafka. The index is sealed now: a damaged one is found again
// from what the file holds, past every record and stream in it.
func TestADamagedNextIndexOverwritesNoRecord(t *testing.T) {
	dir := t.TempDir()
	recordUnsent(t, dir, []usage{{"acme", "api_calls", "3"}, {"acme", "api_calls", "4"}, {"globex", "gb", "1"}})
	if before, after := flipMeta(t, dir, "next_index", 0); before != 3 || after != 2 {
		t.Fatalf("next_index %d → %d, want 3 → 2", before, after)
	}

	// Still unsent when the next record commits.
	recordUnsent(t, dir, []usage{{"acme", "api_calls", "5"}})

	c := newCluster(t, 1)
	p := newProducer(t, producer.Config{Brokers: c.Addrs, Dir: dir})
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	if err := p.Flush(ctx); err != nil {
		t.Fatal(err)
	}
	got := byStream(t, c)
	acme := got["acme/api_calls"]
	if len(acme) == 0 || acme[len(acme)-1].total != "12" {
		t.Errorf("acme sent %+v, want its last total 12", acme)
	}
	if g := got["globex/gb"]; len(g) != 1 || g[0].total != "1" {
		t.Errorf("globex sent %+v, want its one record (total 1): it was overwritten", g)
	}
}

// A bit flip in the time under which an idempotency key is filed for
// pruning (keys_by_time) made the key look hours older: the next commit
// deleted it, well within KeyRetention, and a retry of the same call under
// that key recorded the usage a second time. A key is deleted only when
// its own sealed value says it was stored before the cut-off.
func TestAKeyFiledUnderADamagedTimeIsKept(t *testing.T) {
	dir := t.TempDir()
	cfg := producer.Config{Writer: refuseAll{}, Producer: "gw-1", Dir: dir, Linger: time.Hour,
		RetryMin: time.Second, RetryMax: time.Second, KeyRetention: time.Hour}
	p, err := producer.New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	if err := p.Record(ctx, "acme", "api_calls", d("5"), time.Now(), producer.Key("job-1")); err != nil {
		t.Fatal(err)
	}
	stopNow, cancel := context.WithCancel(ctx)
	cancel()
	_ = p.Stop(stopNow)

	db, err := bolt.Open(filepath.Join(dir, "producer.db"), 0o600, &bolt.Options{Timeout: time.Second})
	if err != nil {
		t.Fatal(err)
	}
	if err := db.Update(func(tx *bolt.Tx) error {
		b := tx.Bucket([]byte("keys_by_time"))
		k, _ := b.Cursor().First()
		if k == nil || string(k[8:]) != "job-1" {
			t.Fatalf("keys_by_time starts with %q, want job-1's entry", k)
		}
		damaged := append([]byte(nil), k...)
		ns := binary.BigEndian.Uint64(damaged)
		// The highest bit set worth more than the retention: hours earlier.
		hi := bits.Len64(ns) - 1
		binary.BigEndian.PutUint64(damaged, ns^1<<hi)
		if err := b.Delete(k); err != nil {
			return err
		}
		return b.Put(damaged, nil)
	}); err != nil {
		t.Fatal(err)
	}
	db.Close()

	p = newProducer(t, producer.Config{Writer: refuseAll{}, Dir: dir, Linger: time.Hour, KeyRetention: time.Hour})
	// Another record commits, and prunes what looks expired.
	if err := p.Record(ctx, "globex", "gb", d("1"), time.Now()); err != nil {
		t.Fatal(err)
	}
	if err := p.Record(ctx, "acme", "api_calls", d("5"), time.Now(), producer.Key("job-1")); err != nil {
		t.Fatal(err)
	}
	if p.Buffered() != 2 {
		t.Errorf("buffered %d, want 2: the retry under job-1 recorded its usage again", p.Buffered())
	}
}
