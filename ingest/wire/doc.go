// Package wire owns the meter.batch.v1 message format (docs/design.md §2): the Batch
// and Record types, Encode for producers and Decode for ingest.
//
// Decode walks the message with a minimal scanner of its own (scan.go) over
// JSON that valid (valid.go: what encoding/json.Valid accepts, four times
// as fast) has accepted, not with encoding/json: encoding/json
// cannot report repeated keys, replaces bad UTF-8 without a word, and its
// Token API allocates per token; walking valid JSON is simple and keeps
// every value's exact bytes and offset (a rejected record is dead-lettered
// with exactly the bytes it was sent as).
//
// The decoder by concern: decode.go (the message and its top-level
// fields), record.go (a record's fields, in the order they are checked),
// values.go (strings, UUIDs, integers, JSON types), decimal.go, time.go
// (strict RFC 3339), scan.go.
//
// Invariants:
//   - Decode accepts a record only if it satisfies every rule of docs/design.md §2; it
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
