package scenario

import (
	"context"
	"fmt"
	"strings"
	"time"

	"github.com/segmentio/kafka-go"

	"github.com/tally-ledger/tally/ingest/wire"
)

// The ground truth depends on the order in which records reached Kafka
// (the record that reveals a gap decides the period that bills it), and a
// write that returned an error may have reached Kafka all the same. So the
// run reads back what it wrote: the partitions' end offsets before the run,
// then every message after them, in offset order, as ingest will.

// endOffsets returns the next offset of every partition of topic.
func endOffsets(ctx context.Context, brokers []string, topic string) (map[int]int64, error) {
	var d kafka.Dialer
	conn, err := d.DialContext(ctx, "tcp", brokers[0])
	if err != nil {
		return nil, fmt.Errorf("scenario: connect to Kafka: %w", err)
	}
	defer conn.Close()
	parts, err := conn.ReadPartitions(topic)
	if err != nil {
		return nil, fmt.Errorf("scenario: partitions of %s: %w", topic, err)
	}
	out := map[int]int64{}
	for _, p := range parts {
		lc, err := d.DialLeader(ctx, "tcp", brokers[0], topic, p.ID)
		if err != nil {
			return nil, fmt.Errorf("scenario: connect to the leader of %s/%d: %w", topic, p.ID, err)
		}
		last, err := lc.ReadLastOffset()
		lc.Close()
		if err != nil {
			return nil, fmt.Errorf("scenario: end offset of %s/%d: %w", topic, p.ID, err)
		}
		out[p.ID] = last
	}
	return out, nil
}

// readBack returns, per stream of the run, the seqs of its records in the
// order Kafka holds them (repeats included), for messages written after
// from.
func readBack(ctx context.Context, brokers []string, topic, run string, from map[int]int64) (map[sKey][]int64, error) {
	to, err := endOffsets(ctx, brokers, topic)
	if err != nil {
		return nil, err
	}
	out := map[sKey][]int64{}
	for p, end := range to {
		start := from[p]
		if end <= start {
			continue
		}
		r := kafka.NewReader(kafka.ReaderConfig{Brokers: brokers, Topic: topic, Partition: p, MaxWait: 500 * time.Millisecond})
		if err := r.SetOffset(start); err != nil {
			r.Close()
			return nil, err
		}
		rctx, cancel := context.WithTimeout(ctx, time.Minute)
		for {
			m, err := r.FetchMessage(rctx)
			if err != nil {
				cancel()
				r.Close()
				return nil, fmt.Errorf("scenario: read back %s/%d at %d: %w", topic, p, start, err)
			}
			b, _, _, derr := wire.Decode(m.Key, m.Value)
			if derr == nil && strings.HasPrefix(b.Producer, run+"-") {
				for _, rec := range b.Records {
					k := sKey{b.Producer, b.Epoch, rec.Customer, rec.Meter}
					out[k] = append(out[k], rec.Seq)
				}
			}
			if m.Offset+1 >= end {
				break
			}
		}
		cancel()
		r.Close()
	}
	return out, nil
}
