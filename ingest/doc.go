// Package ingest consumes meter.batch.v1 messages from Kafka and applies them
// to the ledger exactly once in effect (docs/design.md §2, §3, §9).
//
// Members share the topic's partitions through leases in Postgres (see
// lease.go), never through a Kafka group coordinator; a member reads each
// partition it leases with a partition reader from the next offset stored in
// Postgres, never from offsets committed to Kafka.
//
// Invariants:
//   - One Postgres transaction per micro-batch holds everything the batch
//     changes: the ledger rows (ledger.Apply), dead letters, offset jumps,
//     the partition's conservation counters and its next offset. A crash at
//     any instant leaves either all of it or none of it.
//   - Every write of a partition (a micro-batch, an idle position, a
//     retrying note) checks, in the same statement, that this member's
//     lease is live and its claim's fencing epoch is the partition's, and
//     share-locks the partition's owners row until the transaction ends: a
//     member whose partition was claimed commits nothing, and a claim waits
//     for the previous holder's transaction. The next offset is written with
//     a compare-and-set on the value this member last read or wrote, so
//     stored offsets never move backwards.
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
//     exponential backoff while the member holds the partition, and after
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
//   - A member's failure pauses only its own partitions: its lease in
//     Postgres (Config.SessionTimeout long, renewed every
//     HeartbeatInterval; the name is kept from the Kafka consumer group
//     setting it replaced, so --session-timeout still means it) runs out, or
//     sooner its Postgres session ends (a process that dies), and the
//     others claim them, each up to its fair share of the live members; a
//     clean shutdown finishes or rolls back its transactions and releases
//     its partitions at once. A transaction idle for a session timeout is
//     ended by Postgres, and a claim that waited a session timeout for a
//     stalled holder's transaction ends its session, so a stalled member
//     never keeps a partition locked from the next owner.
package ingest
