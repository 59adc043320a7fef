package reconcile_test

import (
	"context"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/segmentio/kafka-go"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/tally-ledger/tally/ingest/wire"
	"github.com/tally-ledger/tally/internal/kafkatest"
	"github.com/tally-ledger/tally/ledger"
	"github.com/tally-ledger/tally/reconcile"
)

// TestDeepRecomputesFromKafka: the same records go to Kafka and (here
// directly) to the ledger; the deep check re-reads Kafka with the wire
// decoder alone and agrees, until a stream's state is tampered with.
func TestDeepRecomputesFromKafka(t *testing.T) {
	e := newEnv(t)
	kc := kafkatest.New(t, kafkatest.Options{Topics: []kafkatest.Topic{{Name: "tally.meter-batches", Partitions: 2}}})
	recs := []ledger.Record{rec("gw", 1, "acme", 1, "10", "10", nov), rec("gw", 1, "acme", 2, "15", "5", nov), rec("gw", 1, "bolt", 1, "3", "3", nov)}
	e.apply(recs...)
	for _, r := range recs {
		b := wire.Batch{Schema: wire.Schema, BatchID: uuid.Must(uuid.NewV7()), Producer: r.Stream.Producer, Epoch: r.Stream.Epoch, SentAt: nov,
			Records: []wire.Record{{OperationID: r.OperationID, Customer: r.Stream.Customer, Meter: r.Stream.Meter, Seq: r.Seq,
				Total: r.Total, Quantity: r.Quantity, OccurredAt: r.OccurredAt}}}
		v, err := wire.Encode(b)
		if err != nil {
			t.Fatal(err)
		}
		kc.Produce(t, "tally.meter-batches", kafka.Message{Key: []byte(r.Stream.Customer), Value: v})
	}
	rc, err := reconcile.New(reconcile.Config{Pool: e.pool, Clock: func() time.Time { return e.now },
		Deep: reconcile.KafkaSource{Brokers: kc.Addrs, Topic: "tally.meter-batches"}})
	if err != nil {
		t.Fatal(err)
	}
	r, err := rc.Run(context.Background(), reconcile.Options{Period: "2026-11-01", Deep: true})
	if err != nil || r.Status != reconcile.StatusClean {
		t.Fatalf("deep run: %v %s %+v", err, r.Status, r.Findings)
	}
	if c := r.Checks[len(r.Checks)-1]; c.Name != reconcile.CheckDeep || c.Status != "ok" || !strings.HasPrefix(c.Detail, "2 streams recomputed") {
		t.Fatalf("deep check: %+v", c)
	}
	e.exec(`UPDATE streams SET last_total = 14, last_seq = 2 WHERE customer = 'acme'`)
	r, err = rc.Run(context.Background(), reconcile.Options{Period: "2026-11-01", Deep: true})
	if err != nil {
		t.Fatal(err)
	}
	var deep []reconcile.Finding
	for _, f := range r.Findings {
		if f.Kind == reconcile.KindDeepMismatch {
			deep = append(deep, f)
		}
	}
	if len(deep) != 1 || deep[0].Amount.String() != "-1" || deep[0].Detail != "Kafka's messages end at seq 2 total 15; the ledger at seq 2 total 14" {
		t.Fatalf("deep findings: %+v", deep)
	}
	// A record changed in place below where a run found its stream adding
	// up escapes a routine run's stream check, which sums a stream's
	// records from there (Tally never changes a record); the rollups of
	// the record's period still disagree with it, and a deep run sums
	// every record of the stream.
	e.exec(`UPDATE records SET billed = billed + 1 WHERE customer = 'bolt'`)
	kinds := func(r *reconcile.Run) (out []string) {
		for _, f := range r.Findings {
			out = append(out, f.Kind)
		}
		return out
	}
	if r := e.run(reconcile.Options{Period: "2026-11-01", Customer: "bolt"}); !slices.Equal(kinds(r), []string{reconcile.KindRollupMismatch}) {
		t.Fatalf("routine run after bolt's record changed: %+v", r.Findings)
	}
	r, err = rc.Run(context.Background(), reconcile.Options{Period: "2026-11-01", Customer: "bolt", Deep: true})
	if err != nil {
		t.Fatal(err)
	}
	if !slices.Contains(kinds(r), reconcile.KindStreamMismatch) {
		t.Fatalf("deep run after bolt's record changed: %+v", r.Findings)
	}
}

// produce sends records to Kafka, one message each, as a producer would.
func produce(t *testing.T, kc *kafkatest.Cluster, recs ...ledger.Record) {
	t.Helper()
	for _, r := range recs {
		b := wire.Batch{Schema: wire.Schema, BatchID: uuid.Must(uuid.NewV7()), Producer: r.Stream.Producer, Epoch: r.Stream.Epoch, SentAt: r.OccurredAt,
			Records: []wire.Record{{OperationID: r.OperationID, Customer: r.Stream.Customer, Meter: r.Stream.Meter, Seq: r.Seq,
				Total: r.Total, Quantity: r.Quantity, OccurredAt: r.OccurredAt}}}
		v, err := wire.Encode(b)
		if err != nil {
			t.Fatal(err)
		}
		kc.ProduceTo(t, "tally.meter-batches", 0, kafka.Message{Key: []byte(r.Stream.Customer), Value: v})
	}
}

func deepRun(t *testing.T, e *env, kc *kafkatest.Cluster, period string) *reconcile.Run {
	t.Helper()
	rc, err := reconcile.New(reconcile.Config{Pool: e.pool, Clock: func() time.Time { return e.now },
		Deep: reconcile.KafkaSource{Brokers: kc.Addrs, Topic: "tally.meter-batches"}})
	if err != nil {
		t.Fatal(err)
	}
	r, err := rc.Run(context.Background(), reconcile.Options{Period: period, Deep: true})
	if err != nil {
		t.Fatal(err)
	}
	return r
}

func deepCheck(r *reconcile.Run) reconcile.Check {
	for _, c := range r.Checks {
		if c.Name == reconcile.CheckDeep {
			return c
		}
	}
	return reconcile.Check{}
}

// TestDeepComparesThePeriodPerMeter: usage billed to the wrong period has
// the right stream totals; the deep check recomputes the period's usage
// per meter and finds it.
func TestDeepComparesThePeriodPerMeter(t *testing.T) {
	e := newEnv(t)
	kc := kafkatest.New(t, kafkatest.Options{Topics: []kafkatest.Topic{{Name: "tally.meter-batches", Partitions: 1}}})
	oct := time.Date(2026, 10, 20, 0, 0, 0, 0, time.UTC)
	sent := []ledger.Record{rec("gw", 1, "acme", 1, "10", "10", oct), rec("gw", 1, "acme", 2, "15", "5", nov)}
	produce(t, kc, sent...)
	// The ledger saw seq 2 as October usage (a clock or calendar fault).
	e.apply(sent[0], rec("gw", 1, "acme", 2, "15", "5", oct))
	r := deepRun(t, e, kc, "2026-11-01")
	var deep []reconcile.Finding
	for _, f := range r.Findings {
		if f.Kind == reconcile.KindDeepMismatch {
			deep = append(deep, f)
		}
	}
	if len(deep) != 1 || deep[0].Amount.String() != "-5" || deep[0].Meter != "calls" {
		t.Fatalf("deep findings: %+v", r.Findings)
	}
}

// TestDeepSaysWhatItCouldNotCheck: after retention deleted messages, the
// streams they held are reported as not checked, never ok; a ledger stream
// Kafka never held is compared when no message was lost.
func TestDeepSaysWhatItCouldNotCheck(t *testing.T) {
	e := newEnv(t)
	kc := kafkatest.New(t, kafkatest.Options{Topics: []kafkatest.Topic{{Name: "tally.meter-batches", Partitions: 1}}})
	e.apply(rec("gw", 1, "ghost", 1, "7", "7", nov)) // in the ledger, never in Kafka
	r := deepRun(t, e, kc, "2026-11-01")
	if c := deepCheck(r); c.Status != "findings" || r.Status != reconcile.StatusDiscrepancies {
		t.Fatalf("a ledger stream Kafka never held: %s %+v %+v", r.Status, c, r.Findings)
	}
	recs := []ledger.Record{rec("gw", 1, "acme", 1, "10", "10", nov), rec("gw", 1, "acme", 2, "15", "5", nov)}
	produce(t, kc, recs...)
	e.apply(recs...)
	e.exec(`UPDATE streams SET last_total = 99 WHERE customer = 'acme'`) // tampered
	if err := kc.DeleteRecords("tally.meter-batches", 0, 2); err != nil {
		t.Fatal(err)
	}
	r = deepRun(t, e, kc, "2026-11-01")
	c := deepCheck(r)
	if c.Status == "ok" || !strings.Contains(c.Detail, "not checked") {
		t.Fatalf("deep check after retention: %+v", c)
	}
	var nc []string
	for _, f := range r.Findings {
		if f.Kind == reconcile.KindDeepNotChecked {
			nc = append(nc, f.Customer)
		}
	}
	if strings.Join(nc, ",") != "acme,ghost" {
		t.Fatalf("not checked: %v (%+v)", nc, r.Findings)
	}
}

// TestDeepComparesThroughIngestsPosition: in a deployment ingest goes on
// while the deep check runs, and Kafka holds messages ingest has not
// applied yet (its lag, and whatever producers send during the run).
// The ledger the run reads is a snapshot that holds exactly the messages
// below ingest's position in each partition, as ingest commits its
// records and its position together; the deep check compares Kafka's
// messages through that position, and says how many it left for later.
func TestDeepComparesThroughIngestsPosition(t *testing.T) {
	e := newEnv(t)
	kc := kafkatest.New(t, kafkatest.Options{Topics: []kafkatest.Topic{{Name: "tally.meter-batches", Partitions: 1}}})
	applied := []ledger.Record{rec("gw", 1, "acme", 1, "10", "10", nov), rec("gw", 1, "acme", 2, "15", "5", nov)}
	produce(t, kc, applied...)
	e.apply(applied...)
	e.exec(`INSERT INTO ingest_partitions (topic, partition, next_offset, high_watermark) VALUES ('tally.meter-batches', 0, 2, 2)`)
	// Sent since: in Kafka, not applied yet.
	produce(t, kc, rec("gw", 1, "acme", 3, "21", "6", nov), rec("gw", 1, "bolt", 1, "4", "4", nov))
	r := deepRun(t, e, kc, "2026-11-01")
	if c := deepCheck(r); c.Status != "ok" || !strings.Contains(c.Detail, "1 streams recomputed") ||
		!strings.Contains(c.Detail, "2 messages past ingest's position not read") {
		t.Fatalf("deep check with ingest behind Kafka: %+v %+v", c, r.Findings)
	}
	// Applied meanwhile (records and position in one transaction, as
	// ingest commits them): the next run compares them.
	e.apply(rec("gw", 1, "acme", 3, "21", "6", nov), rec("gw", 1, "bolt", 1, "4", "4", nov))
	e.exec(`UPDATE ingest_partitions SET next_offset = 4, high_watermark = 4`)
	r = deepRun(t, e, kc, "2026-11-01")
	if c := deepCheck(r); c.Status != "ok" || !strings.HasPrefix(c.Detail, "2 streams recomputed") || strings.Contains(c.Detail, "past ingest's position") {
		t.Fatalf("deep check with ingest caught up: %+v %+v", c, r.Findings)
	}
}

// TestDeepLeavesDeadLettersToTheirCheck: a record the ledger refused (a
// counter reset without a new epoch: its total decreased) is a dead
// letter, reported by conflicts_and_dead_letters until it is replayed or
// its loss accepted. The deep check recomputes what the ledger applied,
// so it leaves such a record out while it is a dead letter (not
// replayed), instead of reporting the same refusal again as a mismatch
// that no acceptance clears.
func TestDeepLeavesDeadLettersToTheirCheck(t *testing.T) {
	e := newEnv(t)
	kc := kafkatest.New(t, kafkatest.Options{Topics: []kafkatest.Topic{{Name: "tally.meter-batches", Partitions: 1}}})
	sent := []ledger.Record{rec("gw", 1, "acme", 1, "10", "10", nov), rec("gw", 1, "acme", 2, "4", "", nov)}
	produce(t, kc, sent...)
	if out := e.apply(sent...); out[1].Kind != ledger.Rejected {
		t.Fatalf("outcomes %+v, want the decrease rejected", out)
	}
	// What ingest writes for it, at its place in Kafka (offset 1, record 0).
	e.exec(`INSERT INTO ingest_partitions (topic, partition, next_offset, high_watermark) VALUES ('tally.meter-batches', 0, 2, 2);
INSERT INTO dead_letters (id, topic, partition, "offset", record_index, reason, detail, key, raw, producer, epoch, created_at)
VALUES ('01a25240-0000-7000-8000-000000000001', 'tally.meter-batches', 0, 1, 0, 'total_decreased', 'total 4 is below 10', 'acme', '{}', 'gw', 1, '2026-11-20 12:00:00+00')`)
	deepKinds := func() (out []string) {
		for _, f := range deepRun(t, e, kc, "2026-11-01").Findings {
			if f.Kind == reconcile.KindDeepMismatch || f.Kind == reconcile.KindDeadLetter {
				out = append(out, f.Kind)
			}
		}
		return out
	}
	if got := deepKinds(); !slices.Equal(got, []string{reconcile.KindDeadLetter}) {
		t.Fatalf("findings %v, want the dead letter alone", got)
	}
	// The loss accepted: nothing left to report.
	if err := reconcile.Accept(context.Background(), e.pool, reconcile.Acceptance{Kind: reconcile.AcceptDeadLetter,
		ID: uuid.MustParse("01a25240-0000-7000-8000-000000000001"), Actor: "alice", Reason: "counter reset, usage not billable"}); err != nil {
		t.Fatal(err)
	}
	if got := deepKinds(); len(got) != 0 {
		t.Fatalf("findings %v after the loss was accepted, want none", got)
	}
}

// TestDeepReadsATopicEndingInATransactionMarker: a transactional producer
// ends each transaction with a marker, an offset no consumer is given.
// When a partition's last offset is such a marker, the deep check's read
// (which stops at the last offset) must end there, not wait for a
// message that never comes (kafka-go hands the marker's offset to the
// reader, which the wire decoder refuses).
func TestDeepReadsATopicEndingInATransactionMarker(t *testing.T) {
	e := newEnv(t)
	kc := kafkatest.New(t, kafkatest.Options{Topics: []kafkatest.Topic{{Name: "tally.meter-batches", Partitions: 1}}})
	sent := []ledger.Record{rec("gw", 1, "acme", 1, "10", "10", nov), rec("gw", 1, "acme", 2, "15", "5", nov)}
	e.apply(sent...)
	cl, err := kgo.NewClient(kgo.SeedBrokers(kc.Addrs...), kgo.TransactionalID("deep-tx"),
		kgo.DefaultProduceTopic("tally.meter-batches"), kgo.RecordPartitioner(kgo.ManualPartitioner()))
	if err != nil {
		t.Fatal(err)
	}
	defer cl.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	if err := cl.BeginTransaction(); err != nil {
		t.Fatal(err)
	}
	for _, r := range sent {
		v, err := wire.Encode(wire.Batch{Schema: wire.Schema, BatchID: uuid.Must(uuid.NewV7()), Producer: "gw", Epoch: 1, SentAt: nov,
			Records: []wire.Record{{OperationID: r.OperationID, Customer: "acme", Meter: "calls", Seq: r.Seq, Total: r.Total, Quantity: r.Quantity, OccurredAt: r.OccurredAt}}})
		if err != nil {
			t.Fatal(err)
		}
		if err := cl.ProduceSync(ctx, &kgo.Record{Key: []byte("acme"), Value: v, Partition: 0}).FirstErr(); err != nil {
			t.Fatal(err)
		}
	}
	if err := cl.EndTransaction(ctx, kgo.TryCommit); err != nil {
		t.Fatal(err)
	}
	rc, err := reconcile.New(reconcile.Config{Pool: e.pool, Clock: func() time.Time { return e.now },
		Deep: reconcile.KafkaSource{Brokers: kc.Addrs, Topic: "tally.meter-batches"}})
	if err != nil {
		t.Fatal(err)
	}
	rctx, rcancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer rcancel()
	r, err := rc.Run(rctx, reconcile.Options{Period: "2026-11-01", Deep: true})
	if err != nil {
		t.Fatalf("deep run over a partition ending in a transaction marker: %v", err)
	}
	if c := deepCheck(r); c.Status != "ok" || !strings.HasPrefix(c.Detail, "1 streams recomputed") {
		t.Fatalf("deep check: %+v %+v", c, r.Findings)
	}
}
