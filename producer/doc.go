// Package producer is the Go SDK for meter producers (docs/design.md §2, §9): it turns
// "customer C used Q of meter M at T" into meter.batch.v1 messages on Kafka
// that the ledger can bill exactly once, whatever happens to the process, the
// disk cache or the network in between.
//
// It owns what producers get wrong by hand: per-stream seq and running
// absolute total, UUIDv7 operation and batch ids, batching per customer (the
// message key), retries that resend the same bytes, and a bounded disk buffer.
//
// # Guarantees
//
//   - Record returns nil only once the usage, with its seq and total, is
//     fsynced to Dir. From then on it is billed exactly once, whatever
//     crashes follow (of the process, the host, or Kafka), as long as Dir
//     survives.
//   - Record returning an error means the usage was not recorded and will
//     never be billed. A Record call that is still in flight when the
//     process dies may or may not have been made durable: its usage is billed
//     once or not at all. So, after a crash, billed = acknowledged + at most
//     the Record calls that were in flight at that instant.
//   - With Key(k), a Record call is idempotent by k within the state in Dir
//     (across Stop, crashes and new epochs, for Config.KeyRetention): k is
//     stored in the disk commit of its record, so it is known exactly when
//     that usage is durable, and a repeated k records nothing and returns
//     nil (or *KeyReusedError for other usage). A caller retrying, after a
//     crash, every call it did not see return nil, with the same keys, is
//     billed exactly once per key.
//   - A batch is formed once, written to disk with its batch id and encoded
//     bytes, and only then sent; a retry (after an error, a timeout or a
//     restart) resends exactly those bytes, so the ledger sees duplicates,
//     never new usage. A batch is deleted from disk only after Kafka
//     acknowledged it with acks=all.
//   - Nothing is dropped silently: when MaxBuffered records wait for Kafka,
//     Record blocks (BlockWhenFull) or returns ErrBufferFull. A batch Kafka
//     keeps refusing is retried with capped backoff for as long as it takes,
//     logged and counted (tally_producer_send_errors_total), never skipped.
//   - Any backlog drains against a broker that accepts one record: a write
//     carries at most MaxPartitionBytes for one partition, and a "[10]
//     Message Size Too Large" refusal halves the bytes per write, or splits
//     a batch refused on its own into two batches of the same records
//     (tally_producer_size_refusals_total, tally_producer_batch_splits_total).
//   - A disk commit that fails fails its Record calls; stream states are
//     then read back from the file, so no seq is given to two operations.
//     If the file holds the records all the same, the error says the usage
//     may be billed (like a Record in flight at a crash).
//
// # Kafka
//
// Each message carries one customer's records (the key is the customer id,
// partitioned with murmur2 like the Java client, so a customer's messages
// stay in one partition and in order). Batches are formed per customer and
// epoch when MaxBatchRecords records wait, when the oldest waited Linger, or
// on Flush, and are sent in the order they were formed, with acks=all. If
// Kafka acknowledges only some messages of a write, the others are resent
// after later ones; the ledger applies such a record as a late fill, and
// bills it once.
//
// # Epochs
//
// A stream is (producer, epoch, customer, meter). The epoch is stored in Dir
// and kept across restarts, so a restarted producer continues its streams.
// A new epoch starts when Dir is new, lost or unreadable (the old one is
// renamed aside, never deleted), and after Close ended (or began to end)
// the previous one, or when a stream state in Dir is damaged. Unreadable
// means damaged: bbolt's meta checks fail, a page panics when read, or the
// file is shorter than the pages its meta page says are in use (cut short).
// bbolt checksums only its meta pages, so every value the producer stores
// carries a CRC-32C of its own (over its key and its value), checked
// wherever it is read. A single value
// that fails its checksum or does not decode (a pending record, a stored
// batch, a stream state) is set aside alone in the file's damaged bucket,
// logged at error level and counted in
// tally_producer_damaged_records_total; the other records are sent, and no
// value altered on disk reaches Kafka. A damaged idempotency key makes a
// Record call with that key return an error (the key's first record may
// be billed, so the key is never freed). A damaged record that was its stream's last is
// rebuilt from the stream's state (same seq and total, no quantity);
// otherwise the stream's next or final record carries its usage. A
// system error opening the file (EMFILE, EACCES, EIO…) is returned by New
// and leaves the file as it is. A
// new epoch is max(previous known epoch + 1, the current Unix time in
// milliseconds): the clock floor is what keeps a producer whose Dir was wiped
// (so that no previous epoch is known) from ever reusing an epoch, which
// would make its new records conflict with the old ones and go unbilled.
// It assumes the host clock does not jump back by more than the lifetime of
// an epoch. The epoch is persisted before any record uses it. A copy of
// Dir (a second host started from it, a backup or snapshot restored) is
// not a lost state: it continues the epoch and its streams, so it gives
// seqs already used to other usage, which the ledger keeps as conflicts,
// unbilled. Only the file lock (one process per Dir on a host) is
// enforced; a copy must not be made.
//
// Close ends the epoch cleanly: it appends to every stream of the epoch one
// record with quantity 0, the same total, seq+1 and "final": true, then
// sends everything buffered. The final records count against MaxBuffered:
// they are written as Kafka drains the buffer. A zero quantity bills nothing; the flag tells
// reconciliation the stream ended on purpose (docs/design.md §3: an epoch superseded
// without a final record is reported as abandoned). Stop leaves the epoch
// open, for a restart that continues it.
//
// # Why bbolt
//
// State lives in one go.etcd.io/bbolt file in Dir. bbolt is a small,
// well-kept B+tree store (etcd's) whose write transactions are atomic and
// durable on return (fsync of data, then of the meta page, copy-on-write, so
// a crash at any instant leaves the previous or the new state, never a mix).
// One transaction can move records from "pending" to "batches" and update
// stream state at once, which an append-only log would need compaction and
// a recovery scan to emulate. Its cost is one fsync pair per commit; Record
// calls made concurrently share a commit (group commit), so throughput grows
// with concurrent callers. bbolt's file lock also keeps two processes from
// using one Dir.
//
// The package imports only the wire format (ingest/wire) and kafka-go; it
// never depends on the ledger.
package producer
