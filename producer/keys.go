package producer

import (
	"bytes"
	"encoding/binary"
	"fmt"
	"time"
	"unicode/utf8"

	"github.com/google/uuid"
	"github.com/shopspring/decimal"
	bolt "go.etcd.io/bbolt"
)

// MaxKeyLen bounds an idempotency key, in bytes.
const MaxKeyLen = 256

// RecordOption is an option of one Record call.
type RecordOption func(*recordOptions)

type recordOptions struct {
	key string
}

// Key makes a Record call idempotent by key, a string of the caller's (a
// job id, "invoice-42/line-3"): 1 to MaxKeyLen bytes of UTF-8. A repeated
// key within the producer's state (Dir, across restarts, kills and new
// epochs, for Config.KeyRetention) records nothing new and returns the
// first call's answer: nil if it recorded the same customer, meter and
// quantity (its occurredAt stands, whatever the repeat passes), a
// *KeyReusedError if it recorded other usage. A call that returned an error
// recorded nothing, so its key is free. Key("") is the same as no key.
func Key(key string) RecordOption {
	return func(o *recordOptions) { o.key = key }
}

func checkKey(o recordOptions) error {
	switch {
	case len(o.key) > MaxKeyLen:
		return fmt.Errorf("producer: Key is %d bytes long; at most %d", len(o.key), MaxKeyLen)
	case !utf8.ValidString(o.key):
		return fmt.Errorf("producer: Key %q is not valid UTF-8", o.key)
	}
	return nil
}

// KeyReusedError: a Record call's key was first used for other usage. That
// first usage stands; nothing new was recorded.
type KeyReusedError struct {
	Key string
	// The usage the key recorded first.
	Customer, Meter string
	Quantity        decimal.Decimal
	OccurredAt      time.Time
}

func (e *KeyReusedError) Error() string {
	return fmt.Sprintf("producer: key %q was first used to record %s of %s/%s at %s; the first record stands and nothing was recorded",
		e.Key, e.Quantity, e.Customer, e.Meter, e.OccurredAt.UTC().Format(time.RFC3339Nano))
}

// storedKey is an idempotency key as stored with its record.
type storedKey struct {
	Key         string          `json:"-"`
	Customer    string          `json:"c"`
	Meter       string          `json:"m"`
	Quantity    decimal.Decimal `json:"q"`
	OccurredAt  time.Time       `json:"at"`
	Member      string          `json:"mb,omitempty"` // RecordMember's member
	Epoch       int64           `json:"e"`
	Seq         int64           `json:"s"`
	OperationID uuid.UUID       `json:"o"`
	StoredAt    time.Time       `json:"t"`
}

func keyOf(r *request) storedKey {
	return storedKey{Key: r.idem, Customer: r.key.customer, Meter: r.key.meter, Quantity: r.quantity, OccurredAt: r.at, Member: r.member}
}

// answer is what a later call with k's key gets: nil for the same usage
// (customer, meter and quantity). Not the same occurredAt: a caller
// retrying after a crash may stamp the retry anew, and the first call's
// time stands.
func (k storedKey) answer(r *request) error {
	if k.Customer == r.key.customer && k.Meter == r.key.meter && k.Quantity.Equal(r.quantity) && k.Member == r.member {
		return nil
	}
	return &KeyReusedError{Key: k.Key, Customer: k.Customer, Meter: k.Meter, Quantity: k.Quantity, OccurredAt: k.OccurredAt}
}

// loadKeys returns the stored keys among those of taken.
func (p *Producer) loadKeys(taken []*request) (map[string]storedKey, error) {
	out := map[string]storedKey{}
	var any bool
	for _, r := range taken {
		any = any || r.idem != ""
	}
	if !any {
		return out, nil
	}
	err := p.db.View(func(tx *bolt.Tx) error {
		b := tx.Bucket(bucketKeys)
		for _, r := range taken {
			if r.idem == "" {
				continue
			}
			v := b.Get([]byte(r.idem))
			if v == nil {
				continue
			}
			k := storedKey{Key: r.idem}
			if err := openValue([]byte(r.idem), v, &k); err != nil {
				return fmt.Errorf("key %q: %w", r.idem, err)
			}
			out[r.idem] = k
		}
		return nil
	})
	return out, err
}

// keyPruneBatch bounds the expired keys one commit deletes, so a commit
// after a long pause does not stall the callers it answers.
const keyPruneBatch = 1000

// putKeys stores keys (in the transaction of their records) and deletes
// up to keyPruneBatch keys stored more than retention before now.
func putKeys(tx *bolt.Tx, keys []storedKey, now time.Time, retention time.Duration) error {
	b, byTime := tx.Bucket(bucketKeys), tx.Bucket(bucketKeysByTime)
	for _, k := range keys {
		k.StoredAt = now.UTC()
		name := []byte(k.Key)
		v, err := sealValue(name, k)
		if err != nil {
			return err
		}
		if err := b.Put(name, v); err != nil {
			return err
		}
		if err := byTime.Put(timeKey(k.StoredAt, k.Key), nil); err != nil {
			return err
		}
	}
	// keys_by_time's keys carry no checksum: a key is deleted only when
	// its own sealed value says it was stored before the cut-off. One
	// filed under a damaged time (or name) is filed again under the time
	// its value holds; a damaged value is deleted when its entry expires.
	cut := now.Add(-retention)
	cutoff := timeKey(cut, "")
	c := byTime.Cursor()
	for range keyPruneBatch {
		k, _ := c.First()
		if k == nil || bytes.Compare(k, cutoff) >= 0 {
			break
		}
		name := bytes.Clone(k[8:]) // k is bbolt's, valid until the delete
		if err := c.Delete(); err != nil {
			return err
		}
		if v := b.Get(name); v != nil {
			var sk storedKey
			if openValue(name, v, &sk) == nil && !sk.StoredAt.Before(cut) {
				if err := byTime.Put(timeKey(sk.StoredAt, string(name)), nil); err != nil {
					return err
				}
				continue
			}
		}
		if err := b.Delete(name); err != nil {
			return err
		}
	}
	return nil
}

// timeKey orders keys by when they were stored: nanoseconds (8 bytes, big
// endian) and the key.
func timeKey(t time.Time, key string) []byte {
	return append(binary.BigEndian.AppendUint64(nil, uint64(max(t.UnixNano(), 0))), key...)
}
