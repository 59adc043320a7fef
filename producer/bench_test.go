package producer_test

import (
	"context"
	"testing"
	"time"

	"github.com/tally-ledger/tally/producer"
)

// BenchmarkRecord measures acknowledged (fsynced) Record calls: serial, and
// from many goroutines sharing commits. Kafka is up, so batches are also
// formed and sent meanwhile.
func BenchmarkRecord(b *testing.B) {
	for _, tc := range []struct {
		name    string
		callers int
	}{{"serial", 1}, {"callers=128", 64}} {
		b.Run(tc.name, func(b *testing.B) {
			c := kafkatestCluster(b)
			p, err := producer.New(producer.Config{Brokers: c.Addrs, Topic: topic, Producer: "bench", Dir: b.TempDir(), Linger: 20 * time.Millisecond})
			if err != nil {
				b.Fatal(err)
			}
			defer p.Close(context.Background())
			q := d("1.5")
			ctx := context.Background()
			b.ResetTimer()
			if tc.callers == 1 {
				for range b.N {
					if err := p.Record(ctx, "acme", "api_calls", q, time.Now()); err != nil {
						b.Fatal(err)
					}
				}
			} else {
				b.SetParallelism(tc.callers)
				b.RunParallel(func(pb *testing.PB) {
					for pb.Next() {
						if err := p.Record(ctx, "acme", "api_calls", q, time.Now()); err != nil {
							b.Error(err)
							return
						}
					}
				})
			}
			b.ReportMetric(float64(b.N)/b.Elapsed().Seconds(), "records/s")
		})
	}
}
