// Package wire owns the meter.batch.v1 message format (SPEC §2): the Batch
// and Record types, Encode for producers and Decode for ingest.
//
// Invariants:
//   - Decode accepts a record only if it satisfies every rule of SPEC §2; it
//     never rounds, trims or repairs a value. Decimals go through package
//     amount and never through float64.
//   - Nothing is lost: a message is either rejected whole (one *Error), or
//     every one of its records is either in Batch.Records or in the
//     []RecordError, with the record's exact bytes for the dead-letter table.
//   - Every rejection carries a stable Reason; the human Detail may change.
//   - Decode(customer, Encode(b)) returns b for any b that Encode accepts.
//
// The package imports no Kafka client or database driver: producers import
// it to build messages.
package wire
