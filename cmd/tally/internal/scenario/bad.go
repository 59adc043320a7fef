package scenario

import (
	"context"
	"fmt"
	"time"

	"github.com/google/uuid"
	"github.com/segmentio/kafka-go"
	"github.com/shopspring/decimal"

	"github.com/tally-ledger/tally/ingest/wire"
)

// sendBad writes cfg.Faults.BadMessages raw messages, keyed by the run's
// "bad" customer, each with one problem ingest must dead-letter: malformed
// JSON (the whole message), a total with ten digits after the point, or a
// record of another customer. The last two also carry a valid record (of
// the stream raw/<run>-bad/raw), which must be billed.
func sendBad(ctx context.Context, w *kafka.Writer, t *tracker, cfg Config, e *Expect) error {
	if cfg.Faults.BadMessages == 0 {
		return nil
	}
	customer := cfg.Run + "-bad"
	e.Customers = append(e.Customers, customer)
	prod := cfg.Run + "-raw"
	now := time.Now().UTC().Truncate(time.Millisecond)
	var msgs []kafka.Message
	var valid []wire.Batch
	seq, total := int64(0), decimal.Zero
	goodRecord := func() string {
		seq++
		q := decimal.New(int64(seq)*125, -2)
		total = total.Add(q)
		valid = append(valid, wire.Batch{Producer: prod, Epoch: 1, Records: []wire.Record{{
			Customer: customer, Meter: "raw", Seq: seq, Total: total, Quantity: decimal.NewNullDecimal(q), OccurredAt: now}}})
		return fmt.Sprintf(`{"operation_id":%q,"customer":%q,"meter":"raw","seq":%d,"total":"%s","quantity":"%s","occurred_at":%q}`,
			uuid.Must(uuid.NewV7()), customer, seq, total, q, now.Format(time.RFC3339Nano))
	}
	for i := range cfg.Faults.BadMessages {
		head := fmt.Sprintf(`{"schema":"meter.batch.v1","batch_id":%q,"producer":%q,"epoch":1,"sent_at":%q,"records":[`,
			uuid.Must(uuid.NewV7()), prod, now.Format(time.RFC3339Nano))
		var v string
		switch i % 3 {
		case 0:
			v = head + `{"operation_id":` // malformed JSON
		case 1:
			v = head + goodRecord() + fmt.Sprintf(`,{"operation_id":%q,"customer":%q,"meter":"raw-bad","seq":1,"total":"1.0000000001","occurred_at":%q}]}`,
				uuid.Must(uuid.NewV7()), customer, now.Format(time.RFC3339Nano))
		case 2:
			v = head + goodRecord() + fmt.Sprintf(`,{"operation_id":%q,"customer":"%s-other","meter":"raw-bad","seq":1,"total":"1","occurred_at":%q}]}`,
				uuid.Must(uuid.NewV7()), cfg.Run, now.Format(time.RFC3339Nano))
		}
		msgs = append(msgs, kafka.Message{Key: []byte(customer), Value: []byte(v)})
		e.DeadLetters[customer]++
	}
	if err := w.WriteMessages(ctx, msgs...); err != nil {
		return fmt.Errorf("scenario: write bad messages: %w", err)
	}
	t.mu.Lock()
	defer t.mu.Unlock()
	for _, b := range valid {
		t.delivered(t.observe(b))
	}
	return nil
}
