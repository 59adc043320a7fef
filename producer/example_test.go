package producer_test

import (
	"context"
	"fmt"
	"os"
	"time"

	"github.com/segmentio/kafka-go"
	"github.com/shopspring/decimal"

	"github.com/tally-ledger/tally/ingest/wire"
	"github.com/tally-ledger/tally/internal/kafkatest"
	"github.com/tally-ledger/tally/producer"
)

// A producer records usage durably, then Close sends it with a final
// record per stream. Here an in-process Kafka stands in for the cluster,
// and the message is read back to show what the ledger receives.
func Example() {
	cluster, err := kafkatest.Start(kafkatest.Options{Topics: []kafkatest.Topic{{Name: "tally.meter-batches", Partitions: 1}}})
	if err != nil {
		panic(err)
	}
	defer cluster.Close()
	dir, err := os.MkdirTemp("", "producer-example")
	if err != nil {
		panic(err)
	}
	defer os.RemoveAll(dir)

	p, err := producer.New(producer.Config{
		Brokers:  cluster.Addrs,
		Producer: "gateway-eu-1", // stable across restarts
		Dir:      dir,            // durable state: epoch, counters, unsent records
	})
	if err != nil {
		panic(err)
	}
	ctx := context.Background()
	at := time.Date(2026, 12, 2, 9, 59, 58, 0, time.UTC)
	for _, q := range []string{"3", "1.25"} {
		// Returns once the usage is fsynced; from then on it is billed
		// exactly once, even if this process crashes now.
		if err := p.Record(ctx, "acme", "api_calls", decimal.RequireFromString(q), at); err != nil {
			panic(err)
		}
	}
	// Close (and Stop) send until their context ends: a timeout keeps a
	// Kafka outage from holding shutdown for good. What is unsent then
	// stays in Dir for the next producer on it, and the error says so.
	closeCtx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	if err := p.Close(closeCtx); err != nil { // flush, then "final": true per stream
		panic(err)
	}

	r := kafka.NewReader(kafka.ReaderConfig{Brokers: cluster.Addrs, Topic: "tally.meter-batches", Partition: 0, MaxWait: 100 * time.Millisecond})
	defer r.Close()
	m, err := r.ReadMessage(ctx)
	if err != nil {
		panic(err)
	}
	b, _, _, err := wire.Decode(m.Key, m.Value)
	if err != nil {
		panic(err)
	}
	fmt.Printf("key %s, producer %s, epoch > 0: %v\n", m.Key, b.Producer, b.Epoch > 0)
	for _, rec := range b.Records {
		fmt.Printf("%s %s seq=%d total=%s quantity=%s final=%v\n",
			rec.Customer, rec.Meter, rec.Seq, rec.Total, rec.Quantity.Decimal, rec.Final)
	}
	// Output:
	// key acme, producer gateway-eu-1, epoch > 0: true
	// acme api_calls seq=1 total=3 quantity=3 final=false
	// acme api_calls seq=2 total=4.25 quantity=1.25 final=false
	// acme api_calls seq=3 total=4.25 quantity=0 final=true
}
