package ingest_test

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"math/rand/v2"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/segmentio/kafka-go"

	"github.com/tally-ledger/tally/ingest"
	"github.com/tally-ledger/tally/ledger"
)

// installPoison makes the database refuse, deterministically, any record of
// the meter "poison": a trigger raises on the marker.
func installPoison(t *testing.T, e *env) {
	t.Helper()
	_, err := e.pool.Exec(context.Background(), `
CREATE FUNCTION test_poison() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    RAISE EXCEPTION 'poison record % refused by a test trigger', NEW.operation_id USING ERRCODE = 'P0001';
END $$;
CREATE TRIGGER test_poison BEFORE INSERT ON records FOR EACH ROW WHEN (NEW.meter = 'poison') EXECUTE FUNCTION test_poison();`)
	if err != nil {
		t.Fatal(err)
	}
}

// A message the database refuses deterministically (a trigger raises on
// it) inside a micro-batch of good ones: bisection isolates exactly that
// message as a store_refused dead letter with its bytes and the SQLSTATE,
// every other message is applied exactly once in one pass of the offsets,
// and once the cause is fixed the dead letter replays like any other.
func TestBisectionIsolatesTheRefusedMessage(t *testing.T) {
	t.Parallel()
	e := newEnv(t, 1)
	installPoison(t, e)
	rng := rand.New(rand.NewPCG(8, 9))
	streams := models(5)
	poison := &streamModel{producer: "gw-1", epoch: 1, customer: "cust-poison", meter: "poison"}
	var msgs []kafka.Message
	poisonAt := map[int64][]byte{} // offset -> value
	for i := range 41 {
		if i == 0 || i == 23 { // the first message and one in the middle
			m := encode(t, poison.next(rng, 2))
			poisonAt[int64(len(msgs))] = m.Value
			msgs = append(msgs, m)
			continue
		}
		msgs = append(msgs, encode(t, streams[i%len(streams)].next(rng, 1+rng.IntN(5))))
	}
	// Written before the consumer starts, so the first micro-batch holds
	// them all.
	e.kafka.ProduceTo(t, topic, 0, msgs...)
	m := e.start()
	e.waitCaughtUp(60 * time.Second)
	m.Stop(t)

	e.checkLedger(streams)
	e.checkOffsets()
	c := e.checkCounters()
	if c.MessagesIn != int64(len(msgs)) || c.MessagesRejected != 2 {
		t.Errorf("messages in %d rejected %d, want %d and 2", c.MessagesIn, c.MessagesRejected, len(msgs))
	}
	ctx := context.Background()
	dls, err := ingest.ListDeadLetters(ctx, e.pool, ingest.DeadLetterFilter{Limit: 100})
	if err != nil {
		t.Fatal(err)
	}
	if len(dls) != 2 {
		t.Fatalf("%d dead letters, want the 2 poison messages: %+v", len(dls), dls)
	}
	for _, d := range dls {
		want, ok := poisonAt[d.Offset]
		if !ok || d.Reason != ingest.ReasonStoreRefused || d.RecordIndex != nil {
			t.Errorf("dead letter at offset %d reason %s index %v; want store_refused at %v", d.Offset, d.Reason, d.RecordIndex, poisonAt)
			continue
		}
		if d.Raw == nil || !bytes.Equal([]byte(*d.Raw), want) || d.Key == nil || *d.Key != "cust-poison" {
			t.Errorf("dead letter at offset %d: key %v raw %v, want the message's bytes", d.Offset, d.Key, d.Raw)
		}
		if !strings.Contains(d.Detail, "SQLSTATE P0001") || !strings.Contains(d.Detail, "refused by a test trigger") {
			t.Errorf("dead letter detail %q lacks the SQLSTATE and the database's message", d.Detail)
		}
	}
	if js, err := json.MarshalIndent(dls[1], "", "  "); err == nil {
		t.Logf("a store_refused dead letter, as GET /v1/dead-letters shows it:\n%s", js)
	}
	if got := m.Metric("tally_ingest_dead_letters_total", map[string]string{"reason": "store_refused"}); got != 2 {
		t.Errorf("store_refused dead letters metric = %v, want 2", got)
	}

	// Replayed while the cause is still there: refused again, still pending.
	l, err := ledger.New(ledger.Config{})
	if err != nil {
		t.Fatal(err)
	}
	replay := func(id [16]byte) (ingest.ReplayResult, error) {
		var res ingest.ReplayResult
		err := pgx.BeginFunc(ctx, e.pool, func(tx pgx.Tx) error {
			var err error
			res, err = ingest.Replay(ctx, tx, l, id, time.Now())
			return err
		})
		return res, err
	}
	if _, err := replay(dls[0].ID); err == nil || !strings.Contains(err.Error(), "poison record") {
		t.Fatalf("replay before the fix: %v, want the database's refusal", err)
	}
	if _, err := e.pool.Exec(ctx, `DROP TRIGGER test_poison ON records`); err != nil {
		t.Fatal(err)
	}
	for _, d := range dls {
		res, err := replay(d.ID)
		if err != nil || !res.Replayed || res.Outcomes["applied"] != 2 {
			t.Fatalf("replay after the fix: %+v %v", res, err)
		}
	}
	e.checkLedger(append(streams, poison))
}

// A failure that retrying can cure (here the database reports a full disk,
// SQLSTATE 53100, on one message) is retried, never bisected or
// dead-lettered: the partition stalls, says so (status, the gauge, the
// stored last error), and once the cause is gone it resumes and bills
// everything exactly once.
func TestRetryableFailureStallsVisiblyAndResumes(t *testing.T) {
	t.Parallel()
	e := newEnv(t, 1)
	ctx := context.Background()
	diskFull(t, e)
	rng := rand.New(rand.NewPCG(10, 11))
	streams := models(3)
	full := &streamModel{producer: "gw-1", epoch: 1, customer: "cust-full", meter: "disk_full"}
	e.kafka.ProduceTo(t, topic, 0, encode(t, streams[0].next(rng, 3)))
	m := e.start(func(c *ingest.Config) { c.StallAfter = 500 * time.Millisecond })
	e.waitCaughtUp(30 * time.Second)
	e.kafka.ProduceTo(t, topic, 0, encode(t, streams[1].next(rng, 2)), encode(t, full.next(rng, 1)), encode(t, streams[2].next(rng, 2)))

	err := eventually(30*time.Second, func() error {
		st, err := ingest.Status(ctx, e.pool, topic)
		if err != nil {
			return err
		}
		if s := st[0]; s.RetryingSince == nil || !strings.Contains(s.LastError, "SQLSTATE 53100") || s.State == "consuming" {
			return fmt.Errorf("status %+v", s)
		}
		if g := m.Metric("tally_ingest_partition_stalled", map[string]string{"partition": "0"}); g != 1 {
			return fmt.Errorf("stalled gauge %v", g)
		}
		return nil
	})
	if err != nil {
		t.Fatalf("the stall is not visible: %v", err)
	}
	var dls int
	if err := e.pool.QueryRow(ctx, `SELECT count(*) FROM dead_letters`).Scan(&dls); err != nil || dls != 0 {
		t.Fatalf("%d dead letters (%v): a retryable failure must not be dead-lettered", dls, err)
	}
	if _, err := e.pool.Exec(ctx, `DROP TRIGGER test_disk_full ON records`); err != nil {
		t.Fatal(err)
	}
	e.waitCaughtUp(30 * time.Second)
	st, err := ingest.Status(ctx, e.pool, topic)
	if err != nil || st[0].State != "consuming" || st[0].RetryingSince != nil || st[0].LastError != "" {
		t.Fatalf("after the fix: %+v %v", st, err)
	}
	if g := m.Metric("tally_ingest_partition_stalled", map[string]string{"partition": "0"}); g != 0 {
		t.Errorf("stalled gauge %v after resuming", g)
	}
	m.Stop(t)
	e.checkLedger(append(streams, full))
	e.checkCounters()
	e.checkOffsets()
}

// A database that refuses every record (here a trigger raising on all of
// them; in life a broken schema) is not a reason to dead-letter messages
// one by one: the harmless canary record is refused too, so ingest retries,
// visibly, and once the database is fixed it bills everything exactly once,
// with no dead letter.
func TestDatabaseRefusingEverythingIsNotDeadLettered(t *testing.T) {
	t.Parallel()
	e := newEnv(t, 1)
	ctx := context.Background()
	_, err := e.pool.Exec(ctx, `
CREATE FUNCTION test_refuse_all() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    RAISE EXCEPTION 'records are refused by a test trigger';
END $$;
CREATE TRIGGER test_refuse_all BEFORE INSERT ON records FOR EACH ROW EXECUTE FUNCTION test_refuse_all();`)
	if err != nil {
		t.Fatal(err)
	}
	rng := rand.New(rand.NewPCG(16, 17))
	streams := models(3)
	var msgs []kafka.Message
	for i := range 6 {
		msgs = append(msgs, encode(t, streams[i%3].next(rng, 2)))
	}
	e.kafka.ProduceTo(t, topic, 0, msgs...)
	m := e.start()
	err = eventually(30*time.Second, func() error {
		st, err := ingest.Status(ctx, e.pool, topic)
		if err != nil || len(st) == 0 || !strings.Contains(st[0].LastError, "refused by a test trigger") {
			return fmt.Errorf("status %+v %v", st, err)
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	time.Sleep(time.Second) // let it retry a while
	var dls int
	if err := e.pool.QueryRow(ctx, `SELECT count(*) FROM dead_letters`).Scan(&dls); err != nil || dls != 0 {
		t.Fatalf("%d dead letters (%v) while the database refused everything; want none", dls, err)
	}
	if _, err := e.pool.Exec(ctx, `DROP TRIGGER test_refuse_all ON records`); err != nil {
		t.Fatal(err)
	}
	e.waitCaughtUp(30 * time.Second)
	m.Stop(t)
	e.checkLedger(streams)
	e.checkCounters()
	e.checkOffsets()
	if err := e.pool.QueryRow(ctx, `SELECT count(*) FROM dead_letters`).Scan(&dls); err != nil || dls != 0 {
		t.Fatalf("%d dead letters (%v); want none", dls, err)
	}
}

// A full default micro-batch (5000 one-record messages) with one message
// the database refuses: bisection finds exactly that one. The time to
// catch up is logged beside that of the same messages with nothing refused
// (what one bad message costs a partition); it is not asserted.
func TestBisectionOfAFullMicroBatch(t *testing.T) {
	t.Parallel()
	const n = ingest.DefaultMaxBatchRecords
	rng := rand.New(rand.NewPCG(18, 19))
	bad := 1 + rng.IntN(n-1)
	run := func(poisoned bool) time.Duration {
		e := newEnv(t, 1)
		if poisoned {
			installPoison(t, e)
		}
		rng := rand.New(rand.NewPCG(20, 21))
		streams := models(10)
		poison := &streamModel{producer: "gw-1", epoch: 1, customer: "cust-poison", meter: "poison"}
		msgs := make([]kafka.Message, 0, n)
		for i := range n {
			s := streams[i%len(streams)]
			if i == bad {
				s = poison
			}
			msgs = append(msgs, encode(t, s.next(rng, 1)))
		}
		e.kafka.ProduceTo(t, topic, 0, msgs...)
		t0 := time.Now()
		m := e.start(func(c *ingest.Config) {
			c.MaxBatchRecords, c.MaxBatchWait = n, 10*time.Second // one micro-batch
			c.RetryMin, c.RetryMax = ingest.DefaultRetryMin, ingest.DefaultRetryMax
		})
		e.waitCaughtUp(180 * time.Second)
		took := time.Since(t0)
		m.Stop(t)
		if !poisoned {
			e.checkLedger(append(streams, poison))
			return took
		}
		e.checkLedger(streams)
		e.checkOffsets()
		e.checkCounters()
		var offs []int64
		rows, err := e.pool.Query(context.Background(), `SELECT "offset" FROM dead_letters WHERE reason = 'store_refused'`)
		if err != nil {
			t.Fatal(err)
		}
		for rows.Next() {
			var o int64
			if err := rows.Scan(&o); err != nil {
				t.Fatal(err)
			}
			offs = append(offs, o)
		}
		rows.Close()
		if len(offs) != 1 || offs[0] != int64(bad) {
			t.Fatalf("store_refused dead letters at %v, want exactly offset %d", offs, bad)
		}
		t.Logf("transactions committed: %v", m.Metric("tally_ingest_batches_total", nil))
		return took
	}
	clean := run(false)
	poisoned := run(true)
	t.Logf("%d messages in one micro-batch: caught up in %v with nothing refused, %v with the message at offset %d refused and isolated",
		n, clean.Round(time.Millisecond), poisoned.Round(time.Millisecond), bad)
}

// TestRetryingSinceIsTheDatabases: a partition's retrying_since is
// compared with Postgres's clock (a partition is stalled once it is
// StallAfter old by now()), so it is written by that clock: an ingest
// host whose clock is an hour behind the database's shows a partition
// that has just started failing as retrying, not stalled, and /readyz
// does not fail for it before StallAfter.
func TestRetryingSinceIsTheDatabases(t *testing.T) {
	t.Parallel()
	e := newEnv(t, 1)
	ctx := context.Background()
	diskFull(t, e)
	rng := rand.New(rand.NewPCG(12, 13))
	full := &streamModel{producer: "gw-1", epoch: 1, customer: "cust-full", meter: "disk_full"}
	e.kafka.ProduceTo(t, topic, 0, encode(t, full.next(rng, 1)))
	var before time.Time
	if err := e.pool.QueryRow(ctx, `SELECT now()`).Scan(&before); err != nil {
		t.Fatal(err)
	}
	m := e.start(func(c *ingest.Config) { c.Clock = func() time.Time { return time.Now().Add(-time.Hour) } })
	defer m.Stop(t)
	var st []ingest.PartitionStatus
	err := eventually(30*time.Second, func() error {
		var err error
		if st, err = ingest.Status(ctx, e.pool, topic); err != nil {
			return err
		}
		if len(st) == 0 || st[0].RetryingSince == nil {
			return fmt.Errorf("status %+v", st)
		}
		return nil
	})
	if err != nil {
		t.Fatalf("the failure is not visible: %v", err)
	}
	if s := st[0]; s.State != "retrying" || s.RetryingSince.Before(before) {
		t.Fatalf("a partition failing for under %v: state %q, retrying since %v (the database's clock read %v before ingest started)",
			ingest.StallAfter, s.State, s.RetryingSince, before)
	}
}

// diskFull makes Postgres refuse every record of meter disk_full as a
// full disk would (SQLSTATE 53100): a failure that retrying cures once
// the trigger is dropped (DROP TRIGGER test_disk_full ON records).
func diskFull(t *testing.T, e *env) {
	t.Helper()
	_, err := e.pool.Exec(context.Background(), `
CREATE FUNCTION test_disk_full() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    RAISE EXCEPTION 'could not extend file: No space left on device' USING ERRCODE = '53100';
END $$;
CREATE TRIGGER test_disk_full BEFORE INSERT ON records FOR EACH ROW WHEN (NEW.meter = 'disk_full') EXECUTE FUNCTION test_disk_full();`)
	if err != nil {
		t.Fatal(err)
	}
}
