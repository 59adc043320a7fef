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
	"github.com/tally-ledger/tally/ledger"
)

// KafkaSource is the DeepSource that reads the metering topic from the
// first offset Kafka still has to the end, decoding every message with the
// wire decoder only: the records it returns never went through the ledger.
type KafkaSource struct {
	Brokers []string
	Topic   string
}

// Read passes to emit every record of the given customers the topic still
// holds below ingest's position, and returns where their messages are,
// which partitions retention truncated and how many messages past the
// position it left unread.
func (k KafkaSource) Read(ctx context.Context, customers []string, applied Positions, emit func(StreamID, KafkaRecord) error) (*KafkaView, error) {
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
	view := &KafkaView{Topic: k.Topic, Partition: map[string]int{}, Incomplete: map[int]bool{}}
	for _, p := range parts {
		if err := k.readPartition(ctx, p, want, applied[k.Topic], view, emit); err != nil {
			return nil, err
		}
	}
	return view, nil
}

func (k KafkaSource) readPartition(ctx context.Context, p kafka.Partition, want map[string]bool, applied map[int]int64, view *KafkaView, emit func(StreamID, KafkaRecord) error) error {
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
	if first > 0 {
		view.Incomplete[p.ID] = true
	}
	// The ledger the run reads holds the messages below ingest's
	// position; those past it are not applied yet.
	if next, ok := applied[p.ID]; ok && next < last {
		view.Unread += last - max(next, first)
		last = next
	}
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
		if m.Offset >= last { // past a gap up to the position (a compacted topic)
			return nil
		}
		if want[string(m.Key)] {
			view.Partition[string(m.Key)] = p.ID
			// A message the wire decoder refuses was refused by ingest too
			// (a dead letter, reported as such).
			if b, index, _, err := wire.Decode(m.Key, m.Value); err == nil {
				for i, rec := range b.Records {
					id := StreamID{Producer: b.Producer, Epoch: b.Epoch, Customer: rec.Customer, Meter: rec.Meter}
					if err := emit(id, KafkaRecord{Record: ledger.FromWire(&b, i), Partition: p.ID, Offset: m.Offset, Index: index[i]}); err != nil {
						return err
					}
				}
			}
		}
		if m.Offset+1 >= last {
			return nil
		}
	}
}
