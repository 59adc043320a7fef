// Package ingest consumes meter.batch.v1 messages from Kafka and applies them
// to the ledger exactly once in effect (docs/design.md §2, §3, §9).
//
// The consumer joins a Kafka consumer group only to learn which partitions it
// owns; it reads each owned partition with a partition reader from the next
// offset stored in Postgres, never from offsets committed to Kafka.
//
// Invariants:
//   - One Postgres transaction per micro-batch holds everything the batch
//     changes: the ledger rows (ledger.Apply), dead letters, offset jumps,
//     the partition's conservation counters and its next offset. A crash at
//     any instant leaves either all of it or none of it.
//   - The next offset is written with a compare-and-set on the value this
//     consumer last read or wrote; a member that lost the partition cannot
//     commit (its transaction is rolled back). Stored offsets never move
//     backwards.
//   - Conservation: per partition, records_in = applied + duplicate +
//     conflict + late_fill + rejected, at every commit (a CHECK constraint).
//     A message rejected whole counts in messages_rejected, not in records.
//   - Nothing is dropped silently: every refused message or record is a dead
//     letter with its raw bytes, partition, offset and reason; every offset
//     that Kafka no longer had (retention, a recreated topic) is an offset
//     jump row, an ERROR log line and a metric.
//   - A Postgres error that retrying can cure (connection loss, timeouts,
//     serialization failures, deadlocks, shutdown, resources, the schema)
//     never advances the offset: the same micro-batch is retried with capped
//     exponential backoff while the member stays in its group, and after
//     StallAfter the partition is reported stalled. Offsets committed to
//     Kafka are for lag dashboards only.
//   - No message halts a partition: any bytes are bad input (a dead letter
//     with them exactly, null kept apart from empty), and a micro-batch the
//     database refuses again on retry is bisected until the message refused
//     alone is found; it becomes a store_refused dead letter (only if a
//     harmless canary record is accepted: a database refusing everything is
//     retried instead) and the others commit in order, exactly once.
//   - Offsets that held nothing (compaction, transaction markers) are
//     counted as skipped; only offsets below the partition's first offset
//     (retention) are offset jumps.
//   - Each member leases the partitions the group assigns it in Postgres
//     (ingest_partition_owners: claimed at assignment, renewed every
//     heartbeat for a session timeout, released on shutdown), so an owner
//     that died is visible. A member that loses a partition (its generation
//     ends, or its lease renewal misses it) stops reading it and rolls its
//     in-flight transaction back at once; a transaction idle for a session
//     timeout is ended by Postgres, so a stalled member never keeps the
//     partition's row locked from the next owner.
package ingest
