package ledger

import (
	"time"

	"github.com/tally-ledger/tally/ingest/wire"
)

// FromWire is record i of a meter.batch.v1 message as the ledger applies
// it: its stream is the batch's producer and epoch with the record's
// customer and meter, its time is in UTC whole microseconds (as Postgres
// keeps it), and a gauge's level or a unique meter's member is carried in
// place of a total (checked against the meter's kind, docs/design.md §16).
// Ingest, the replay of dead letters and reconciliation's deep check all
// read a message's records through it.
func FromWire(b *wire.Batch, i int) Record {
	r := &b.Records[i]
	lr := Record{
		OperationID: r.OperationID,
		Stream:      StreamKey{Producer: b.Producer, Epoch: b.Epoch, Customer: r.Customer, Meter: r.Meter},
		Seq:         r.Seq,
		Total:       r.Total,
		Quantity:    r.Quantity,
		OccurredAt:  r.OccurredAt.UTC().Truncate(time.Microsecond),
		Final:       r.Final,
	}
	switch {
	case r.Level.Valid:
		lr.Shape, lr.Level = Gauge, r.Level.Decimal
	case r.Member != "":
		lr.Shape, lr.Member = Unique, r.Member
	}
	return lr
}
