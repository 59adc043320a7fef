package producer

import (
	"bytes"
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"hash/crc32"
	"hash/fnv"
	"io/fs"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/google/uuid"
	"github.com/shopspring/decimal"
	bolt "go.etcd.io/bbolt"
	bolterrors "go.etcd.io/bbolt/errors"
)

// The state file and its buckets.
//
//	meta     producer, epoch, epoch_closed, next_index
//	streams  customer 0x00 meter → streamState of the current epoch
//	pending  index (8 bytes, big endian) → storedRecord not yet in a batch
//	batches  index of its first record → storedBatch, formed, not yet acked
//	         (index ‖ u32 offset for the later half of a split batch)
//	keys     a caller's idempotency key (Key) → storedKey, written in the
//	         commit of its record; kept across epochs for KeyRetention
//	keys_by_time  stored-at nanoseconds (8 bytes, big endian) ‖ key → nil,
//	         the order expired keys are deleted in
//	damaged  bucket name ‖ 0x00 ‖ key → a pending record, stored batch or
//	         stream state whose value was damaged, as it was (salvage)
//
// The values of streams, pending, batches and keys are sealed (sealValue):
// a format byte, a CRC-32C of the key and the JSON, the JSON. bbolt checksums its meta
// pages only, so a bit flip in a data page that leaves the JSON valid (a
// digit of a total, a seq, a time) would otherwise be sent as is and
// billed. A value written before values were sealed is plain JSON and is
// read as it is. The meta bucket's epoch and next_index are sealed too
// (putNumber); keys_by_time's keys are checked against the keys' own
// values before a key is deleted (putKeys).
//
// Record indexes grow by one per record ever stored in this file, so
// "everything below index i has been acknowledged by Kafka" is a single
// comparison (Flush).
const stateFile = "producer.db"

var (
	bucketMeta    = []byte("meta")
	bucketStreams = []byte("streams")
	bucketPending = []byte("pending")
	bucketBatches = []byte("batches")
	bucketKeys    = []byte("keys")
	// keys by when they were stored, for pruning
	bucketKeysByTime = []byte("keys_by_time")
	bucketDamaged    = []byte("damaged")

	keyProducer    = []byte("producer")
	keyEpoch       = []byte("epoch")
	keyEpochClosed = []byte("epoch_closed")
	// epoch_closing: Close began writing final records (and may not have
	// finished); the epoch is not continued.
	keyEpochClosing = []byte("epoch_closing")
	keyNextIndex    = []byte("next_index")
)

type streamKey struct{ customer, meter string }

func (k streamKey) bytes() []byte { return []byte(k.customer + "\x00" + k.meter) }

func parseStreamKey(b []byte) (streamKey, bool) {
	i := bytes.IndexByte(b, 0)
	if i < 0 {
		return streamKey{}, false
	}
	return streamKey{string(b[:i]), string(b[i+1:])}, true
}

type streamState struct {
	Seq   int64           `json:"seq"`
	Total decimal.Decimal `json:"total"`
	Final bool            `json:"final,omitempty"` // its final record is written (Close)
	// Shape is "gauge" or "unique" for a stream of RecordLevel or
	// RecordMember ("" for Record); Member is a unique stream's last
	// member, which its final record repeats at At, when it was recorded
	// (a sighting at any other time could count it where it was never
	// active). At is a gauge's last reading's time: its next reading
	// cannot be earlier.
	Shape  string    `json:"shape,omitempty"`
	Member string    `json:"member,omitempty"`
	At     time.Time `json:"at,omitzero"`
	// Last is the index of the stream's last record plus one (0: not
	// known, a state written before Last was kept). When that record is
	// found damaged before it was sent, it is rebuilt from this state.
	Last uint64 `json:"last,omitempty"`
}

// storedRecord is a record as Record made it durable; batches are formed
// from these without changing any field.
type storedRecord struct {
	Epoch       int64           `json:"e"`
	OperationID uuid.UUID       `json:"o"`
	Customer    string          `json:"c"`
	Meter       string          `json:"m"`
	Seq         int64           `json:"s"`
	Total       decimal.Decimal `json:"t"`
	Quantity    decimal.Decimal `json:"q"`
	OccurredAt  time.Time       `json:"at"`
	Final       bool            `json:"f,omitempty"`
	// A gauge record carries Level instead of a total, a unique record
	// Member (docs/design.md §16).
	Level  decimal.NullDecimal `json:"l,omitempty"`
	Member string              `json:"mb,omitempty"`
	// NoQuantity: the record was rebuilt from its stream's state, which
	// keeps the total but not the quantity; it is sent without one.
	NoQuantity bool `json:"nq,omitempty"`
}

// storedBatch is an encoded message, sent as is on every attempt.
type storedBatch struct {
	Key     string `json:"k"`
	Value   []byte `json:"v"`
	Records int    `json:"n"`
}

// valueSealed is the first byte of a sealed value; then come the
// CRC-32C (Castagnoli) of the value's key and JSON, 4 bytes big endian,
// and the JSON. The key is covered too: a stream state under a damaged key
// would otherwise leave its stream without a state in the same epoch, and
// its next record would give seq 1 again. A value written before values
// were sealed is a JSON object, so it starts with '{' (0x7b), five bits
// away from valueSealed: a single bit flip cannot turn one format into the
// other.
const valueSealed = 0x01

const sealLen = 5 // valueSealed and the CRC

var castagnoli = crc32.MakeTable(crc32.Castagnoli)

// errChecksum: a sealed value whose key and JSON do not match its CRC.
var errChecksum = errors.New("its CRC-32C does not match")

func sealSum(key, js []byte) uint32 {
	return crc32.Update(crc32.Checksum(key, castagnoli), castagnoli, js)
}

// sealValue encodes v, to be stored at key, as JSON and seals it
// (valueSealed, CRC-32C, JSON): one CRC per value written, in the same
// transaction.
func sealValue(key []byte, v any) ([]byte, error) {
	js, err := json.Marshal(v)
	if err != nil {
		return nil, err
	}
	out := make([]byte, sealLen, sealLen+len(js))
	out[0] = valueSealed
	binary.BigEndian.PutUint32(out[1:], sealSum(key, js))
	return append(out, js...), nil
}

// openValue checks the CRC of a sealed value b stored at key and decodes
// its JSON into v, or decodes an unsealed value (plain JSON, written
// before values were sealed). A value that fails its CRC is damaged
// exactly like one that does not decode, and its callers treat both alike.
func openValue(key, b []byte, v any) error {
	switch {
	case len(b) >= sealLen && b[0] == valueSealed:
		js := b[sealLen:]
		if sum, stored := sealSum(key, js), binary.BigEndian.Uint32(b[1:sealLen]); sum != stored {
			return fmt.Errorf("%w (%08x, stored %08x)", errChecksum, sum, stored)
		}
		return json.Unmarshal(js, v)
	case len(b) > 0 && b[0] == '{':
		return json.Unmarshal(b, v)
	case len(b) == 0:
		return errors.New("the value is empty")
	}
	return fmt.Errorf("unknown value format %#02x", b[0])
}

func u64(v uint64) []byte { return binary.BigEndian.AppendUint64(nil, v) }

// putNumber stores n at key of the meta bucket, sealed as values are: the
// format byte, the CRC-32C of the key and the 8 bytes, the 8 bytes (big
// endian). A bit flip in the epoch or the next record index would
// otherwise be taken as the number: a producer going on in an epoch below
// the one its records were sent in, or a record index given twice.
func putNumber(meta *bolt.Bucket, key []byte, n uint64) error {
	num := u64(n)
	v := make([]byte, sealLen, sealLen+len(num))
	v[0] = valueSealed
	binary.BigEndian.PutUint32(v[1:], sealSum(key, num))
	return meta.Put(key, append(v, num...))
}

// number reads the number at key of the meta bucket: 0 when there is
// none, as putNumber sealed it, or 8 bytes as written before numbers were
// sealed. Anything else is damaged (errChecksum or a wrong length).
func number(meta *bolt.Bucket, key []byte) (uint64, error) {
	switch v := meta.Get(key); {
	case v == nil:
		return 0, nil
	case len(v) == 8:
		return binary.BigEndian.Uint64(v), nil
	case len(v) == sealLen+8 && v[0] == valueSealed:
		num := v[sealLen:]
		if sum, stored := sealSum(key, num), binary.BigEndian.Uint32(v[1:sealLen]); sum != stored {
			return 0, fmt.Errorf("%w (%08x, stored %08x)", errChecksum, sum, stored)
		}
		return binary.BigEndian.Uint64(num), nil
	default:
		return 0, fmt.Errorf("it is %d bytes long", len(v))
	}
}

// i64 reads a u64 value, or the index prefix of a batch key (a batch
// split in two keeps its key; the second half's key is the same index
// followed by the half's offset in the original batch).
func i64(b []byte) int64 {
	if len(b) < 8 {
		return 0
	}
	return int64(binary.BigEndian.Uint64(b[:8]))
}

// loaded is what open recovered.
type loaded struct {
	epoch     int64
	newEpoch  bool
	streams   map[streamKey]*streamState
	nextIndex uint64
	pending   int       // records not yet in a batch
	buffered  int       // records not yet acknowledged (pending + in batches)
	batches   int       // batches on disk
	renamed   string    // a state file moved aside as unreadable, if any
	oldest    time.Time // when the oldest pending record was found (now)
	damaged   []damagedValue
}

// errLocked: another process holds the state file.
var errLocked = errors.New("producer: state directory is in use by another process")

// errUnreadable marks a state file that bbolt finds damaged: its meta
// pages fail validation or their checksum, it is shorter than two pages
// or than the pages in use, or reading a page of it panics. (A value that
// fails its own checksum or does not decode is set aside alone, in the
// damaged bucket, and the file's records are still sent: see
// damagedValue.) Any other error opening it (EMFILE, EACCES, ENOMEM,
// EIO, a full disk) says nothing about the file and is returned as is: the
// file stays where it is and a later New reads it.
var errUnreadable = errors.New("state file is unreadable")

// openStore opens (creating or recovering) the state in dir for producer id.
// now is the clock, used for the epoch floor. Only an unreadable file is
// renamed aside (kept for inspection) and replaced by a new one in a new
// epoch.
func openStore(dir, id string, now time.Time, streamCache int) (*bolt.DB, loaded, error) {
	if err := mkdirDurable(dir); err != nil {
		return nil, loaded{}, fmt.Errorf("producer: create state dir: %w", err)
	}
	path := filepath.Join(dir, stateFile)
	db, l, err := loadFile(dir, path, id, now, streamCache)
	if !errors.Is(err, errUnreadable) {
		return db, l, err
	}
	renamed := path + ".unreadable-" + strconv.FormatInt(now.UnixNano(), 10)
	if rerr := os.Rename(path, renamed); rerr != nil {
		return nil, l, fmt.Errorf("producer: %w and cannot be moved aside: %w", err, rerr)
	}
	if db, l, err = loadFile(dir, path, id, now, streamCache); err != nil {
		return nil, l, fmt.Errorf("producer: create state file: %w", err)
	}
	l.renamed = renamed
	return db, l, nil
}

// loadFile opens and checks the state file at path and reads it.
// At most streamCache stream states are kept in l.streams (all are checked).
func loadFile(dir, path, id string, now time.Time, streamCache int) (db *bolt.DB, l loaded, err error) {
	defer func() {
		// bbolt panics on some damaged pages (an unknown page type in the
		// freelist, a branch page where a leaf is expected). A panic inside
		// bolt.Open leaves its file open (and locked, but the file is about
		// to be renamed aside); one inside a transaction was rolled back by
		// bbolt, so the db can be closed.
		if r := recover(); r != nil {
			if db != nil {
				db.Close()
			}
			db, err = nil, fmt.Errorf("%w: %s: reading it panicked: %v", errUnreadable, path, r)
		}
	}()
	db, err = openFile(path)
	if err != nil {
		return nil, l, err
	}
	err = db.Update(func(tx *bolt.Tx) error {
		for _, b := range [][]byte{bucketMeta, bucketStreams, bucketPending, bucketBatches, bucketKeys, bucketKeysByTime, bucketDamaged} {
			if _, err := tx.CreateBucketIfNotExists(b); err != nil {
				return err
			}
		}
		meta := tx.Bucket(bucketMeta)
		if p := meta.Get(keyProducer); p == nil {
			if err := meta.Put(keyProducer, []byte(id)); err != nil {
				return err
			}
		} else if string(p) != id {
			return fmt.Errorf("producer: %s holds the state of producer %q, not %q; use one directory per producer id", dir, p, id)
		}
		// A damaged stream state leaves that stream's seq
		// and total unknown: the epoch cannot go on (a seq could be given
		// twice), but its buffered records are still sent.
		streams, badStreams, err := checkStreams(tx, streamCache)
		if err != nil {
			return err
		}
		// A damaged epoch or next record index is set aside like any
		// damaged value. Without the epoch the file's streams cannot go
		// on; a new epoch starts above every epoch the file still names.
		// The next index is found again from the file (indexAfterAll).
		epochN, epochErr := number(meta, keyEpoch)
		epoch := int64(epochN)
		nextIndex, nextErr := number(meta, keyNextIndex)
		for _, bad := range []struct {
			key []byte
			err error
		}{{keyEpoch, epochErr}, {keyNextIndex, nextErr}} {
			if bad.err == nil {
				continue
			}
			if err := setAside(tx, bucketMeta, bad.key); err != nil {
				return err
			}
			l.damaged = append(l.damaged, damagedValue{bucket: string(bucketMeta), key: bad.key})
		}
		ending := epochErr != nil || epoch == 0 || meta.Get(keyEpochClosed) != nil || meta.Get(keyEpochClosing) != nil || len(badStreams) > 0
		if ending {
			// A damaged pending record is rebuilt from the stream states
			// of its epoch, which the new epoch deletes: decode them all
			// now. Otherwise forming decodes them (as it must anyway), and
			// New does not pay for it: about 7 µs a record, 7 s for a
			// backlog of a million on a loaded 2-core machine.
			var pend []damagedValue
			var highest int64
			if l.pending, highest, pend, err = checkPending(tx, epoch, now); err != nil {
				return err
			}
			l.damaged = append(l.damaged, pend...)
			if epochErr != nil {
				if epoch, err = highestKeyEpoch(tx); err != nil {
					return err
				}
				epoch = max(epoch, highest)
			}
			epoch = max(epoch+1, now.UnixMilli())
			l.newEpoch = true
			if err := putNumber(meta, keyEpoch, uint64(epoch)); err != nil {
				return err
			}
			if err := meta.Delete(keyEpochClosed); err != nil {
				return err
			}
			if err := meta.Delete(keyEpochClosing); err != nil {
				return err
			}
			if err := tx.DeleteBucket(bucketStreams); err != nil {
				return err
			}
			if _, err := tx.CreateBucket(bucketStreams); err != nil {
				return err
			}
			streams = make(map[streamKey]*streamState) // a new epoch's streams start anew
		} else {
			l.pending = tx.Bucket(bucketPending).Stats().KeyN
		}
		l.damaged = append(l.damaged, badStreams...)
		l.epoch = epoch
		if nextErr != nil {
			if nextIndex, err = indexAfterAll(tx); err != nil {
				return err
			}
			if err := putNumber(meta, keyNextIndex, nextIndex); err != nil {
				return err
			}
		}
		l.nextIndex = nextIndex
		l.streams = streams
		l.buffered = l.pending
		var bad [][]byte
		if err := tx.Bucket(bucketBatches).ForEach(func(k, v []byte) error {
			var b storedBatch
			if err := openValue(k, v, &b); err != nil {
				bad = append(bad, append([]byte(nil), k...))
				return nil
			}
			l.buffered += b.Records
			l.batches++
			return nil
		}); err != nil {
			return err
		}
		for _, k := range bad {
			if err := setAside(tx, bucketBatches, k); err != nil {
				return err
			}
			l.damaged = append(l.damaged, damagedValue{bucket: string(bucketBatches), key: k})
		}
		return nil
	})
	if err != nil {
		db.Close()
		return nil, l, err
	}
	// bbolt fsyncs the file, not the directory entry of a file it just
	// created (or of one renamed aside): sync the directory so a host crash
	// cannot make the whole state file vanish after Record acknowledged.
	if err := syncDir(dir); err != nil {
		db.Close()
		return nil, l, fmt.Errorf("producer: sync state dir: %w", err)
	}
	l.oldest = now
	return db, l, nil
}

// damagedValue is a value of the state file that failed its checksum or
// did not decode (openValue), moved to the damaged bucket: a pending
// record (and the record rebuilt in its place, if one could be), a stored
// batch, or a stream state (the epoch then ends: New starts a new one).
type damagedValue struct {
	bucket  string
	key     []byte
	rebuilt *storedRecord
}

// checkStreams checks and decodes every stream state, keeps at most cache
// of them, and sets aside those that are damaged.
func checkStreams(tx *bolt.Tx, cache int) (map[streamKey]*streamState, []damagedValue, error) {
	streams := make(map[streamKey]*streamState)
	var bad []damagedValue
	if err := tx.Bucket(bucketStreams).ForEach(func(k, v []byte) error {
		var st streamState
		sk, ok := parseStreamKey(k)
		if !ok || openValue(k, v, &st) != nil {
			bad = append(bad, damagedValue{bucket: string(bucketStreams), key: append([]byte(nil), k...)})
		} else if len(streams) < cache {
			streams[sk] = &st
		}
		return nil
	}); err != nil {
		return nil, nil, err
	}
	for _, d := range bad {
		if err := setAside(tx, bucketStreams, d.key); err != nil {
			return nil, nil, err
		}
	}
	return streams, bad, nil
}

// checkPending checks and decodes every pending record, sets aside those
// that are damaged (putting in their place the records rebuilt from the
// states of their streams in epoch, where one can be: none when epoch is
// 0, unknown), and returns how many records are pending after that and
// the highest epoch among them.
func checkPending(tx *bolt.Tx, epoch int64, now time.Time) (int, int64, []damagedValue, error) {
	pend := tx.Bucket(bucketPending)
	n := 0
	var highest int64
	var bad [][]byte
	if err := pend.ForEach(func(k, v []byte) error {
		var r storedRecord
		if openValue(k, v, &r) != nil {
			bad = append(bad, append([]byte(nil), k...))
		} else {
			n++
			highest = max(highest, r.Epoch)
		}
		return nil
	}); err != nil {
		return 0, 0, nil, err
	}
	if len(bad) == 0 {
		return n, highest, nil, nil
	}
	damaged, err := salvagePending(tx, bad, epoch, now)
	if err != nil {
		return 0, 0, nil, err
	}
	for _, d := range damaged {
		if d.rebuilt == nil {
			continue
		}
		v, err := sealValue(d.key, d.rebuilt)
		if err != nil {
			return 0, 0, nil, err
		}
		if err := pend.Put(d.key, v); err != nil {
			return 0, 0, nil, err
		}
		n++
		highest = max(highest, d.rebuilt.Epoch)
	}
	return n, highest, damaged, nil
}

// salvagePending sets aside the pending records at keys, whose values are
// damaged, and rebuilds those that were their stream's last record
// from the stream's state (rebuild). It neither deletes them from the
// pending bucket nor puts the rebuilt records there: the caller does.
//
// A damaged record that was not its stream's last loses no usage: the
// stream's next record carries its total, and the ledger bills the seq
// missing between them as a gap (docs/design.md §2).
func salvagePending(tx *bolt.Tx, keys [][]byte, epoch int64, now time.Time) ([]damagedValue, error) {
	out := make([]damagedValue, len(keys))
	at := make(map[uint64]int, len(keys)) // the index of a damaged record plus one → its place in out
	for i, k := range keys {
		out[i] = damagedValue{bucket: string(bucketPending), key: append([]byte(nil), k...)}
		at[uint64(i64(k))+1] = i
	}
	if err := tx.Bucket(bucketStreams).ForEach(func(k, v []byte) error {
		var st streamState
		sk, ok := parseStreamKey(k)
		// epoch 0: the states' epoch is damaged; nothing is rebuilt.
		if !ok || epoch == 0 || openValue(k, v, &st) != nil || st.Last == 0 {
			return nil
		}
		if i, ok := at[st.Last]; ok {
			r, err := rebuild(sk, st, epoch, now)
			if err != nil {
				return err
			}
			out[i].rebuilt = r
		}
		return nil
	}); err != nil {
		return nil, err
	}
	for _, d := range out {
		if err := setAside(tx, bucketPending, d.key); err != nil {
			return nil, err
		}
	}
	return out, nil
}

// rebuild makes the last record of stream sk again from its state st, as
// far as the state tells it: the same seq and total (or final record, or
// member at its time), a new operation id, occurred now. A counter's
// rebuilt record carries no quantity (the state keeps none), so the ledger
// bills it as total minus the total before it. A gauge's level is not in
// its state: nil, the reading is lost, and the level before it holds until
// the stream's next reading or final record.
func rebuild(sk streamKey, st streamState, epoch int64, now time.Time) (*storedRecord, error) {
	if st.Shape == "gauge" && !st.Final {
		return nil, nil
	}
	id, err := uuid.NewV7()
	if err != nil {
		return nil, err
	}
	now = now.UTC().Truncate(time.Microsecond)
	r := &storedRecord{Epoch: epoch, OperationID: id, Customer: sk.customer, Meter: sk.meter,
		Seq: st.Seq, Total: st.Total, OccurredAt: now, Final: st.Final}
	switch {
	case st.Shape == "gauge": // a final record: the level ends at 0, as finalize wrote it
		r.Level = decimal.NewNullDecimal(decimal.Zero)
		if st.At.After(now) {
			r.OccurredAt = st.At
		}
	case st.Shape == "unique": // the member, when it was recorded (a final record repeats it)
		r.Member = st.Member
		if !st.At.IsZero() {
			r.OccurredAt = st.At
		}
	case st.Final: // a counter's final record: quantity 0
		r.Quantity = decimal.Zero
	default:
		r.NoQuantity = true
	}
	return r, nil
}

// highestKeyEpoch is the highest epoch among the stored idempotency keys'
// records (a damaged key is skipped).
func highestKeyEpoch(tx *bolt.Tx) (int64, error) {
	var highest int64
	err := tx.Bucket(bucketKeys).ForEach(func(k, v []byte) error {
		var sk storedKey
		if openValue(k, v, &sk) == nil {
			highest = max(highest, sk.Epoch)
		}
		return nil
	})
	return highest, err
}

// indexAfterAll is a next record index for a file whose own is damaged:
// past every index the file still names, the pending records', the
// stored batches' (the index of a batch's first record) and the stream
// states' last records'. Indexes only need to grow: a record index given
// twice would overwrite a pending record, or a stored batch when formed.
func indexAfterAll(tx *bolt.Tx) (uint64, error) {
	var next uint64
	if k, _ := tx.Bucket(bucketPending).Cursor().Last(); k != nil {
		next = uint64(i64(k)) + 1
	}
	if k, _ := tx.Bucket(bucketBatches).Cursor().Last(); k != nil {
		next = max(next, uint64(i64(k))+1)
	}
	err := tx.Bucket(bucketStreams).ForEach(func(k, v []byte) error {
		var st streamState
		if openValue(k, v, &st) == nil {
			next = max(next, st.Last)
		}
		return nil
	})
	return next, err
}

// setAside copies the value at k in bucket to the damaged bucket, where it
// is kept as it was for inspection, and deletes it from bucket.
func setAside(tx *bolt.Tx, bucket, k []byte) error {
	b := tx.Bucket(bucket)
	v := b.Get(k)
	if v == nil {
		return nil
	}
	dk := append(append(append([]byte(nil), bucket...), 0), k...)
	if err := tx.Bucket(bucketDamaged).Put(dk, append([]byte(nil), v...)); err != nil {
		return err
	}
	return b.Delete(k)
}

// mkdirDurable creates dir and its missing parents, and syncs the parent
// of each directory it created: the state file's own entry is synced in
// dir, and without this a host crash soon after the first acknowledged
// Record in a new dir could lose the dir itself on some filesystems.
func mkdirDurable(dir string) error {
	var created []string
	for d := filepath.Clean(dir); ; d = filepath.Dir(d) {
		if _, err := os.Stat(d); err == nil {
			break
		} else if !errors.Is(err, fs.ErrNotExist) {
			return err
		}
		created = append(created, d)
		if filepath.Dir(d) == d {
			break
		}
	}
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return err
	}
	for _, d := range created {
		if err := syncDir(filepath.Dir(d)); err != nil {
			return err
		}
	}
	return nil
}

func syncDir(dir string) error {
	f, err := os.Open(dir)
	if err != nil {
		return err
	}
	defer f.Close()
	return f.Sync()
}

// openFile opens the bbolt file and checks its meta bucket.
func openFile(path string) (*bolt.DB, error) {
	if err := checkLength(path); err != nil {
		return nil, err
	}
	db, err := bolt.Open(path, 0o600, &bolt.Options{Timeout: time.Second})
	if errors.Is(err, bolterrors.ErrTimeout) {
		return nil, fmt.Errorf("%w: %s", errLocked, path)
	}
	if err != nil {
		if corrupt(err) {
			return nil, fmt.Errorf("%w: %s: %v", errUnreadable, path, err)
		}
		return nil, fmt.Errorf("producer: open state file %s: %w", path, err)
	}
	// bbolt validates the meta pages only; a damaged freelist page panics
	// in bolt.Open, a damaged data page when it is read. loadFile recovers
	// those panics, and its transaction reads every page that holds state
	// (the stream states and batches are decoded, the pending bucket's
	// Stats walks its pages), so damage shows here, not long after New
	// returned. (tx.Check would also read freed pages, at a cost of
	// seconds per open on a large file.) A damaged epoch or next record
	// index is set aside by loadFile like any damaged value; a file cut
	// short was refused by checkLength before any page was read.
	return db, nil
}

// checkLength refuses, as unreadable, a file shorter than the pages its
// meta page says are in use (cut short by a filesystem crash), before
// bbolt maps it: bolt.Open reads the freelist page, and a page past the
// end of the mapped file is a SIGBUS, a fatal error no recover catches.
// The meta page is bbolt's (the valid one of the two with the higher
// transaction id: page header 16 bytes, then magic, version, page size,
// flags, root, freelist, high-water page id, txid and an FNV-64a checksum
// of what precedes it). A file without a valid meta page is left to
// bolt.Open, which says so; a missing file is created there.
func checkLength(path string) error {
	f, err := os.Open(path)
	if errors.Is(err, fs.ErrNotExist) {
		return nil
	}
	if err != nil {
		return fmt.Errorf("producer: open state file %s: %w", path, err)
	}
	defer f.Close()
	fi, err := f.Stat()
	if err != nil {
		return fmt.Errorf("producer: stat state file %s: %w", path, err)
	}
	const metaMagic, metaAt, metaLen = 0xED0CDAED, 16, 64
	// The two meta pages: page 0, and page 1 at the page size page 0 names.
	var metas [][]byte
	if m := make([]byte, metaAt+metaLen); readAt(f, m, 0) {
		metas = append(metas, m[metaAt:])
		if ps := int64(binary.LittleEndian.Uint32(m[metaAt+8:])); ps >= 512 && ps <= 1<<20 {
			if m := make([]byte, metaAt+metaLen); readAt(f, m, ps) {
				metas = append(metas, m[metaAt:])
			}
		}
	}
	var pageSize, hw, txid uint64
	for _, m := range metas {
		h := fnv.New64a()
		h.Write(m[:56])
		if binary.LittleEndian.Uint32(m) != metaMagic || h.Sum64() != binary.LittleEndian.Uint64(m[56:]) {
			continue
		}
		if t := binary.LittleEndian.Uint64(m[48:]); pageSize == 0 || t > txid {
			pageSize, hw, txid = uint64(binary.LittleEndian.Uint32(m[8:])), binary.LittleEndian.Uint64(m[40:]), t
		}
	}
	if pageSize > 0 && uint64(fi.Size()) < hw*pageSize {
		return fmt.Errorf("%w: %s: it is %d bytes long, and its pages in use reach %d bytes (the file was cut short)",
			errUnreadable, path, fi.Size(), hw*pageSize)
	}
	return nil
}

// readAt fills b from f at off, and says whether it could.
func readAt(f *os.File, b []byte, off int64) bool {
	_, err := f.ReadAt(b, off)
	return err == nil
}

// corrupt tells bbolt's errors about the file's content from those about
// the system (a syscall error: descriptors, permissions, memory, I/O).
func corrupt(err error) bool {
	if errors.Is(err, bolterrors.ErrInvalid) || errors.Is(err, bolterrors.ErrChecksum) || errors.Is(err, bolterrors.ErrVersionMismatch) {
		return true
	}
	var errno syscall.Errno
	// "file size too small": bbolt's check of a truncated file, a plain
	// error with no sentinel.
	return !errors.As(err, &errno) && strings.Contains(err.Error(), "file size too small")
}
