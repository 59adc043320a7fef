package ingest_test

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/tally-ledger/tally/ledger"
	"math/rand/v2"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/segmentio/kafka-go"

	"github.com/tally-ledger/tally/ingest"
)

// The same messages delivered many times change nothing: every total stays
// exact and the repeats are counted as duplicates.
func TestRedeliveredMessagesBillOnce(t *testing.T) {
	t.Parallel()
	e := newEnv(t, 4)
	rng := rand.New(rand.NewPCG(1, 2))
	streams := models(8)
	var msgs []kafka.Message
	unique := 0
	for range 5 {
		for _, s := range streams {
			n := 1 + rng.IntN(20)
			unique += n
			msgs = append(msgs, encode(t, s.next(rng, n)))
		}
	}
	// Every message three times, in three passes.
	e.kafka.Produce(t, topic, msgs...)
	e.kafka.Produce(t, topic, msgs...)
	m := e.start()
	e.kafka.Produce(t, topic, msgs...)
	// And one message 20 times in a row.
	for range 20 {
		e.kafka.Produce(t, topic, msgs[0])
	}
	e.waitCaughtUp(30 * time.Second)
	m.Stop(t)

	e.checkLedger(streams)
	e.checkOffsets()
	c := e.checkCounters()
	first := len(msgsRecords(t, msgs[:1]))
	if c.Applied != int64(unique) || c.Duplicate != int64(2*unique+20*first) || c.Rejected != 0 || c.Conflict != 0 {
		t.Errorf("counters %+v; want applied %d, duplicate %d", c, unique, 2*unique+20*first)
	}
	if c.MessagesIn != int64(3*len(msgs)+20) {
		t.Errorf("messages in %d, want %d", c.MessagesIn, 3*len(msgs)+20)
	}
	// Each customer's partition is known, and it is one that took records.
	var known, wrong int
	err := e.pool.QueryRow(context.Background(), `
SELECT count(*), count(*) FILTER (WHERE p.records_in = 0)
FROM ingest_customers c JOIN ingest_partitions p USING (topic, partition)`).Scan(&known, &wrong)
	if err != nil || known != len(streams) || wrong != 0 {
		t.Errorf("ingest_customers: %d known (want %d), %d on idle partitions, %v", known, len(streams), wrong, err)
	}
}

func msgsRecords(t *testing.T, msgs []kafka.Message) []int {
	t.Helper()
	var out []int
	for _, m := range msgs {
		n := strings.Count(string(m.Value), `"operation_id"`)
		for range n {
			out = append(out, 1)
		}
	}
	return out
}

// Every sample of testdata/batches goes through: invalid messages and
// records become dead letters with their raw bytes and reasons, valid
// records are applied, and the partition keeps moving.
func TestBadInputGoesToDeadLetters(t *testing.T) {
	t.Parallel()
	e := newEnv(t, 1)
	files, err := filepath.Glob("../testdata/batches/*.json")
	if err != nil || len(files) == 0 {
		t.Fatalf("no sample batches: %v", err)
	}
	var msgs []kafka.Message
	wantWhole := 0
	for _, f := range files {
		v, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		key := "acme"
		base := filepath.Base(f)
		switch {
		case strings.Contains(base, "max-length-ids"):
			key = "acme-" + strings.Repeat("x", 123)
		case strings.Contains(base, "bad_key"):
			key = "ácme"
		}
		switch base {
		case "invalid-bad_json.json", "invalid-unknown_schema.json", "invalid-wrong_type.json", "invalid-bad_uuid.json",
			"invalid-bad_epoch.json", "invalid-too_many_records.json", "invalid-message_too_large.json",
			"invalid-empty_batch.json", "invalid-bad_key.json":
			wantWhole++
		}
		msgs = append(msgs, kafka.Message{Key: []byte(key), Value: v})
	}
	// A record the ledger rejects (occurred_at an hour ahead of its clock)
	// is a dead letter too, with the record's exact bytes from the message
	// (indented here, so a re-encoded record would differ).
	future := models(1)[0]
	fb := future.next(rand.New(rand.NewPCG(1, 1)), 2)
	fb.Records[1].OccurredAt = time.Now().UTC().Add(time.Hour).Truncate(time.Second)
	fm := encode(t, fb)
	var indented bytes.Buffer
	if err := json.Indent(&indented, fm.Value, "", "  "); err != nil {
		t.Fatal(err)
	}
	fm.Value = indented.Bytes()
	var sent struct{ Records []json.RawMessage }
	if err := json.Unmarshal(fm.Value, &sent); err != nil {
		t.Fatal(err)
	}
	msgs = append(msgs, fm)

	e.kafka.Produce(t, topic, msgs...)
	m := e.start()
	e.waitCaughtUp(30 * time.Second)
	m.Stop(t)
	e.checkOffsets()
	c := e.checkCounters()
	var futureRaw []byte
	var futureIdx int
	var futureField *string
	if err := e.pool.QueryRow(context.Background(), `SELECT raw, record_index, field FROM dead_letters WHERE reason = 'future_timestamp'`).Scan(&futureRaw, &futureIdx, &futureField); err != nil {
		t.Fatalf("no future_timestamp dead letter: %v", err)
	}
	if futureIdx != 1 || !bytes.Equal(futureRaw, sent.Records[1]) {
		t.Errorf("future_timestamp dead letter: index %d raw\n%s\nwant the bytes sent\n%s", futureIdx, futureRaw, sent.Records[1])
	}
	// The field at fault, as the decoder's dead letters name theirs.
	if futureField == nil || *futureField != "records[1].occurred_at" {
		t.Errorf("future_timestamp dead letter: field %v, want records[1].occurred_at", futureField)
	}
	if c.MessagesIn != int64(len(msgs)) || c.MessagesRejected != int64(wantWhole) {
		t.Errorf("messages in %d rejected %d; want %d and %d", c.MessagesIn, c.MessagesRejected, len(msgs), wantWhole)
	}

	ctx := context.Background()
	var whole, recs int
	if err := e.pool.QueryRow(ctx, `SELECT count(*) FILTER (WHERE record_index IS NULL), count(*) FILTER (WHERE record_index IS NOT NULL) FROM dead_letters`).Scan(&whole, &recs); err != nil {
		t.Fatal(err)
	}
	if whole != wantWhole {
		t.Errorf("%d whole-message dead letters, want %d", whole, wantWhole)
	}
	if int64(recs) != c.Rejected {
		t.Errorf("%d record dead letters, but %d records counted rejected", recs, c.Rejected)
	}
	// The raw bytes are the message's, byte for byte.
	var raw []byte
	if err := e.pool.QueryRow(ctx, `SELECT raw FROM dead_letters WHERE reason = 'bad_json'`).Scan(&raw); err != nil {
		t.Fatal(err)
	}
	want, _ := os.ReadFile("../testdata/batches/invalid-bad_json.json")
	if string(raw) != string(want) {
		t.Errorf("bad_json dead letter raw bytes differ from the message")
	}
	var reason, field, detail string
	if err := e.pool.QueryRow(ctx, `SELECT reason, coalesce(field, ''), detail FROM dead_letters WHERE reason = 'customer_mismatch'`).Scan(&reason, &field, &detail); err != nil {
		t.Fatal(err)
	}
	if !strings.HasPrefix(field, "records[") || detail == "" {
		t.Errorf("customer_mismatch dead letter: field %q detail %q", field, detail)
	}
	if m.Metric("tally_ingest_messages_total", map[string]string{"result": "rejected"}) != float64(wantWhole) {
		t.Errorf("metric messages rejected = %v", m.Metric("tally_ingest_messages_total", map[string]string{"result": "rejected"}))
	}
	checkReplay(t, e, fb.Records[1].OccurredAt)
}

// checkReplay: the future-timestamp record is refused again while its time
// has not come; once the ledger clock passes it, replay bills it, once.
func checkReplay(t *testing.T, e *env, occurred time.Time) {
	ctx := context.Background()
	pending, err := ingest.ListDeadLetters(ctx, e.pool, ingest.DeadLetterFilter{Customer: "cust-00", Pending: true, Limit: 1000})
	if err != nil {
		t.Fatal(err)
	}
	var id uuid.UUID
	for _, d := range pending {
		if d.Reason == "future_timestamp" {
			id = d.ID
		}
	}
	if id == uuid.Nil {
		t.Fatalf("future_timestamp dead letter not listed among %d pending", len(pending))
	}
	replay := func(now time.Time) (ingest.ReplayResult, error) {
		l, _ := ledger.New(ledger.Config{Clock: func() time.Time { return now }})
		var res ingest.ReplayResult
		err := pgx.BeginFunc(ctx, e.pool, func(tx pgx.Tx) error {
			var err error
			res, err = ingest.Replay(ctx, tx, l, id, now)
			return err
		})
		return res, err
	}
	res, err := replay(time.Now())
	if err != nil || res.Replayed || !strings.Contains(res.Detail, "refused again: future_timestamp") {
		t.Fatalf("early replay: %+v %v", res, err)
	}
	res, err = replay(occurred.Add(time.Minute))
	if err != nil || !res.Replayed || res.Outcomes["applied"] != 1 {
		t.Fatalf("replay: %+v %v", res, err)
	}
	if _, err := replay(occurred.Add(time.Minute)); !errors.Is(err, ingest.ErrAlreadyReplayed) {
		t.Fatalf("second replay: %v", err)
	}
	d, err := ingest.GetDeadLetter(ctx, e.pool, id)
	if err != nil || d.ReplayedAt == nil || *d.ReplayOutcome != "applied 1" {
		t.Fatalf("after replay: %+v %v", d, err)
	}
}

// Messages deleted by retention before ingest read them are an offset jump:
// recorded, counted and logged, and ingest continues after them.
func TestOffsetJumpIsRecorded(t *testing.T) {
	t.Parallel()
	e := newEnv(t, 1)
	rng := rand.New(rand.NewPCG(3, 4))
	s := models(1)[0]
	var msgs []kafka.Message
	for range 10 {
		msgs = append(msgs, encode(t, s.next(rng, 3)))
	}
	e.kafka.Produce(t, topic, msgs[:4]...)
	m := e.start()
	e.waitCaughtUp(30 * time.Second)
	m.Stop(t)

	// Retention deletes offsets 4..6 before they are read.
	e.kafka.Produce(t, topic, msgs[4:]...)
	if err := e.kafka.DeleteRecords(topic, 0, 7); err != nil {
		t.Fatal(err)
	}
	m = e.start()
	e.waitCaughtUp(30 * time.Second)
	m.Stop(t)

	var from, to int64
	if err := e.pool.QueryRow(context.Background(), `SELECT from_offset, to_offset FROM ingest_offset_jumps`).Scan(&from, &to); err != nil {
		t.Fatalf("no offset jump recorded: %v", err)
	}
	if from != 4 || to != 7 {
		t.Errorf("jump %d..%d, want 4..7", from, to)
	}
	if got := m.Metric("tally_ingest_offset_jumps_total", nil); got != 1 {
		t.Errorf("offset jump metric = %v, want 1", got)
	}
	// Records 13..21 (messages 4..6) never arrived: the next record reveals
	// a gap, and the billed total is still the model's last total (gap
	// usage is inside the next running total).
	e.checkLedgerTotals(s.customer, s.meter, s.total.String())
	e.checkOffsets()
	e.checkCounters()
}

func (e *env) checkLedgerTotals(customer, meter, want string) {
	e.t.Helper()
	var got string
	if err := e.pool.QueryRow(context.Background(), `SELECT coalesce(sum(billed), 0)::text FROM records WHERE customer = $1 AND meter = $2`, customer, meter).Scan(&got); err != nil {
		e.t.Fatal(err)
	}
	if got != want {
		e.t.Errorf("%s/%s billed %s, want %s", customer, meter, got, want)
	}
}

func TestConfigValidateReportsEverything(t *testing.T) {
	t.Parallel()
	err := ingest.Config{MaxBatchRecords: -1, RetryMin: time.Second, RetryMax: time.Millisecond}.Validate()
	if err == nil {
		t.Fatal("no error")
	}
	for _, want := range []string{"Brokers", "Pool", "Ledger", "MaxBatchRecords", "RetryMax"} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("error %q does not mention %s", err, want)
		}
	}
}

// An idle, caught-up partition keeps its applied-through time fresh, so
// consumers of the position (the quota enforcer's as_of) see no false lag.
func TestStatusOfAnIdlePartition(t *testing.T) {
	t.Parallel()
	e := newEnv(t, 2)
	rng := rand.New(rand.NewPCG(8, 9))
	s := models(1)[0]
	e.kafka.Produce(t, topic, encode(t, s.next(rng, 3)))
	m := e.start()
	e.waitCaughtUp(30 * time.Second)
	time.Sleep(600 * time.Millisecond) // a few PositionIntervals with nothing to read
	before := time.Now()
	if err := eventually(5*time.Second, func() error {
		st, err := ingest.Status(context.Background(), e.pool, topic)
		if err != nil {
			return err
		}
		if len(st) != 2 {
			return fmt.Errorf("%d partitions in status, want 2", len(st))
		}
		for _, p := range st {
			if p.Lag != 0 || p.AppliedThrough == nil || p.AppliedThrough.Before(before.Add(-time.Second)) {
				return fmt.Errorf("partition %d: lag %d, applied through %v (now %v)", p.Partition, p.Lag, p.AppliedThrough, time.Now())
			}
		}
		return nil
	}); err != nil {
		t.Error(err)
	}
	m.Stop(t)
}

// Ingest joins no Kafka consumer group, but it still commits the stored
// offsets to its group (outside any generation) so that Kafka lag
// dashboards keep working.
func TestStoredOffsetsAreCommittedToKafkaForDashboards(t *testing.T) {
	t.Parallel()
	e := newEnv(t, 2)
	streams := models(4)
	rng := rand.New(rand.NewPCG(41, 43))
	var msgs []kafka.Message
	for range 20 {
		msgs = append(msgs, encode(t, streams[rng.IntN(len(streams))].next(rng, 3)))
	}
	e.kafka.Produce(t, topic, msgs...)
	m := e.start(func(c *ingest.Config) { c.KafkaCommitEvery = 50 * time.Millisecond })
	defer m.Stop(t)
	e.waitCaughtUp(30 * time.Second)
	// One more message per partition after the catch-up: a commit follows it.
	for p := range 2 {
		e.kafka.ProduceTo(t, topic, p, encode(t, streams[p].next(rng, 1)))
	}
	e.waitCaughtUp(30 * time.Second)
	client := &kafka.Client{Addr: kafka.TCP(e.kafka.Addrs...), Transport: &kafka.Transport{}}
	defer client.Transport.(*kafka.Transport).CloseIdleConnections()
	if err := eventually(10*time.Second, func() error {
		res, err := client.OffsetFetch(context.Background(), &kafka.OffsetFetchRequest{GroupID: "tally-ingest",
			Topics: map[string][]int{topic: {0, 1}}})
		if err != nil {
			return err
		}
		stored := e.nextOffsets()
		if len(res.Topics[topic]) != 2 {
			return fmt.Errorf("offsets of %d partitions, want 2: %+v", len(res.Topics[topic]), res.Topics)
		}
		for _, p := range res.Topics[topic] {
			if p.Error != nil || p.CommittedOffset != stored[p.Partition] {
				return fmt.Errorf("partition %d: committed %d (%v), stored %d", p.Partition, p.CommittedOffset, p.Error, stored[p.Partition])
			}
		}
		return nil
	}); err != nil {
		t.Fatalf("offsets committed to Kafka: %v", err)
	}
}
