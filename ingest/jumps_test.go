package ingest_test

import (
	"context"
	"math/rand/v2"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"
)

// produceTx writes msgs to partition 0 in one Kafka transaction through
// franz-go (kafka-go has no transactional producer), committed or aborted.
func produceTx(t *testing.T, e *env, id string, commit bool, recs ...*kgo.Record) {
	t.Helper()
	cl, err := kgo.NewClient(kgo.SeedBrokers(e.kafka.Addrs...), kgo.TransactionalID(id),
		kgo.DefaultProduceTopic(topic), kgo.RecordPartitioner(kgo.ManualPartitioner()))
	if err != nil {
		t.Fatal(err)
	}
	defer cl.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if err := cl.BeginTransaction(); err != nil {
		t.Fatal(err)
	}
	for _, r := range recs {
		r.Partition = 0
		if err := cl.ProduceSync(ctx, r).FirstErr(); err != nil {
			t.Fatal(err)
		}
	}
	if err := cl.EndTransaction(ctx, kgo.TransactionEndTry(commit)); err != nil {
		t.Fatal(err)
	}
}

// A topic written by a transactional producer: each transaction's marker
// takes an offset that holds no usage. Those offsets are not lost usage: no
// offset jump is recorded, no dead letter, and the usage of committed
// transactions is billed exactly once. An aborted transaction retried with
// the same records (what a transactional producer does) is billed once too,
// and the abort is reported as an anomaly (kafka-go cannot filter it).
func TestTransactionMarkersAreNotOffsetJumps(t *testing.T) {
	t.Parallel()
	e := newEnv(t, 1)
	rng := rand.New(rand.NewPCG(12, 13))
	streams := models(2)
	rec := func(s *streamModel, n int) *kgo.Record {
		m := encode(t, s.next(rng, n))
		return &kgo.Record{Key: m.Key, Value: m.Value}
	}
	produceTx(t, e, "tx-1", true, rec(streams[0], 2), rec(streams[1], 3))
	produceTx(t, e, "tx-1", true, rec(streams[0], 1))
	retried := rec(streams[1], 2)
	produceTx(t, e, "tx-1", false, retried)
	produceTx(t, e, "tx-1", true, &kgo.Record{Key: retried.Key, Value: retried.Value})
	e.kafka.ProduceTo(t, topic, 0, encode(t, streams[1].next(rng, 2)))
	m := e.start()
	e.waitCaughtUp(30 * time.Second)
	m.Stop(t)
	e.checkLedger(streams)
	e.checkCounters()
	var jumps, dls int
	if err := e.pool.QueryRow(context.Background(), `SELECT (SELECT count(*) FROM ingest_offset_jumps), (SELECT count(*) FROM dead_letters)`).Scan(&jumps, &dls); err != nil {
		t.Fatal(err)
	}
	if jumps != 0 || dls != 0 {
		t.Errorf("%d offset jumps and %d dead letters for two committed transactions; want none", jumps, dls)
	}
	if g := m.Metric("tally_ingest_offset_jumps_total", map[string]string{"partition": "0"}); g != 0 {
		t.Errorf("offset jumps metric %v; operators would be paged for nothing", g)
	}
	for cause, want := range map[string]float64{"transaction_commit": 3, "transaction_abort": 1} {
		if g := m.Metric("tally_ingest_offsets_skipped_total", map[string]string{"cause": cause}); g != want {
			t.Errorf("skipped %s = %v, want %v", cause, g, want)
		}
	}
	if g := m.Metric("tally_ingest_anomalies_total", map[string]string{"kind": "aborted_transaction"}); g != 1 {
		t.Errorf("aborted_transaction anomalies = %v, want 1", g)
	}
}
