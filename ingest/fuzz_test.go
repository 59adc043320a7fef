package ingest_test

import (
	"bytes"
	"context"
	"math/rand/v2"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/segmentio/kafka-go"
)

// FuzzConsume runs the whole consumer path (Kafka fetch, decode, ledger,
// dead letters, counters, offset commit) on arbitrary messages: each input
// is written through a real Kafka client to the embedded broker, followed by
// good usage on the same partition. Whatever the input, the partition
// catches up, the good usage is applied exactly once, the counters balance,
// and the input is either counted as accepted or is a dead letter holding
// its exact bytes. The seed corpus is testdata/fuzz/FuzzConsume (one input
// of each hostile kind) plus the f.Add calls below.
//
//	go test ./ingest -run '^$' -fuzz FuzzConsume -fuzztime 5m
func FuzzConsume(f *testing.F) {
	good := encode(f, models(1)[0].next(rand.New(rand.NewPCG(1, 1)), 2))
	f.Add(good.Key, false, good.Value, false)
	f.Add([]byte("acme"), false, []byte(nil), true)
	f.Add([]byte(nil), true, []byte("{}"), false)

	e := newEnv(f, 1)
	m := e.start()
	f.Cleanup(func() { m.Stop(f) })
	w := e.kafka.PartitionWriter(topic, 0)
	f.Cleanup(func() { w.Close() })
	stream := &streamModel{producer: "fuzz", epoch: 1, customer: "fuzz-good", meter: "api_calls"}
	rng := rand.New(rand.NewPCG(2, 2))
	var sent int64

	f.Fuzz(func(t *testing.T, key []byte, keyNull bool, value []byte, valueNull bool) {
		e := *e
		e.t = t
		k, v := append([]byte{}, key...), append([]byte{}, value...)
		if keyNull {
			k = nil
		}
		if valueNull {
			v = nil
		}
		gb := stream.next(rng, 2)
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		if err := w.WriteMessages(ctx, kafka.Message{Key: k, Value: v}, encode(t, gb)); err != nil {
			t.Fatalf("produce: %v", err)
		}
		at := sent // the input's offset
		sent += 2
		e.waitCaughtUp(60 * time.Second)

		c := e.checkCounters()
		if c.MessagesIn != sent {
			t.Fatalf("messages in %d, want %d", c.MessagesIn, sent)
		}
		ids := []uuid.UUID{gb.Records[0].OperationID, gb.Records[1].OperationID}
		var n int
		if err := e.pool.QueryRow(ctx, `SELECT count(*) FROM records WHERE operation_id = ANY($1)`, ids).Scan(&n); err != nil || n != 2 {
			t.Fatalf("good usage after the input: %d of 2 records applied (%v)", n, err)
		}
		rows, err := e.pool.Query(ctx, `SELECT record_index IS NULL, key, raw FROM dead_letters WHERE "offset" = $1`, at)
		if err != nil {
			t.Fatal(err)
		}
		defer rows.Close()
		for rows.Next() {
			var whole bool
			var dk, raw []byte
			if err := rows.Scan(&whole, &dk, &raw); err != nil {
				t.Fatal(err)
			}
			if (dk == nil) != (k == nil) || !bytes.Equal(dk, k) {
				t.Errorf("dead letter key %q (nil %v), want %q (nil %v)", dk, dk == nil, k, k == nil)
			}
			if whole && ((raw == nil) != (v == nil) || !bytes.Equal(raw, v)) {
				t.Errorf("dead letter raw %q (nil %v), want the message's bytes %q (nil %v)", raw, raw == nil, v, v == nil)
			}
			if !whole && !bytes.Contains(v, raw) {
				t.Errorf("record dead letter raw %q is not part of the message", raw)
			}
		}
		if err := rows.Err(); err != nil {
			t.Fatal(err)
		}
	})
}
