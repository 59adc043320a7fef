package ingest

import (
	"log/slog"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"
	"github.com/segmentio/kafka-go"
)

// The partition reader may skip deleted offsets on its own (kafka-go does,
// silently); add turns every gap into a recorded jump and never counts a
// message twice.
func TestAddDetectsOffsetJumps(t *testing.T) {
	m, err := newMetrics(prometheus.NewRegistry(), "t")
	if err != nil {
		t.Fatal(err)
	}
	p := &partition{c: &Consumer{m: m}, log: slog.New(slog.DiscardHandler)}
	b := &microBatch{from: 10, to: 10}
	now := time.Date(2026, 12, 2, 10, 0, 0, 0, time.UTC)
	for i, off := range []int64{10, 11, 15, 16, 12} {
		p.add(b, kafka.Message{Offset: off, HighWaterMark: 20, Key: []byte("acme"), Value: []byte("not json"),
			Time: now.Add(time.Duration(i) * time.Second)})
	}
	if len(b.jumps) != 1 || b.jumps[0].from != 12 || b.jumps[0].to != 15 {
		t.Fatalf("jumps %+v, want one from 12 to 15", b.jumps)
	}
	if b.to != 17 || b.hwm != 20 || len(b.msgs) != 4 {
		t.Errorf("to %d, hwm %d, %d messages; want 17, 20, 4 (offset 12 after 16 ignored)", b.to, b.hwm, len(b.msgs))
	}
	if !b.through.Equal(now.Add(3 * time.Second)) {
		t.Errorf("through %v, want the newest accepted message's time", b.through)
	}
	var d dto.Metric
	if err := m.anomalies.WithLabelValues("offset_backwards").Write(&d); err != nil {
		t.Fatal(err)
	}
	if got := d.GetCounter().GetValue(); got != 1 {
		t.Errorf("offset_backwards anomalies = %v, want 1", got)
	}
	for _, msg := range b.msgs {
		if msg.err == nil || msg.err.Reason != "bad_json" {
			t.Errorf("offset %d: decode error %v, want bad_json", msg.offset, msg.err)
		}
	}
}
