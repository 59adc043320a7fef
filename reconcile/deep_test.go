package reconcile_test

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/segmentio/kafka-go"

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
}
