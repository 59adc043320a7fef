package ingest_test

import (
	"bytes"
	"context"
	"math/rand/v2"
	"testing"
	"time"

	"github.com/segmentio/kafka-go"
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
