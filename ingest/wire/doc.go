// Package wire owns the meter.batch.v1 message format (docs/design.md §2): the Batch
// and Record types, Encode for producers and Decode for ingest.
//
// Decode reads the message in one pass with a minimal scanner of its own
// (valid.go, scan.go), not with encoding/json: encoding/json cannot report
// repeated keys, replaces bad UTF-8 without a word, and its Token API
// allocates per token. The pass checks the syntax of every byte exactly as
// encoding/json.Valid does while it finds the values and decodes the
// records, and keeps every value's exact bytes and offset (a rejected
// record is dead-lettered with exactly the bytes it was sent as). What it
// finds is reported in the documented order, not in the order met: a
// syntax error anywhere rejects the message as bad_json, whatever was
// found before it. FuzzDecodeReference checks it against the decoder it
// replaced (validate, count, then walk), kept in a test file.
//
// The decoder by concern: decode.go (the message and its top-level
// fields), record.go (a record's fields, in the order they are checked),
// values.go (strings, UUIDs, integers, JSON types), decimal.go, time.go
// (strict RFC 3339), valid.go (the syntax), scan.go.
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
