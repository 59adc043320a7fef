package producer_test

import (
	"context"
	"errors"
	"fmt"
	"net"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/segmentio/kafka-go"
	"github.com/shopspring/decimal"

	"github.com/tally-ledger/tally/internal/kafkatest"
	"github.com/tally-ledger/tally/producer"
)

// kafkaDefaultMessageMaxBytes is real Kafka's default message.max.bytes:
// the largest record batch a broker accepts (1 MiB plus the 12-byte log
// overhead).
const kafkaDefaultMessageMaxBytes = 1048588

type streamID struct{ customer, meter string }

// recordBacklog records n records through p with concurrent callers: two
// hot customers get most of them, 200 cold ones a few each. It returns the
// expected total and record count per stream.
func recordBacklog(t *testing.T, p *producer.Producer, n int) (map[streamID]decimal.Decimal, map[streamID]int) {
	t.Helper()
	type rec struct {
		s streamID
		q decimal.Decimal
	}
	recs := make([]rec, n)
	want := make(map[streamID]decimal.Decimal)
	count := make(map[streamID]int)
	for i := range recs {
		var s streamID
		switch {
		case i%10 == 9: // 10% for 200 cold customers
			s = streamID{fmt.Sprintf("cold-%03d", (i/10)%200), "api_calls"}
		case i%2 == 0:
			s = streamID{"hot-1", []string{"api_calls", "storage_gb_hours"}[(i/2)%2]}
		default:
			s = streamID{"hot-2", "api_calls"}
		}
		q := decimal.New(int64(i%97)+1, -int32(i%3)) // 1..97, with 0–2 decimals
		recs[i] = rec{s, q}
		want[s] = want[s].Add(q)
		count[s]++
	}
	const workers = 64
	var wg sync.WaitGroup
	errs := make(chan error, workers)
	now := time.Now()
	for w := range workers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := w; i < n; i += workers {
				if err := p.Record(context.Background(), recs[i].s.customer, recs[i].s.meter, recs[i].q, now); err != nil {
					errs <- err
					return
				}
			}
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Fatal(err)
	}
	return want, count
}

// checkExactly reads the topic and checks that every stream's records
// arrived, each seq once or as identical duplicates, and sum to the
// expected totals.
func checkExactly(t *testing.T, c *kafkatest.Cluster, partitions int, want map[streamID]decimal.Decimal, count map[streamID]int) {
	t.Helper()
	type seen struct {
		total decimal.Decimal
		q     decimal.Decimal
	}
	got := make(map[streamID]map[int64]seen)
	for _, b := range readBatches(t, c, partitions) {
		for _, r := range b.Records {
			s := streamID{r.Customer, r.Meter}
			if got[s] == nil {
				got[s] = make(map[int64]seen)
			}
			v := seen{r.Total, r.Quantity.Decimal}
			if old, dup := got[s][r.Seq]; dup && (!old.total.Equal(v.total) || !old.q.Equal(v.q)) {
				t.Fatalf("%v seq %d arrived twice with different contents", s, r.Seq)
			}
			got[s][r.Seq] = v
		}
	}
	if len(got) != len(want) {
		t.Errorf("%d streams in Kafka, want %d", len(got), len(want))
	}
	for s, w := range want {
		seqs := got[s]
		sum := decimal.Zero
		for _, v := range seqs {
			sum = sum.Add(v.q)
		}
		last := seqs[int64(count[s])]
		if len(seqs) != count[s] || !sum.Equal(w) || !last.total.Equal(w) {
			t.Errorf("%v: %d seqs, quantities sum to %s, last total %s; want %d seqs summing to %s", s, len(seqs), sum, last.total, count[s], w)
		}
	}
}

// A backlog far above the broker's message size limit, built up during an
// outage, drains once the broker is back: no produce request carries more
// than the broker accepts for one partition.
func TestABacklogAboveTheBrokersMessageLimitDrains(t *testing.T) {
	addr, port, free := refusingPort(t)
	reg := prometheus.NewRegistry()
	p := newProducer(t, producer.Config{Brokers: []string{addr}, Dir: t.TempDir(),
		WriteTimeout: 5 * time.Second, MaxBuffered: 200_000, Registerer: reg})
	want, count := recordBacklog(t, p, 100_000)
	if b := p.Buffered(); b != 100_000 {
		t.Fatalf("buffered %d during the outage, want 100000", b)
	}
	free()

	c := kafkatest.New(t, kafkatest.Options{Port: port, MessageMaxBytes: kafkaDefaultMessageMaxBytes,
		Topics: []kafkatest.Topic{{Name: topic, Partitions: 2}}})
	fctx, cancel := context.WithTimeout(context.Background(), 4*time.Minute)
	defer cancel()
	if err := p.Flush(fctx); err != nil {
		t.Fatalf("%v (buffered %d)", err, p.Buffered())
	}
	checkExactly(t, c, 2, want, count)
}

// A broker whose limit is below even one stored batch (a topic's
// max.message.bytes lowered below MaxBatchBytes): the producer sends less
// at once, then splits the batches it refuses, and says so in a metric.
func TestABrokerLimitBelowOneBatchSplitsIt(t *testing.T) {
	c := kafkatest.New(t, kafkatest.Options{MessageMaxBytes: 100_000,
		Topics: []kafkatest.Topic{{Name: topic, Partitions: 1}}})
	reg := prometheus.NewRegistry()
	dir := t.TempDir()
	// Record with the broker unreachable so that the batches are formed at
	// the full MaxBatchBytes before the first send.
	p := newProducer(t, producer.Config{Writer: refuseAll{}, Dir: dir, Registerer: reg})
	want, count := recordBacklog(t, p, 20_000)
	short, cancelShort := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancelShort()
	if err := p.Flush(short); err == nil { // forms every batch, sends none
		t.Fatal("Flush succeeded through a writer that refuses everything")
	}
	stopNow, cancelNow := context.WithCancel(context.Background())
	cancelNow()
	_ = p.Stop(stopNow)

	p2 := newProducer(t, producer.Config{Brokers: c.Addrs, Dir: dir, Registerer: reg})
	fctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	if err := p2.Flush(fctx); err != nil {
		t.Fatalf("%v (buffered %d)", err, p2.Buffered())
	}
	checkExactly(t, c, 1, want, count)
	if n := counter(t, reg, "tally_producer_size_refusals_total"); n == 0 {
		t.Error("tally_producer_size_refusals_total is 0; the broker refused messages as too large")
	}
}

// refuseAll is a Kafka that is down.
type refuseAll struct{}

func (refuseAll) WriteMessages(context.Context, ...kafka.Message) error {
	return errors.New("connection refused")
}

// counter reads one counter of reg (the sum over its label values).
func counter(t *testing.T, reg *prometheus.Registry, name string) float64 {
	t.Helper()
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	var v float64
	for _, mf := range mfs {
		if mf.GetName() == name {
			for _, m := range mf.GetMetric() {
				v += m.GetCounter().GetValue()
			}
		}
	}
	return v
}

// refusingPort is a broker address nothing answers at: it cuts every
// connection at once. The port stays taken until free is called, so that a
// broker another test starts meanwhile cannot get it (a port merely closed
// can be handed to the next listener); free it just before a broker here
// binds it.
func refusingPort(t *testing.T) (addr string, port int, free func()) {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	done := make(chan struct{})
	go func() {
		defer close(done)
		for {
			c, err := l.Accept()
			if err != nil {
				return
			}
			c.Close()
		}
	}()
	var once sync.Once
	free = func() { once.Do(func() { l.Close(); <-done }) }
	t.Cleanup(free)
	return l.Addr().String(), l.Addr().(*net.TCPAddr).Port, free
}
