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

// qAdvanceOffset is the fence of a micro-batch: it runs first in the
// transaction and matches no row unless this member holds the partition's
// lease (qLeaseHeld, whose share lock keeps a claim waiting until the
// transaction ends) and the stored next offset is the one this member read
// or wrote last (a compare-and-set: offsets never move backwards). The row
// lock it takes serialises any competing writer before the ledger work.
const qAdvanceOffset = `
WITH lease AS (` + qLeaseHeld + `)
UPDATE ingest_partitions
SET next_offset     = @to,
    high_watermark  = @hwm,
    applied_through = GREATEST(applied_through, @through),
    owner           = @member,
    generation      = @epoch,
    retrying_since  = NULL,
    last_error      = NULL,
    updated_at      = now()
WHERE topic = @topic AND partition = @partition AND next_offset = @from AND EXISTS (SELECT 1 FROM lease)`

// qStoredOffsets is every partition's stored next offset (OffsetWatch).
const qStoredOffsets = `SELECT topic, partition, next_offset FROM ingest_partitions`

// qNoteRetrying records, outside the failing transaction, that the
// partition's micro-batch at next offset @from keeps failing; the next
// commit clears it. retrying_since is Postgres's clock less how long the
// run of failures has lasted (@retrying_us), the clock qSelectStatus judges
// it by. Only the lease holder writes it.
const qNoteRetrying = `
WITH lease AS (` + qLeaseHeld + `)
UPDATE ingest_partitions
SET retrying_since = coalesce(retrying_since, now() - @retrying_us::bigint * interval '1 microsecond'),
    last_error     = @error
WHERE topic = @topic AND partition = @partition AND next_offset = @from AND EXISTS (SELECT 1 FROM lease)`

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

// qTouchPosition records that an idle partition is caught up; only the
// lease holder writes it.
const qTouchPosition = `
WITH lease AS (` + qLeaseHeld + `)
UPDATE ingest_partitions
SET high_watermark  = @hwm,
    applied_through = GREATEST(applied_through, @through),
    updated_at      = now()
WHERE topic = @topic AND partition = @partition AND next_offset = @from AND EXISTS (SELECT 1 FROM lease)`

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
// on; it writes only for a customer seen for the first time (or moved:
// after the topic was repartitioned, or sent by a producer whose
// partitioner is not murmur2). It returns the customers that moved (a row
// updated, not inserted, has a non-zero xmax).
const qNoteCustomers = `
INSERT INTO ingest_customers (customer, topic, partition, first_seen)
SELECT c, $1, $2, $4 FROM unnest($3::text[]) AS c
ON CONFLICT (customer, topic) DO UPDATE SET partition = EXCLUDED.partition
WHERE ingest_customers.partition <> EXCLUDED.partition
RETURNING customer, xmax <> 0`

// Partition leases (see lease.go). Liveness is a member's row in
// ingest_members; the partition's row in ingest_partition_owners names the
// member holding it and the claim's fencing epoch (column generation).

// qLeaseHeld is the fence every write of a partition runs inside its
// transaction: it matches the partition's owners row only while
// (@member, @epoch) holds it and the member's lease is live, and share-locks
// the row, so a claim by another member waits until the transaction ends.
const qLeaseHeld = `
SELECT 1 FROM ingest_partition_owners o
JOIN ingest_members m ON m.topic = o.topic AND m.consumer_group = o.consumer_group AND m.member = o.member
WHERE o.topic = @topic AND o.partition = @partition AND o.consumer_group = @group
  AND o.member = @member AND o.generation = @epoch AND m.lease_until > now()
FOR SHARE OF o`

// memberLive is whether member row m is live: its lease has not run out
// and the session it registered from still exists. A member's process that
// died closed that session (the kernel closes its sockets), so it stops
// being live at once; one stopped or cut off keeps its session until its
// lease runs out. A member of an older build (no session) has its lease
// alone; a pid reused by another backend keeps a dead member live only
// until its lease runs out.
const memberLive = `(m.lease_until > now() AND (m.session_pid IS NULL OR EXISTS (
        SELECT 1 FROM pg_stat_activity s WHERE s.pid = m.session_pid)))`

// qRegisterMember starts a member's lease, recording the session it runs
// on (the member's own connection, held for its life).
const qRegisterMember = `
INSERT INTO ingest_members (topic, consumer_group, member, process, lease_until, session_pid)
VALUES (@topic, @group, @member, @process, now() + @lease::interval, pg_backend_pid())`

// qRenewMember extends a member's lease if it has not run out, through the
// member's session, whose pid it records again (behind a pooler that hands
// each transaction another server connection, the pid is of a backend that
// outlives the member: it is then judged by its lease, as before sessions
// counted); no row means it ran out (the member was evicted: its
// partitions may be claimed).
const qRenewMember = `
UPDATE ingest_members SET lease_until = now() + @lease::interval, session_pid = pg_backend_pid()
WHERE topic = @topic AND consumer_group = @group AND member = @member AND lease_until > now()
RETURNING member`

// qLeaveMember ends a member's lease on a clean shutdown, and forgets
// members whose lease ran out long ago.
const qLeaveMember = `
DELETE FROM ingest_members
WHERE topic = @topic AND consumer_group = @group
  AND (member = @member OR lease_until < now() - interval '1 day')`

// qEnsureOwners creates the owners row of every partition of the topic
// (unowned) on first sight.
const qEnsureOwners = `
INSERT INTO ingest_partition_owners (topic, partition, consumer_group, member, generation, process, since, lease_until)
SELECT @topic, p, @group, NULL, 0, '', now(), now() FROM generate_series(0, @partitions::int - 1) AS p
ON CONFLICT (topic, partition, consumer_group) DO NOTHING`

// qSelectAssignment is the topic's partitions with their holder, epoch and
// whether the holder is live.
const qSelectAssignment = `
SELECT o.partition, coalesce(o.member, ''), o.generation,
       o.member IS NOT NULL AND coalesce(` + memberLive + `, false) AS live,
       coalesce((extract(epoch FROM m.lease_until - now()) * 1000)::bigint, 0) AS lease_left_ms
FROM ingest_partition_owners o
LEFT JOIN ingest_members m ON m.topic = o.topic AND m.consumer_group = o.consumer_group AND m.member = o.member
WHERE o.topic = @topic AND o.consumer_group = @group
ORDER BY o.partition`

// qSelectLiveMembers lists the topic's live members of the group, by id.
const qSelectLiveMembers = `
SELECT m.member FROM ingest_members m
WHERE m.topic = @topic AND m.consumer_group = @group AND ` + memberLive + `
ORDER BY m.member`

// qClaimPartition takes a partition released or held by a member that is
// not live, bumping its fencing epoch; it returns the new epoch (no row: a
// live member holds it). It waits for a transaction of the previous holder
// that still share-locks the row (see qLeaseHeld).
const qClaimPartition = `
UPDATE ingest_partition_owners AS o
SET member = @member, generation = o.generation + 1, process = @process, since = now(), lease_until = now()
WHERE o.topic = @topic AND o.partition = @partition AND o.consumer_group = @group
  AND (o.member IS NULL OR NOT EXISTS (
        SELECT 1 FROM ingest_members m
        WHERE m.topic = o.topic AND m.consumer_group = o.consumer_group AND m.member = o.member AND ` + memberLive + `))
RETURNING o.generation`

// qReleasePartition gives a partition up (surplus, or a clean shutdown).
const qReleasePartition = `
UPDATE ingest_partition_owners
SET member = NULL, since = now(), lease_until = now()
WHERE topic = @topic AND partition = @partition AND consumer_group = @group AND member = @member AND generation = @epoch`

// qHoldsLease reports whether (member, epoch) still holds the partition
// with a live lease.
const qHoldsLease = `SELECT EXISTS (` + qLeaseHeldNoLock + `)`

const qLeaseHeldNoLock = `
SELECT 1 FROM ingest_partition_owners o
JOIN ingest_members m ON m.topic = o.topic AND m.consumer_group = o.consumer_group AND m.member = o.member
WHERE o.topic = @topic AND o.partition = @partition AND o.consumer_group = @group
  AND o.member = @member AND o.generation = @epoch AND m.lease_until > now()`

// qSelectOwners is the lease of every partition of a topic (or all topics):
// a live one if any group holds one (one group is the normal case), else the
// one that ended last (released, or its member's lease ran out).
const qSelectOwners = `
SELECT DISTINCT ON (o.topic, o.partition)
       o.topic, o.partition, o.member, o.process, o.since,
       CASE WHEN o.member IS NULL THEN o.lease_until ELSE coalesce(m.lease_until, o.lease_until) END AS until,
       o.member IS NOT NULL AND coalesce(m.lease_until > now(), false) AS live
FROM ingest_partition_owners o
LEFT JOIN ingest_members m ON m.topic = o.topic AND m.consumer_group = o.consumer_group AND m.member = o.member
WHERE $1 = '' OR o.topic = $1
ORDER BY o.topic, o.partition, live DESC, until DESC`

// qSelectUnowned lists the partitions of a topic that have had no live owner
// for at least $2.
const qSelectUnowned = `
SELECT p.partition, o.until
FROM ingest_partitions p
LEFT JOIN LATERAL (SELECT max(CASE WHEN ow.member IS NULL THEN ow.lease_until
                                   ELSE coalesce(m.lease_until, ow.lease_until) END) AS until,
                          bool_or(ow.member IS NOT NULL AND coalesce(m.lease_until > now(), false)) AS live
                   FROM ingest_partition_owners ow
                   LEFT JOIN ingest_members m ON m.topic = ow.topic AND m.consumer_group = ow.consumer_group AND m.member = ow.member
                   WHERE ow.topic = p.topic AND ow.partition = p.partition) o ON true
WHERE p.topic = $1
  AND NOT coalesce(o.live, false)
  AND coalesce(o.until, p.updated_at) <= now() - $2::interval
ORDER BY p.partition`

// qBegin and qCommit open and end a micro-batch's transaction, each in the
// pipeline of other statements (see openTx). READ COMMITTED is what
// ledger.Apply needs.
const (
	qBegin  = `BEGIN ISOLATION LEVEL READ COMMITTED`
	qCommit = `COMMIT`
)

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
// A page of dead letters after id $1, of every key or of key $3, and of
// all or only the pending: a statement for each filter, not one with
// "$3 = ” OR key = …", so that each is planned for its index also as the
// generic plan Postgres settles on for a prepared statement (one plan for
// any filter scanned the primary key from the cursor and read every other
// customer's dead letter on the way).
const (
	qDeadLettersFrom = `SELECT ` + qDeadLetterColumns + ` FROM dead_letters WHERE `
	qDeadLettersPage = `id > $1 ORDER BY id LIMIT $2`

	qSelectDeadLetters             = qDeadLettersFrom + qDeadLettersPage
	qSelectDeadLettersPending      = qDeadLettersFrom + `replayed_at IS NULL AND ` + qDeadLettersPage
	qSelectDeadLettersOfKey        = qDeadLettersFrom + `key = convert_to($3, 'UTF8') AND ` + qDeadLettersPage
	qSelectDeadLettersOfKeyPending = qDeadLettersFrom + `key = convert_to($3, 'UTF8') AND replayed_at IS NULL AND ` + qDeadLettersPage
)

const qSelectDeadLetter = `SELECT ` + qDeadLetterColumns + ` FROM dead_letters WHERE id = $1`

// qLockDeadLetter serialises replays of one dead letter.
const qLockDeadLetter = qSelectDeadLetter + ` FOR UPDATE`

const qMarkReplayed = `UPDATE dead_letters SET replayed_at = $2, replay_outcome = $3 WHERE id = $1`

// qMarkReplayAttempt notes why a replay was refused again; the dead letter
// stays pending.
const qMarkReplayAttempt = `UPDATE dead_letters SET replay_outcome = $2 WHERE id = $1`
