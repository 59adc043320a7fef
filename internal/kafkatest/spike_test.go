package kafkatest_test

import (
	"context"
	"errors"
	"fmt"
	"sort"
	"sync"
	"testing"
	"time"

	"github.com/segmentio/kafka-go"
	"go.uber.org/goleak"

	"github.com/tally-ledger/tally/internal/kafkatest"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// TestSpikeKafkaGoOnKfake proves the pieces ingest relies on work against
// kfake: kafka-go's Writer, its ConsumerGroup generation API (assignments,
// gen.Start, rebalance when a second member joins and when one leaves), and
// a partition Reader started at an explicit offset.
func TestSpikeKafkaGoOnKfake(t *testing.T) {
	const topic = "spike"
	c := kafkatest.New(t, kafkatest.Options{Topics: []kafkatest.Topic{{Name: topic, Partitions: 4}}})

	for p := range 4 {
		var msgs []kafka.Message
		for i := range 5 {
			msgs = append(msgs, kafka.Message{Key: []byte("k"), Value: fmt.Appendf(nil, "p%d-m%d", p, i)})
		}
		c.ProduceTo(t, topic, p, msgs...)
	}
	for p := range 4 {
		if hw := c.HighWatermark(t, topic, p); hw != 5 {
			t.Fatalf("partition %d: high watermark %d, want 5", p, hw)
		}
	}

	// A partition reader from an explicit offset.
	r := kafka.NewReader(kafka.ReaderConfig{Brokers: c.Addrs, Topic: topic, Partition: 2, MaxWait: 100 * time.Millisecond})
	if err := r.SetOffset(3); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	m, err := r.FetchMessage(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if m.Offset != 3 || string(m.Value) != "p2-m3" || m.HighWaterMark != 5 {
		t.Fatalf("got offset %d value %q hwm %d", m.Offset, m.Value, m.HighWaterMark)
	}
	r.Close()

	// Two members of one group: the first owns all four partitions, then
	// the second joins and they split them, then the second leaves.
	newGroup := func() *kafka.ConsumerGroup {
		g, err := kafka.NewConsumerGroup(kafka.ConsumerGroupConfig{
			ID: "spike-group", Brokers: c.Addrs, Topics: []string{topic},
			HeartbeatInterval: 100 * time.Millisecond, SessionTimeout: 2 * time.Second,
			RebalanceTimeout: 3 * time.Second, JoinGroupBackoff: 100 * time.Millisecond,
		})
		if err != nil {
			t.Fatal(err)
		}
		return g
	}
	owned := func(gen *kafka.Generation) []int {
		var ps []int
		for _, a := range gen.Assignments[topic] {
			ps = append(ps, a.ID)
		}
		sort.Ints(ps)
		return ps
	}

	g1 := newGroup()
	defer g1.Close()
	gen1, err := g1.Next(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if got := owned(gen1); len(got) != 4 {
		t.Fatalf("first member owns %v, want all 4", got)
	}
	// gen.Start functions see the generation end as ctx.Done.
	ended := make(chan struct{})
	gen1.Start(func(ctx context.Context) {
		<-ctx.Done()
		if !errors.Is(ctx.Err(), kafka.ErrGenerationEnded) {
			t.Errorf("generation ctx err = %v", ctx.Err())
		}
		close(ended)
	})

	g2 := newGroup()
	var (
		mu   sync.Mutex
		gen2 *kafka.Generation
		err2 error
	)
	done2 := make(chan struct{})
	go func() {
		defer close(done2)
		g, err := g2.Next(ctx)
		mu.Lock()
		gen2, err2 = g, err
		mu.Unlock()
	}()
	select {
	case <-ended:
	case <-ctx.Done():
		t.Fatal("first member's generation did not end when a second member joined")
	}
	gen1b, err := g1.Next(ctx)
	if err != nil {
		t.Fatal(err)
	}
	<-done2
	mu.Lock()
	if err2 != nil {
		t.Fatal(err2)
	}
	a, b := owned(gen1b), owned(gen2)
	mu.Unlock()
	if len(a)+len(b) != 4 || len(a) == 0 || len(b) == 0 {
		t.Fatalf("after rebalance: member 1 owns %v, member 2 owns %v", a, b)
	}
	t.Logf("after join: member 1 owns %v (generation %d), member 2 owns %v (generation %d)", a, gen1b.ID, b, gen2.ID)

	// Member 2 leaves; member 1 gets everything back.
	ended = make(chan struct{})
	gen1b.Start(func(ctx context.Context) { <-ctx.Done(); close(ended) })
	g2.Close()
	<-ended
	gen1c, err := g1.Next(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if got := owned(gen1c); len(got) != 4 {
		t.Fatalf("after leave: member 1 owns %v, want all 4", got)
	}
}
