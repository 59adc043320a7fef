package ingest

// The package's SQL, in one place. Every statement is a constant; values are
// always bind parameters.

// qEnsurePartition creates a partition's row on first sight. Its next offset
// starts at 0 so that a topic whose oldest messages were already deleted by
// retention shows up as an offset jump instead of a silent start.
const qEnsurePartition = `
INSERT INTO ingest_partitions (topic, partition, next_offset)
VALUES ($1, $2, 0)
ON CONFLICT (topic, partition) DO NOTHING`

const qSelectNextOffset = `
SELECT next_offset FROM ingest_partitions WHERE topic = $1 AND partition = $2`

// qAdvanceOffset is the compare-and-set that fences a member that lost the
// partition: it matches no row unless the stored next offset is the one this
// member read or wrote last. It runs first in the micro-batch transaction so
// the row lock serialises any competing member before the ledger work.
const qAdvanceOffset = `
UPDATE ingest_partitions
SET next_offset     = @to,
    high_watermark  = @hwm,
    applied_through = GREATEST(applied_through, @through),
    owner           = @member,
    generation      = @generation,
    retrying_since  = NULL,
    last_error      = NULL,
    updated_at      = now()
WHERE topic = @topic AND partition = @partition AND next_offset = @from`

// qNoteRetrying records, outside the failing transaction, that the
// partition's micro-batch at next offset $3 keeps failing; the next commit
// clears it.
const qNoteRetrying = `
UPDATE ingest_partitions
SET retrying_since = coalesce(retrying_since, $4),
    last_error     = $5
WHERE topic = $1 AND partition = $2 AND next_offset = $3`

// qAddCounters adds a micro-batch's conservation counters.
const qAddCounters = `
UPDATE ingest_partitions
SET messages_in       = messages_in + @messages,
    messages_rejected = messages_rejected + @messages_rejected,
    records_in        = records_in + @records,
    records_applied   = records_applied + @applied,
    records_duplicate = records_duplicate + @duplicate,
    records_conflict  = records_conflict + @conflict,
    records_late_fill = records_late_fill + @late_fill,
    records_rejected  = records_rejected + @rejected
WHERE topic = @topic AND partition = @partition`

// qInsertDeadLetters writes a micro-batch's dead letters in one statement,
// its rows as columns (deadLetterArgs).
const qInsertDeadLetters = `
INSERT INTO dead_letters (id, topic, partition, "offset", record_index, reason, field, detail, key, raw,
                          producer, epoch, created_at)
SELECT id, @topic, @partition, off, idx, reason, field, detail, key, raw, producer, epoch, @created_at
FROM unnest(@ids::uuid[], @offsets::bigint[], @indexes::int[], @reasons::text[], @fields::text[], @details::text[],
            @keys::bytea[], @raws::bytea[], @producers::text[], @epochs::bigint[])
     AS d(id, off, idx, reason, field, detail, key, raw, producer, epoch)`

const qInsertJump = `
INSERT INTO ingest_offset_jumps (id, topic, partition, from_offset, to_offset, detected_at, detail)
VALUES (@id, @topic, @partition, @from, @to, @detected_at, @detail)`

// qTouchPosition records that an idle partition is caught up.
const qTouchPosition = `
UPDATE ingest_partitions
SET high_watermark  = $4,
    applied_through = GREATEST(applied_through, $5),
    updated_at      = now()
WHERE topic = $1 AND partition = $2 AND next_offset = $3`

const qSelectStatus = `
SELECT topic, partition, next_offset, high_watermark, applied_through,
       messages_in, messages_rejected, records_in, records_applied, records_duplicate,
       records_conflict, records_late_fill, records_rejected, owner, generation, updated_at,
       CASE WHEN retrying_since IS NULL THEN 'consuming'
            WHEN retrying_since <= now() - $2::bigint * interval '1 millisecond' THEN 'stalled'
            ELSE 'retrying' END,
       retrying_since, coalesce(last_error, '')
FROM ingest_partitions
WHERE $1 = '' OR topic = $1
ORDER BY topic, partition`

// qNoteCustomers records which partition the micro-batch's customers arrive
// on; it writes only for a customer seen for the first time (or moved,
// after the topic was repartitioned).
const qNoteCustomers = `
INSERT INTO ingest_customers (customer, topic, partition, first_seen)
SELECT c, $1, $2, $4 FROM unnest($3::text[]) AS c
ON CONFLICT (customer, topic) DO UPDATE SET partition = EXCLUDED.partition
WHERE ingest_customers.partition <> EXCLUDED.partition`

// Partition leases (see lease.go).

// qClaimPartition takes a partition for (member, generation). It overwrites a
// claim of an older generation, a released one or one whose lease ran out;
// since is kept while the same member keeps the partition.
const qClaimPartition = `
INSERT INTO ingest_partition_owners AS o (topic, partition, consumer_group, member, generation, process, since, lease_until)
VALUES (@topic, @partition, @group, @member, @generation, @process, now(), now() + @lease::interval)
ON CONFLICT (topic, partition, consumer_group) DO UPDATE
SET member      = EXCLUDED.member,
    generation  = EXCLUDED.generation,
    process     = EXCLUDED.process,
    since       = CASE WHEN o.member = EXCLUDED.member THEN o.since ELSE now() END,
    lease_until = EXCLUDED.lease_until
WHERE o.member IS NULL OR o.member = EXCLUDED.member OR o.generation < EXCLUDED.generation OR o.lease_until < now()`

// qRenewLeases extends every claim of (member, generation) and returns the
// partitions it still holds.
const qRenewLeases = `
UPDATE ingest_partition_owners
SET lease_until = now() + $4::interval
WHERE topic = $1 AND consumer_group = $5 AND member = $2 AND generation = $3
RETURNING partition`

// qReleasePartition gives a partition up on a clean shutdown.
const qReleasePartition = `
UPDATE ingest_partition_owners
SET member = NULL, since = now(), lease_until = now()
WHERE topic = $1 AND partition = $2 AND consumer_group = $5 AND member = $3 AND generation = $4`

// qHoldsLease reports whether (member, generation) still holds the partition.
const qHoldsLease = `
SELECT EXISTS (SELECT 1 FROM ingest_partition_owners
               WHERE topic = $1 AND partition = $2 AND consumer_group = $5 AND member = $3 AND generation = $4)`

// qSelectOwners is the lease of every partition of a topic (or all topics):
// a live one if any group holds one (one group is the normal case), else the
// one that ran out last.
const qSelectOwners = `
SELECT DISTINCT ON (topic, partition)
       topic, partition, member, process, since, lease_until, lease_until > now() AND member IS NOT NULL AS live
FROM ingest_partition_owners
WHERE $1 = '' OR topic = $1
ORDER BY topic, partition, live DESC, lease_until DESC`

// qSelectUnowned lists the partitions of a topic that have had no live owner
// for at least $2.
const qSelectUnowned = `
SELECT p.partition, o.until
FROM ingest_partitions p
LEFT JOIN LATERAL (SELECT max(lease_until) AS until,
                          bool_or(member IS NOT NULL AND lease_until > now()) AS live
                   FROM ingest_partition_owners
                   WHERE topic = p.topic AND partition = p.partition) o ON true
WHERE p.topic = $1
  AND NOT coalesce(o.live, false)
  AND coalesce(o.until, p.updated_at) <= now() - $2::interval
ORDER BY p.partition`

// qSetIdleTimeout bounds how long the micro-batch transaction may sit idle
// (milliseconds, this transaction only).
const qSetIdleTimeout = `SELECT set_config('idle_in_transaction_session_timeout', $1, true)`

// qEndBlockers ends the sessions blocking backend $1.
const qEndBlockers = `
SELECT count(*) FILTER (WHERE pg_terminate_backend(b)) FROM unnest(pg_blocking_pids($1)) AS b`

// Dead letters: listed, shown, and marked by replay (see deadletters.go).

const qDeadLetterColumns = `id, topic, partition, "offset", record_index, reason, coalesce(field, ''), detail,
       key, raw, producer, epoch, created_at, replayed_at, replay_outcome`

// qSelectDeadLetters is a page of dead letters by id: $1 a message key (”:
// all), $2 only those pending, $3 the cursor, $4 the limit.
const qSelectDeadLetters = `SELECT ` + qDeadLetterColumns + ` FROM dead_letters
WHERE ($1 = '' OR key = convert_to($1, 'UTF8')) AND (NOT $2 OR replayed_at IS NULL) AND id > $3
ORDER BY id LIMIT $4`

const qSelectDeadLetter = `SELECT ` + qDeadLetterColumns + ` FROM dead_letters WHERE id = $1`

// qLockDeadLetter serialises replays of one dead letter.
const qLockDeadLetter = qSelectDeadLetter + ` FOR UPDATE`

const qMarkReplayed = `UPDATE dead_letters SET replayed_at = $2, replay_outcome = $3 WHERE id = $1`

// qMarkReplayAttempt notes why a replay was refused again; the dead letter
// stays pending.
const qMarkReplayAttempt = `UPDATE dead_letters SET replay_outcome = $2 WHERE id = $1`
