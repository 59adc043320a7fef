package producer_test

import (
	"bytes"
	"context"
	"errors"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/segmentio/kafka-go"
	"github.com/twmb/franz-go/pkg/kmsg"

	"github.com/tally-ledger/tally/internal/kafkatest"
	"github.com/tally-ledger/tally/producer"
)

// ackLost writes to a real Kafka but tells the producer its first write
// failed, as when an acknowledgement is lost in the network.
type ackLost struct {
	*kafkatest.Writer
	calls atomic.Int32
}

func (w *ackLost) WriteMessages(ctx context.Context, msgs ...kafka.Message) error {
	if err := w.Writer.WriteMessages(ctx, msgs...); err != nil {
		return err
	}
	if w.calls.Add(1) == 1 {
		return errors.New("connection reset before the acknowledgement")
	}
	return nil
}

func TestARetryResendsTheSameBatch(t *testing.T) {
	c := newCluster(t, 1)
	w := &ackLost{Writer: c.Writer(topic)}
	defer w.Close()
	reg := prometheus.NewRegistry()
	p := newProducer(t, producer.Config{Writer: w, Dir: t.TempDir(), Registerer: reg})
	ctx := context.Background()
	for _, q := range []string{"1", "2"} {
		if err := p.Record(ctx, "acme", "m", d(q), time.Now()); err != nil {
			t.Fatal(err)
		}
	}
	fctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	if err := p.Flush(fctx); err != nil {
		t.Fatal(err)
	}
	r := kafka.NewReader(kafka.ReaderConfig{Brokers: c.Addrs, Topic: topic, Partition: 0, MaxWait: 500 * time.Millisecond})
	defer r.Close()
	var values [][]byte
	for range 2 {
		m, err := r.FetchMessage(fctx)
		if err != nil {
			t.Fatal(err)
		}
		values = append(values, m.Value)
	}
	if hw := c.HighWatermark(t, topic, 0); hw != 2 {
		t.Fatalf("%d messages in Kafka, want 2 (the batch and its retransmit)", hw)
	}
	if !bytes.Equal(values[0], values[1]) {
		t.Errorf("the retry is not the same batch:\n%s\n%s", values[0], values[1])
	}
	var errs float64
	mfs, _ := reg.Gather()
	for _, mf := range mfs {
		if mf.GetName() == "tally_producer_send_errors_total" {
			errs = mf.GetMetric()[0].GetCounter().GetValue()
		}
	}
	if errs != 1 {
		t.Errorf("send errors metric %v, want 1", errs)
	}
}

func TestKafkaOutageIsRiddenOut(t *testing.T) {
	addr, port, free := refusingPort(t)
	p := newProducer(t, producer.Config{Brokers: []string{addr}, Dir: t.TempDir(), WriteTimeout: 500 * time.Millisecond})
	ctx := context.Background()
	for range 3 {
		if err := p.Record(ctx, "acme", "m", d("1"), time.Now()); err != nil {
			t.Fatal(err)
		}
	}
	time.Sleep(300 * time.Millisecond) // a few failed attempts
	if p.Buffered() != 3 {
		t.Fatalf("buffered %d during the outage, want 3", p.Buffered())
	}
	free()
	c := kafkatest.New(t, kafkatest.Options{Port: port, Topics: []kafkatest.Topic{{Name: topic, Partitions: 1}}})
	fctx, cancel := context.WithTimeout(ctx, 20*time.Second)
	defer cancel()
	if err := p.Flush(fctx); err != nil {
		t.Fatal(err)
	}
	var n int
	for _, b := range readBatches(t, c, 1) {
		n += len(b.Records)
	}
	if n != 3 || p.Buffered() != 0 {
		t.Errorf("after the outage: %d records in Kafka, %d buffered; want 3 and 0", n, p.Buffered())
	}
}

// A broker that stops answering in the middle of a write (a paused or cut
// off broker: the connection stays up, the produce request gets no
// answer) does not hold Stop or Close past their context: kafka-go's
// writer, built by New, finishes a write on its own clock (10 s an
// attempt, three attempts) and its Close waits for it, so Stop with a
// 500 ms context took over 10 s. The records stay on disk for the next
// producer on Dir.
func TestStopIsBoundedWhenTheBrokerStopsAnswering(t *testing.T) {
	for _, end := range []string{"Stop", "Close"} {
		t.Run(end, func(t *testing.T) {
			c := newCluster(t, 1)
			produced := make(chan struct{}, 1)
			c.ControlKey(int16(kmsg.Produce), func(kmsg.Request) (kmsg.Response, error, bool) {
				c.KeepControl()
				select {
				case produced <- struct{}{}:
				default:
				}
				return nil, nil, true // no answer: the request hangs
			})
			dir := t.TempDir()
			p, err := producer.New(producer.Config{Brokers: c.Addrs, Topic: topic, Producer: "gw-1", Dir: dir, Linger: time.Millisecond})
			if err != nil {
				t.Fatal(err)
			}
			ctx := context.Background()
			for range 3 {
				if err := p.Record(ctx, "acme", "m", d("1"), time.Now()); err != nil {
					t.Fatal(err)
				}
			}
			select {
			case <-produced:
			case <-time.After(10 * time.Second):
				t.Fatal("no produce request reached the broker")
			}
			sctx, cancel := context.WithTimeout(ctx, 500*time.Millisecond)
			defer cancel()
			start := time.Now()
			if end == "Stop" {
				err = p.Stop(sctx)
			} else {
				err = p.Close(sctx)
			}
			took := time.Since(start)
			if !errors.Is(err, context.DeadlineExceeded) {
				t.Errorf("%s with a hung broker: %v, want context.DeadlineExceeded", end, err)
			}
			if took > 3*time.Second {
				t.Errorf("%s with a 500ms context took %s against a broker that stopped answering", end, took)
			}
			p2 := newProducer(t, producer.Config{Writer: refuseAll{}, Dir: dir})
			if p2.Buffered() < 3 {
				t.Errorf("buffered after the stop %d, want the 3 records (and Close's final one)", p2.Buffered())
			}
		})
	}
}
