package producer_test

import (
	"bytes"
	"context"
	"encoding/binary"
	"encoding/json"
	"errors"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/shopspring/decimal"
	bolt "go.etcd.io/bbolt"

	"github.com/tally-ledger/tally/ingest/wire"
	"github.com/tally-ledger/tally/producer"
)

// editValue rewrites the value at key of bucket in the state file of dir
// as a bit flip that still decodes would: edit changes its JSON (whatever
// precedes the JSON is kept as it was). It returns the value as damaged.
func editValue(t *testing.T, dir, bucket string, key []byte, edit func(t *testing.T, js []byte) []byte) []byte {
	t.Helper()
	db, err := bolt.Open(filepath.Join(dir, "producer.db"), 0o600, &bolt.Options{Timeout: time.Second})
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	var damaged []byte
	if err := db.Update(func(tx *bolt.Tx) error {
		b := tx.Bucket([]byte(bucket))
		v := b.Get(key)
		i := 0
		if len(v) > 0 && v[0] != '{' {
			i = 5 // sealed: a format byte and a CRC-32C before the JSON
		}
		js := edit(t, append([]byte(nil), v[i:]...))
		damaged = append(append([]byte(nil), v[:i]...), js...)
		return b.Put(key, damaged)
	}); err != nil {
		t.Fatal(err)
	}
	return damaged
}

// replaceOnce replaces the one occurrence of old in b by new.
func replaceOnce(t *testing.T, b []byte, old, new string) []byte {
	t.Helper()
	if n := bytes.Count(b, []byte(old)); n != 1 {
		t.Fatalf("%q occurs %d times in %q, want once", old, n, b)
	}
	return bytes.Replace(b, []byte(old), []byte(new), 1)
}

// A bit flip that leaves a pending record valid JSON (a digit of its
// total, its seq, its time) was sent as is: Kafka received acme's seq 2
// with a total of 9 where 7 was recorded, and the ledger billed 2 more
// than the usage, with nothing to notice. Every value now carries a
// CRC-32C: the record is set aside like one that does not decode, and its
// usage reaches the ledger in the total of the stream's next record.
func TestAPendingRecordDamagedSoItStillDecodesIsSetAside(t *testing.T) {
	for _, tc := range []struct{ name, old, new string }{
		{"total", `"t":"7"`, `"t":"9"`},
		{"seq", `"s":2,`, `"s":6,`},
		{"occurred_at", `"at":"20`, `"at":"21`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			dir := t.TempDir()
			epoch := recordUnsent(t, dir, []usage{
				{"acme", "api_calls", "3"}, {"acme", "api_calls", "4"}, {"acme", "api_calls", "5"}, {"globex", "gb", "1"},
			})
			raw := editValue(t, dir, "pending", binary.BigEndian.AppendUint64(nil, 1), func(t *testing.T, js []byte) []byte {
				return replaceOnce(t, js, tc.old, tc.new)
			})
			expectPendingSetAside(t, dir, epoch, raw)
		})
	}
}

// The same for a stored batch: a digit of a total changed inside its
// encoded message (still valid base64, still a valid batch) was sent as
// is. Now the batch is set aside, and its usage arrives with Close's final
// records.
func TestAStoredBatchDamagedSoItStillDecodesIsSetAside(t *testing.T) {
	dir := t.TempDir()
	epoch := storeBatches(t, dir)

	// acme's batch: its first record is index 0.
	raw := editValue(t, dir, "batches", binary.BigEndian.AppendUint64(nil, 0), func(t *testing.T, js []byte) []byte {
		var b struct {
			Key     string `json:"k"`
			Value   []byte `json:"v"`
			Records int    `json:"n"`
		}
		if err := json.Unmarshal(js, &b); err != nil {
			t.Fatal(err)
		}
		b.Value = replaceOnce(t, b.Value, `"total":"7"`, `"total":"9"`)
		out, err := json.Marshal(b)
		if err != nil {
			t.Fatal(err)
		}
		return out
	})
	expectBatchSetAside(t, dir, epoch, raw)
}

// The same for a stream state: a digit of its total changed, and the
// stream's next record carried a total of 10 where 8 was recorded. Now the
// state is set aside, the epoch ends (its seq and total are unknown) and
// its buffered records are sent.
func TestAStreamStateDamagedSoItStillDecodesEndsTheEpoch(t *testing.T) {
	dir := t.TempDir()
	epoch := recordUnsent(t, dir, []usage{{"acme", "api_calls", "3"}, {"acme", "api_calls", "4"}, {"globex", "gb", "1"}})
	raw := editValue(t, dir, "streams", []byte("acme\x00api_calls"), func(t *testing.T, js []byte) []byte {
		return replaceOnce(t, js, `"total":"7"`, `"total":"9"`)
	})

	expectStreamStateSetAside(t, dir, epoch, "acme/api_calls", raw)
}

// A state file written before values carried a checksum (plain JSON
// values) is read as it was: its batches, pending records, stream states
// and keys are used after an upgrade, and nothing is set aside.
func TestAStateFileWithoutChecksumsIsStillRead(t *testing.T) {
	dir := t.TempDir()
	epoch := time.Now().Add(-time.Hour).UnixMilli()
	at := time.Now().Add(-time.Minute).UTC().Truncate(time.Microsecond)
	atJS, _ := at.MarshalJSON()
	id := func() string { return uuid.Must(uuid.NewV7()).String() }
	// globex's seq 1 is in a batch (index 0); acme's seqs 1 to 3 are pending
	// (indexes 1 to 3), as the producer before checksums wrote them.
	batch, err := wire.Encode(wire.Batch{Schema: wire.Schema, BatchID: uuid.Must(uuid.NewV7()), Producer: "gw-1", Epoch: epoch,
		SentAt: at, Records: []wire.Record{{OperationID: uuid.Must(uuid.NewV7()), Customer: "globex", Meter: "gb", Seq: 1,
			Total: d("1"), Quantity: decimal.NewNullDecimal(d("1")), OccurredAt: at}}})
	if err != nil {
		t.Fatal(err)
	}
	batchJS, err := json.Marshal(map[string]any{"k": "globex", "v": batch, "n": 1})
	if err != nil {
		t.Fatal(err)
	}
	pending := func(seq int, total, q string) []byte {
		return []byte(`{"e":` + itoa(epoch) + `,"o":"` + id() + `","c":"acme","m":"api_calls","s":` + itoa(int64(seq)) +
			`,"t":"` + total + `","q":"` + q + `","at":` + string(atJS) + `}`)
	}
	u64 := func(v uint64) []byte { return binary.BigEndian.AppendUint64(nil, v) }
	values := map[string]map[string][]byte{
		"meta": {"producer": []byte("gw-1"), "epoch": u64(uint64(epoch)), "next_index": u64(4)},
		"streams": {
			"acme\x00api_calls": []byte(`{"seq":3,"total":"12","last":4}`),
			"globex\x00gb":      []byte(`{"seq":1,"total":"1","last":1}`),
		},
		"pending": {string(u64(1)): pending(1, "3", "3"), string(u64(2)): pending(2, "7", "4"), string(u64(3)): pending(3, "12", "5")},
		"batches": {string(u64(0)): batchJS},
		"keys": {"job-1": []byte(`{"c":"acme","m":"api_calls","q":"5","at":` + string(atJS) + `,"e":` + itoa(epoch) +
			`,"s":3,"o":"` + id() + `","t":` + string(atJS) + `}`)},
		"keys_by_time": {string(u64(uint64(at.UnixNano()))) + "job-1": nil},
		"damaged":      {},
	}
	db, err := bolt.Open(filepath.Join(dir, "producer.db"), 0o600, &bolt.Options{Timeout: time.Second})
	if err != nil {
		t.Fatal(err)
	}
	if err := db.Update(func(tx *bolt.Tx) error {
		for name, kv := range values {
			b, err := tx.CreateBucket([]byte(name))
			if err != nil {
				return err
			}
			for k, v := range kv {
				if err := b.Put([]byte(k), v); err != nil {
					return err
				}
			}
		}
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	db.Close()

	c := newCluster(t, 1)
	reg := prometheus.NewRegistry()
	p := newProducer(t, producer.Config{Brokers: c.Addrs, Dir: dir, Registerer: reg})
	if p.Epoch() != epoch || p.Buffered() != 4 {
		t.Fatalf("epoch %d with %d records buffered, want epoch %d continued with 4", p.Epoch(), p.Buffered(), epoch)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	// The stored key answers; the stream continues from its stored state.
	if err := p.Record(ctx, "acme", "api_calls", d("5"), time.Now(), producer.Key("job-1")); err != nil {
		t.Fatalf("a repeated key stored without a checksum: %v", err)
	}
	if err := p.Record(ctx, "acme", "api_calls", d("1"), time.Now()); err != nil {
		t.Fatal(err)
	}
	if err := p.Flush(ctx); err != nil {
		t.Fatal(err)
	}
	checkSent(t, byStream(t, c), map[string][]sent{
		"acme/api_calls": {{seq: 1, total: "3", quantity: "3"}, {seq: 2, total: "7", quantity: "4"},
			{seq: 3, total: "12", quantity: "5"}, {seq: 4, total: "13", quantity: "1"}},
		"globex/gb": {{seq: 1, total: "1", quantity: "1"}},
	})
	if n := counter(t, reg, "tally_producer_damaged_records_total"); n != 0 {
		t.Errorf("tally_producer_damaged_records_total = %v, want 0", n)
	}
	if n := counter(t, reg, "tally_producer_key_repeats_total"); n != 1 {
		t.Errorf("tally_producer_key_repeats_total = %v, want 1", n)
	}
	if err := p.Stop(ctx); err != nil {
		t.Fatal(err)
	}
	if kept := damagedValues(t, dir); len(kept) != 0 {
		t.Errorf("damaged bucket holds %q, want nothing", kept)
	}
}

func itoa(v int64) string { return strconv.FormatInt(v, 10) }

// A stored idempotency key damaged so that it still decodes (a digit of
// its quantity) answered a retry of the very call that stored it with a
// *KeyReusedError naming usage that was never recorded. Now the key fails
// its checksum: the call returns an error that says so, as for a key that
// does not decode, and records nothing (the key is not dropped: its first
// record may be billed, so freeing it could bill a retry twice).
func TestAStoredKeyDamagedSoItStillDecodesIsAnError(t *testing.T) {
	dir := t.TempDir()
	p, err := producer.New(producer.Config{Writer: refuseAll{}, Producer: "gw-1", Dir: dir, Linger: time.Hour,
		RetryMin: time.Second, RetryMax: time.Second})
	if err != nil {
		t.Fatal(err)
	}
	if err := p.Record(context.Background(), "acme", "api_calls", d("5"), time.Now(), producer.Key("job-1")); err != nil {
		t.Fatal(err)
	}
	stopNow, cancel := context.WithCancel(context.Background())
	cancel()
	_ = p.Stop(stopNow)
	editValue(t, dir, "keys", []byte("job-1"), func(t *testing.T, js []byte) []byte {
		return replaceOnce(t, js, `"q":"5"`, `"q":"9"`)
	})

	p = newProducer(t, producer.Config{Writer: refuseAll{}, Dir: dir, Linger: time.Hour})
	err = p.Record(context.Background(), "acme", "api_calls", d("5"), time.Now(), producer.Key("job-1"))
	var reused *producer.KeyReusedError
	if err == nil || errors.As(err, &reused) || !strings.Contains(err.Error(), "CRC-32C") {
		t.Errorf("a retry under a damaged key returned %v, want an error that says the key fails its checksum", err)
	}
	if p.Buffered() != 1 {
		t.Errorf("buffered %d, want 1: the retry records nothing", p.Buffered())
	}
}

// A bit flip in a stream state's key (its customer "acme" read as "acmf")
// left acme with no state in the same epoch: its next record started again
// at seq 1, a seq the ledger already holds, so that usage was a conflict,
// not billed. The checksum covers the key too: the state under the
// altered key is set aside, the epoch ends, and acme starts anew in a new
// epoch.
func TestAStreamStateUnderADamagedKeyEndsTheEpoch(t *testing.T) {
	dir := t.TempDir()
	epoch := recordUnsent(t, dir, []usage{{"acme", "api_calls", "3"}, {"acme", "api_calls", "4"}, {"globex", "gb", "1"}})
	db, err := bolt.Open(filepath.Join(dir, "producer.db"), 0o600, &bolt.Options{Timeout: time.Second})
	if err != nil {
		t.Fatal(err)
	}
	var raw []byte
	if err := db.Update(func(tx *bolt.Tx) error {
		b := tx.Bucket([]byte("streams"))
		raw = append([]byte(nil), b.Get([]byte("acme\x00api_calls"))...)
		if err := b.Delete([]byte("acme\x00api_calls")); err != nil {
			return err
		}
		return b.Put([]byte("acmf\x00api_calls"), raw) // 'e' ^ 0x03: two bits of one byte
	}); err != nil {
		t.Fatal(err)
	}
	db.Close()
	expectStreamStateSetAside(t, dir, epoch, "acmf/api_calls", raw)
}
