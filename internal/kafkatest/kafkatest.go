// Package kafkatest starts an in-process Kafka-protocol cluster (franz-go's
// kfake) for tests and helps produce raw messages to it through kafka-go,
// the only Kafka client Tally itself uses.
//
// Each call to New is its own cluster on its own random port; it is closed
// when the test ends. Nothing is mocked: clients speak the Kafka protocol
// over TCP.
package kafkatest

import (
	"context"
	"fmt"
	"strconv"
	"testing"
	"time"

	"github.com/segmentio/kafka-go"
	"github.com/twmb/franz-go/pkg/kfake"
)

// Topic is a topic to create with the cluster.
type Topic struct {
	Name       string
	Partitions int32
}

// Options configure a test cluster. The zero value starts one broker on a
// random port with no topics and no persistence.
type Options struct {
	Topics []Topic
	// DataDir, when set, persists the cluster's log there so a cluster
	// started again on the same directory has the same messages (a broker
	// restart).
	DataDir string
	// Port, when set, listens there instead of on a random port (to restart
	// a broker at the same address).
	Port int
	// MinSessionTimeout lowers the group session timeout the cluster accepts
	// (kfake's default minimum is 6s), so tests of dead members are fast.
	// Default 500ms.
	MinSessionTimeout time.Duration
	// MessageMaxBytes, when set, is the broker's message.max.bytes: the
	// largest record batch it accepts in a produce request (real Kafka's
	// default is 1048588). Default 4 MiB.
	MessageMaxBytes int
}

// Cluster is a running kfake cluster.
type Cluster struct {
	*kfake.Cluster
	Addrs []string
}

// New starts a cluster and closes it when t ends.
func New(t testing.TB, o Options) *Cluster {
	t.Helper()
	c, err := Start(o)
	if err != nil {
		t.Fatalf("kafkatest: %v", err)
	}
	t.Cleanup(c.Close)
	return c
}

// Start starts a cluster; the caller closes it.
func Start(o Options) (*Cluster, error) {
	if o.MinSessionTimeout == 0 {
		o.MinSessionTimeout = 500 * time.Millisecond
	}
	if o.MessageMaxBytes == 0 {
		o.MessageMaxBytes = 4 << 20
	}
	opts := []kfake.Opt{
		kfake.NumBrokers(1),
		kfake.GroupMinSessionTimeout(o.MinSessionTimeout),
		kfake.DefaultNumPartitions(1),
		// Larger than the wire format's 1 MiB message limit (docs/design.md §2), so a too-large message
		// reaches Tally (and its dead-letter table) instead of being
		// refused by the broker (unless MessageMaxBytes says otherwise).
		kfake.BrokerConfigs(map[string]string{"message.max.bytes": strconv.Itoa(o.MessageMaxBytes)}),
	}
	for _, tp := range o.Topics {
		opts = append(opts, kfake.SeedTopics(tp.Partitions, tp.Name))
	}
	if o.DataDir != "" {
		opts = append(opts, kfake.DataDir(o.DataDir))
	}
	if o.Port != 0 {
		opts = append(opts, kfake.Ports(o.Port))
	}
	kc, err := kfake.NewCluster(opts...)
	if err != nil {
		return nil, fmt.Errorf("start kfake: %w", err)
	}
	return &Cluster{Cluster: kc, Addrs: kc.ListenAddrs()}, nil
}

// Writer is a kafka-go Writer with a Transport of its own, so closing it
// leaves no idle connections (and no goroutines) behind.
type Writer struct {
	*kafka.Writer
	transport *kafka.Transport
}

// Close flushes and closes the writer and its connections.
func (w *Writer) Close() error {
	err := w.Writer.Close()
	w.transport.CloseIdleConnections()
	return err
}

// Writer returns a kafka-go Writer to topic that waits for every write to be
// acknowledged and routes by key (murmur2, as the Java client does).
// The caller closes it.
func (c *Cluster) Writer(topic string) *Writer {
	return NewWriter(c.Addrs, topic)
}

// NewWriter is Cluster.Writer for any brokers.
func NewWriter(brokers []string, topic string) *Writer {
	tr := &kafka.Transport{}
	return &Writer{transport: tr, Writer: &kafka.Writer{
		Transport:    tr,
		Addr:         kafka.TCP(brokers...),
		Topic:        topic,
		Balancer:     &kafka.Murmur2Balancer{},
		RequiredAcks: kafka.RequireAll,
		BatchTimeout: 5 * time.Millisecond,
		BatchSize:    1000,
		BatchBytes:   3 << 20, // below the broker's 4 MiB message.max.bytes (a record batch is one "message" to it)
		MaxAttempts:  10,
	}}
}

// PartitionWriter returns a Writer that sends every message to partition p.
func (c *Cluster) PartitionWriter(topic string, p int) *Writer {
	w := c.Writer(topic)
	w.Balancer = kafka.BalancerFunc(func(kafka.Message, ...int) int { return p })
	return w
}

// Produce writes msgs to topic (routed by key) and fails t on error.
func (c *Cluster) Produce(t testing.TB, topic string, msgs ...kafka.Message) {
	t.Helper()
	w := c.Writer(topic)
	defer w.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if err := w.WriteMessages(ctx, msgs...); err != nil {
		t.Fatalf("kafkatest: produce to %s: %v", topic, err)
	}
}

// ProduceTo writes msgs to one partition of topic and fails t on error.
func (c *Cluster) ProduceTo(t testing.TB, topic string, partition int, msgs ...kafka.Message) {
	t.Helper()
	w := c.PartitionWriter(topic, partition)
	defer w.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if err := w.WriteMessages(ctx, msgs...); err != nil {
		t.Fatalf("kafkatest: produce to %s/%d: %v", topic, partition, err)
	}
}

// HighWatermark returns the next offset to be written to topic/partition.
func (c *Cluster) HighWatermark(t testing.TB, topic string, partition int) int64 {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	conn, err := kafka.DialLeader(ctx, "tcp", c.Addrs[0], topic, partition)
	if err != nil {
		t.Fatalf("kafkatest: dial leader: %v", err)
	}
	defer conn.Close()
	_, last, err := conn.ReadOffsets()
	if err != nil {
		t.Fatalf("kafkatest: read offsets: %v", err)
	}
	return last
}
