package ingest_test

import (
	"bytes"
	"context"
	"fmt"
	"math/rand/v2"
	"strings"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/segmentio/kafka-go"

	"github.com/tally-ledger/tally/ingest"
	"github.com/tally-ledger/tally/ingest/wire"
)

// storedDeadLetter is a dead letter's row as stored, bytes untouched.
type storedDeadLetter struct {
	offset   int64
	reason   string
	key, raw []byte // nil: NULL
}

func (e *env) deadLetterRows() map[int64]storedDeadLetter {
	e.t.Helper()
	rows, err := e.pool.Query(context.Background(),
		`SELECT "offset", reason, key, raw FROM dead_letters WHERE record_index IS NULL ORDER BY "offset"`)
	if err != nil {
		e.t.Fatal(err)
	}
	defer rows.Close()
	out := map[int64]storedDeadLetter{}
	for rows.Next() {
		var d storedDeadLetter
		if err := rows.Scan(&d.offset, &d.reason, &d.key, &d.raw); err != nil {
			e.t.Fatal(err)
		}
		out[d.offset] = d
	}
	if err := rows.Err(); err != nil {
		e.t.Fatal(err)
	}
	return out
}

// A tombstone (null value) and an empty value are bad input: each is a dead
// letter stored as what it was (NULL, empty), and the good usage after them
// on the same partition is billed.
func TestTombstoneAndEmptyValueAreDeadLetters(t *testing.T) {
	t.Parallel()
	e := newEnv(t, 1)
	s := models(1)[0]
	rng := rand.New(rand.NewPCG(5, 6))
	good := encode(t, s.next(rng, 3))
	e.kafka.ProduceTo(t, topic, 0,
		kafka.Message{Key: []byte("cust-00"), Value: nil},      // offset 0: tombstone
		kafka.Message{Key: []byte("cust-00"), Value: []byte{}}, // offset 1: empty value
		kafka.Message{Key: nil, Value: good.Value},             // offset 2: nil key
		good) // offset 3
	m := e.start()
	e.waitCaughtUp(30 * time.Second)
	m.Stop(t)
	e.checkLedger([]*streamModel{s})
	e.checkCounters()
	dl := e.deadLetterRows()
	if len(dl) != 3 {
		t.Fatalf("%d dead letters, want 3: %+v", len(dl), dl)
	}
	if d := dl[0]; d.raw != nil || string(d.key) != "cust-00" {
		t.Errorf("tombstone stored as key %q raw %q (nil %v), want raw NULL", d.key, d.raw, d.raw == nil)
	}
	if d := dl[1]; d.raw == nil || len(d.raw) != 0 {
		t.Errorf("empty value stored as raw %q (nil %v), want empty, not NULL", d.raw, d.raw == nil)
	}
	if d := dl[2]; d.key != nil || !bytes.Equal(d.raw, good.Value) {
		t.Errorf("nil key stored as key %q (nil %v), want NULL, with the value's bytes", d.key, d.key == nil)
	}
}

// hostileMessages returns messages that must each be refused (whole, or
// every record), keyed by a name for failure messages. The customer of any
// record that got through would be "evil", which no good stream uses.
func hostileMessages() []struct {
	name       string
	key, value []byte
} {
	type hm = struct {
		name       string
		key, value []byte
	}
	// Valid values (times an hour ago, never ahead of the ledger clock), so
	// that each message is refused for its one hostile field alone.
	ago := `"` + time.Now().UTC().Add(-time.Hour).Truncate(time.Second).Format(time.RFC3339) + `"`
	fields := map[string]string{
		"schema": `"meter.batch.v1"`, "batch_id": "", "producer": `"gw-1"`,
		"epoch": `1`, "sent_at": ago,
		"operation_id": "", "customer": `"evil"`, "meter": `"api_calls"`,
		"seq": `1`, "total": `"1"`, "quantity": `"1"`, "occurred_at": ago,
	}
	top := []string{"schema", "batch_id", "producer", "epoch", "sent_at"}
	rec := []string{"operation_id", "customer", "meter", "seq", "total", "quantity", "occurred_at"}
	// msg builds a message with field f's JSON replaced by v ("" keeps all).
	msg := func(f, v string) []byte {
		fields["batch_id"] = `"` + uuid.Must(uuid.NewV7()).String() + `"`
		fields["operation_id"] = `"` + uuid.Must(uuid.NewV7()).String() + `"`
		var b strings.Builder
		b.WriteString("{")
		for i, n := range top {
			if i > 0 {
				b.WriteString(",")
			}
			val := fields[n]
			if n == f {
				val = v
			}
			fmt.Fprintf(&b, "%q:%s", n, val)
		}
		b.WriteString(`,"records":[{`)
		for i, n := range rec {
			if i > 0 {
				b.WriteString(",")
			}
			val := fields[n]
			if n == f {
				val = v
			}
			fmt.Fprintf(&b, "%q:%s", n, val)
		}
		b.WriteString("}]}")
		return []byte(b.String())
	}
	key := []byte("evil")
	var out []hm
	// Bytes no string field may hold, inside every string field.
	bad := map[string]string{
		"json NUL escape": `\u0000`, "raw NUL byte": "\x00", "invalid UTF-8": "\xff\xfe", "lone high surrogate": `\ud800`,
		"lone low surrogate": `\udc00`, "UTF-8-encoded surrogate": "\xed\xa0\x80", "overlong UTF-8": "\xc0\xaf",
		"escaped DEL": `\u007f`,
	}
	for _, f := range append(append([]string{}, top...), rec...) {
		orig := fields[f]
		if orig[0] != '"' {
			continue
		}
		for bn, bv := range bad {
			v := orig[:len(orig)-1] + bv + `"`
			out = append(out, hm{f + " with " + bn, key, msg(f, v)})
		}
	}
	for bn, bv := range bad {
		out = append(out, hm{"key with " + bn, []byte("evil" + strings.ReplaceAll(strings.ReplaceAll(bv, `\u`, "\x00"), `\`, "")), msg("", "")})
	}
	good := msg("", "")
	long := strings.Repeat("x", 100_000)
	deep := strings.Repeat("[", 200_000) + strings.Repeat("]", 200_000)
	deepObj := strings.Repeat(`{"a":`, 100_000) + "1" + strings.Repeat("}", 100_000)
	out = append(out,
		hm{"null value (tombstone)", key, nil},
		hm{"empty value", key, []byte{}},
		hm{"nil key", nil, good},
		hm{"empty key", []byte{}, good},
		hm{"NUL key", []byte{0}, good},
		hm{"very long key", []byte(long), good},
		hm{"very long producer", key, msg("producer", `"`+long+`"`)},
		hm{"very long customer", key, msg("customer", `"`+long+`"`)},
		hm{"very long meter", key, msg("meter", `"`+long+`"`)},
		hm{"very long customer and key", []byte(long), []byte(strings.ReplaceAll(string(good), `"evil"`, `"`+long+`"`))},
		hm{"129-character meter", key, msg("meter", `"`+strings.Repeat("m", 129)+`"`)},
		hm{"deep nesting in records", key, []byte(strings.Replace(string(good), `"records":[{`, `"records":[`+deep+`,{`, 1))},
		hm{"deep nesting as a value", key, msg("quantity", deepObj)},
		hm{"deep nesting at the top", key, []byte(deep)},
		hm{"epoch past int64", key, msg("epoch", "9223372036854775808")},
		hm{"epoch far past int64", key, msg("epoch", "1"+strings.Repeat("0", 400))},
		hm{"seq past int64", key, msg("seq", "9223372036854775808")},
		hm{"seq below int64", key, msg("seq", "-9223372036854775809")},
		hm{"seq as exponent", key, msg("seq", "1e30")},
		hm{"seq as fraction", key, msg("seq", "1.5")},
		hm{"total past any numeric", key, msg("total", `"1e400"`)},
		hm{"total with 1000 digits", key, msg("total", `"`+strings.Repeat("9", 1000)+`"`)},
		hm{"total as JSON number with exponent", key, msg("total", "1e2")},
		hm{"line separator in the customer", key, msg("customer", `"evil\u2028"`)},
		hm{"total NaN", key, msg("total", `"NaN"`)},
		hm{"occurred_at year 1", key, msg("occurred_at", `"0001-01-01T00:00:00Z"`)},
		hm{"occurred_at year 10000", key, msg("occurred_at", `"10000-01-01T00:00:00Z"`)},
		hm{"occurred_at negative year", key, msg("occurred_at", `"-2026-12-03T09:00:00Z"`)},
		hm{"occurred_at last instant of 9999", key, msg("occurred_at", `"9999-12-31T23:59:59.999999999Z"`)},
		hm{"occurred_at zone-less", key, msg("occurred_at", `"2026-12-03T09:00:00"`)},
		hm{"occurred_at date only", key, msg("occurred_at", `"2026-12-03"`)},
		hm{"occurred_at zone +25:00", key, msg("occurred_at", `"2026-12-03T09:00:00+25:00"`)},
		hm{"occurred_at unix seconds", key, msg("occurred_at", `1764752400`)},
		hm{"sent_at zone-less", key, msg("sent_at", `"2026-12-03T10:00:00"`)},
		hm{"sent_at year 0", key, msg("sent_at", `"0000-01-01T00:00:00Z"`)},
		hm{"empty records", key, []byte(strings.Replace(string(good), string(good[strings.Index(string(good), `"records":`):len(good)-1]), `"records":[]`, 1))},
		hm{"null records", key, []byte(strings.Replace(string(good), string(good[strings.Index(string(good), `"records":`):len(good)-1]), `"records":null`, 1))},
		hm{"records object", key, []byte(strings.Replace(string(good), string(good[strings.Index(string(good), `"records":`):len(good)-1]), `"records":{}`, 1))},
		hm{"duplicate schema", key, []byte(`{"schema":"x",` + string(good[1:]))},
		hm{"duplicate schema, same value", key, []byte(`{"schema":"meter.batch.v1",` + string(good[1:]))},
		hm{"duplicate total", key, []byte(strings.Replace(string(good), `"total":"1"`, `"total":"1","total":"1000"`, 1))},
		hm{"duplicate records", key, []byte(strings.TrimSuffix(string(good), "}") + `,"records":[]}`)},
		hm{"byte order mark", key, append([]byte("\xef\xbb\xbf"), good...)},
		hm{"JSON null", key, []byte("null")},
		hm{"JSON array", key, []byte("[]")},
		hm{"trailing garbage", key, append(append([]byte{}, good...), "}"...)},
		hm{"binary junk", key, []byte("\x00\x01\x02\xff\xfe\x80\x81")},
		hm{"just over 1 MiB", key, append(append([]byte{}, good[:len(good)-1]...), []byte(`,"pad":"`+strings.Repeat("p", 1<<20)+`"}`)...)},
	)
	return out
}

// Hostile messages of every kind, each followed by good usage on the same
// partition, written through a real Kafka client: the good usage is billed
// exactly and promptly, and every hostile message is a dead letter with its
// bytes (the message's, exactly, or, for a refused record, that record's).
func TestHostileMessagesNeverHaltAPartition(t *testing.T) {
	t.Parallel()
	e := newEnv(t, 1)
	rng := rand.New(rand.NewPCG(14, 15))
	streams := models(3)
	hostile := hostileMessages()
	for _, h := range hostile {
		// The premise: each differs from a valid message in one place.
		if h.name == "nil key" {
			if b, _, rej, err := wire.Decode([]byte("evil"), h.value); err != nil || len(rej) != 0 || len(b.Records) != 1 {
				t.Fatalf("the template message is not valid: %v %v", rej, err)
			}
		}
	}
	var msgs []kafka.Message
	byOffset := map[int64]int{}
	for i, h := range hostile {
		byOffset[int64(len(msgs))] = i
		msgs = append(msgs, kafka.Message{Key: h.key, Value: h.value})
		msgs = append(msgs, encode(t, streams[i%len(streams)].next(rng, 2)))
	}
	// Fetches of these messages (up to 8 MiB each) can take the in-process
	// broker longer than the harness's 500 ms to begin answering on a
	// loaded machine, which fails every fetch (see FetchMaxWait): this
	// test is about the messages, not the broker's speed.
	m := e.start(func(c *ingest.Config) { c.FetchMaxWait = 5 * time.Second })
	t0 := time.Now()
	w := e.kafka.PartitionWriter(topic, 0)
	w.BatchSize = 1 // in order, one by one
	for _, msg := range msgs {
		if err := w.WriteMessages(context.Background(), msg); err != nil {
			t.Fatalf("produce: %v", err)
		}
	}
	w.Close()
	e.waitCaughtUp(90 * time.Second)
	t.Logf("%d hostile and %d good messages applied %v after the first was sent", len(hostile), len(hostile), time.Since(t0).Round(time.Millisecond))
	m.Stop(t)

	e.checkLedger(streams) // also: no usage of customer "evil"
	e.checkOffsets()
	c := e.checkCounters()
	if c.MessagesIn != int64(len(msgs)) {
		t.Errorf("messages in %d, want %d", c.MessagesIn, len(msgs))
	}
	rows, err := e.pool.Query(context.Background(), `SELECT "offset", record_index IS NULL, reason, key, raw FROM dead_letters`)
	if err != nil {
		t.Fatal(err)
	}
	found := map[int64]bool{}
	for rows.Next() {
		var off int64
		var whole bool
		var reason string
		var k, raw []byte
		if err := rows.Scan(&off, &whole, &reason, &k, &raw); err != nil {
			t.Fatal(err)
		}
		i, ok := byOffset[off]
		if !ok {
			t.Errorf("dead letter (%s) at offset %d, which holds good usage", reason, off)
			continue
		}
		found[off] = true
		h := hostile[i]
		if (k == nil) != (h.key == nil) || !bytes.Equal(k, h.key) {
			t.Errorf("%s: dead letter key %q (nil %v), want %q (nil %v)", h.name, k, k == nil, h.key, h.key == nil)
		}
		if whole && ((raw == nil) != (h.value == nil) || !bytes.Equal(raw, h.value)) {
			t.Errorf("%s: dead letter raw %.80q (nil %v), want the message's bytes %.80q (nil %v)", h.name, raw, raw == nil, h.value, h.value == nil)
		}
		if !whole && !bytes.Contains(h.value, raw) {
			t.Errorf("%s: record dead letter raw %.80q is not a part of the message", h.name, raw)
		}
	}
	rows.Close()
	for off, i := range byOffset {
		if !found[off] {
			t.Errorf("%s (offset %d): no dead letter", hostile[i].name, off)
		}
	}
}
