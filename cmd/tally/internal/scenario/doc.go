// Package scenario generates metering load with the producer SDK, injects
// the faults a real deployment meets, and writes the ground truth: what
// the ledger must bill per customer, meter and accounting period, and the
// stream states and gaps it must end with. Verify compares a ledger with
// it. `tally produce` and `tally verify` are thin wrappers.
//
// Faults are injected between the producer and Kafka (a MessageWriter
// around kafka-go's Writer), so the producer under test is the real one:
//   - duplicates: a message is written twice;
//   - retransmits: a write succeeds but the producer is told it failed, so
//     it resends the same batch (same batch and operation ids);
//   - lost: a message is acknowledged to the producer but never written;
//     only middle batches are lost (one whose streams get later records),
//     so their usage is still inside later totals and shows as a gap;
//   - reorder: a message is held back and written after later ones (late
//     fills);
//   - crashes: a producer stops abruptly; alternately its state directory
//     survives (the restart continues the epoch and sends what was
//     buffered) or is wiped after a flush (a new epoch; the old streams are
//     left without a final record);
//   - bad records: raw messages that ingest must dead-letter (malformed
//     JSON, a record with too many decimals, a record of another customer),
//     next to valid records that must be billed.
//
// The ground truth is computed from what was actually delivered, with the
// ledger's rules (docs/design.md §3): a delivered record's usage is billed in the
// period of its occurred_at (late fills are re-attributed there); an
// undelivered record's usage is billed, inside the next delivered total,
// in that record's period. It is cross-checked against the generator's
// own sum of acknowledged usage: Run fails if the producer lost or
// invented any.
//
// Gauge and unique meters (Config.Gauges, Config.Uniques; docs/design.md
// §16) are recorded through RecordLevel and RecordMember. Their truth is
// the readings that reached Kafka: a gauge's max, latest and unit_seconds
// per period by the ledger's definition (ledger.RecomputeGauge), a unique
// meter's distinct members per period. A lost reading is not refilled by
// later ones as a counter's usage is; duplicates, retransmits and
// reordering change nothing; a wiped crash's new epoch ends the old
// epoch's levels at its first reading of each. The readings the producers
// acknowledged are cross-checked with those they sent. See kinds.go.
package scenario
