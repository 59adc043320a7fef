package reconcile

import (
	"context"
	"errors"
	"fmt"
	"net"
	"strconv"
	"time"

	"github.com/segmentio/kafka-go"

	"github.com/tally-ledger/tally/ingest/wire"
)

// KafkaSource is the DeepSource that reads the metering topic from the
// first offset Kafka still has to the end, decoding every message with the
// wire decoder only: the totals it returns never went through the ledger.
type KafkaSource struct {
	Brokers []string
	Topic   string
}

// StreamTotals returns, per stream of the given customers, the highest seq
// found in the topic and its total.
func (k KafkaSource) StreamTotals(ctx context.Context, customers []string) (map[StreamID]StreamTotal, error) {
	if len(k.Brokers) == 0 {
		return nil, errors.New("no Kafka brokers")
	}
	want := make(map[string]bool, len(customers))
	for _, c := range customers {
		want[c] = true
	}
	conn, err := kafka.DialContext(ctx, "tcp", k.Brokers[0])
	if err != nil {
		return nil, fmt.Errorf("kafka: %w", err)
	}
	parts, err := conn.ReadPartitions(k.Topic)
	conn.Close()
	if err != nil {
		return nil, fmt.Errorf("kafka: partitions of %s: %w", k.Topic, err)
	}
	out := map[StreamID]StreamTotal{}
	for _, p := range parts {
		if err := k.readPartition(ctx, p, want, out); err != nil {
			return nil, err
		}
	}
	return out, nil
}

func (k KafkaSource) readPartition(ctx context.Context, p kafka.Partition, want map[string]bool, out map[StreamID]StreamTotal) error {
	leader := net.JoinHostPort(p.Leader.Host, strconv.Itoa(p.Leader.Port))
	conn, err := kafka.DialLeader(ctx, "tcp", leader, k.Topic, p.ID)
	if err != nil {
		return fmt.Errorf("kafka: partition %d: %w", p.ID, err)
	}
	first, last, err := conn.ReadOffsets()
	conn.Close()
	if err != nil {
		return fmt.Errorf("kafka: offsets of partition %d: %w", p.ID, err)
	}
	complete := first == 0
	if last <= first {
		return nil
	}
	r := kafka.NewReader(kafka.ReaderConfig{Brokers: k.Brokers, Topic: k.Topic, Partition: p.ID, MaxWait: 500 * time.Millisecond})
	defer r.Close()
	if err := r.SetOffset(first); err != nil {
		return err
	}
	for {
		m, err := r.FetchMessage(ctx)
		if err != nil {
			return fmt.Errorf("kafka: read partition %d: %w", p.ID, err)
		}
		if want[string(m.Key)] {
			if b, idx, _, err := wire.Decode(m.Key, m.Value); err == nil {
				_ = idx
				for _, rec := range b.Records {
					id := StreamID{Producer: b.Producer, Epoch: b.Epoch, Customer: rec.Customer, Meter: rec.Meter}
					cur, ok := out[id]
					if !ok || rec.Seq > cur.LastSeq {
						out[id] = StreamTotal{LastSeq: rec.Seq, LastTotal: rec.Total, Complete: complete}
					}
				}
			}
		}
		if m.Offset+1 >= last {
			return nil
		}
	}
}
