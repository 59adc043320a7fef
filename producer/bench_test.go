package producer_test

import (
	"context"
	"strconv"
	"testing"
	"time"

	"github.com/tally-ledger/tally/producer"
)

// BenchmarkRecord measures acknowledged (fsynced) Record calls: serial
// (one fsync pair per call), serial with an idempotency key per call, and
// from many goroutines sharing commits. Kafka is up, so batches are also
// formed and sent meanwhile.
func BenchmarkRecord(b *testing.B) {
	for _, tc := range []struct {
		name    string
		callers int
		keyed   bool
	}{{"serial", 1, false}, {"serial-keyed", 1, true}, {"callers=128", 64, false}} {
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
				for i := range b.N {
					var opts []producer.RecordOption
					if tc.keyed {
						opts = append(opts, producer.Key("job-"+strconv.Itoa(i)))
					}
					if err := p.Record(ctx, "acme", "api_calls", q, time.Now(), opts...); err != nil {
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
