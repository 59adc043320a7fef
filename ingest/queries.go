package ingest

// The package's SQL, in one place. Every statement is a constant; values are
// always bind parameters.

// ensurePartition creates a partition's row on first sight. Its next offset
// starts at 0 so that a topic whose oldest messages were already deleted by
// retention shows up as an offset jump instead of a silent start.
const ensurePartition = `
INSERT INTO ingest_partitions (topic, partition, next_offset)
VALUES ($1, $2, 0)
ON CONFLICT (topic, partition) DO NOTHING`

const selectNextOffset = `
SELECT next_offset FROM ingest_partitions WHERE topic = $1 AND partition = $2`

// advanceOffset is the compare-and-set that fences a member that lost the
// partition: it matches no row unless the stored next offset is the one this
// member read or wrote last. It runs first in the micro-batch transaction so
// the row lock serialises any competing member before the ledger work.
const advanceOffset = `
UPDATE ingest_partitions
SET next_offset     = $4,
    high_watermark  = $5,
    applied_through = GREATEST(applied_through, $6),
    owner           = $7,
    generation      = $8,
    retrying_since  = NULL,
    last_error      = NULL,
    updated_at      = now()
WHERE topic = $1 AND partition = $2 AND next_offset = $3`

// noteRetrying records, outside the failing transaction, that the
// partition's micro-batch at next offset $3 keeps failing; the next commit
// clears it.
const noteRetrying = `
UPDATE ingest_partitions
SET retrying_since = coalesce(retrying_since, $4),
    last_error     = $5
WHERE topic = $1 AND partition = $2 AND next_offset = $3`

// addCounters adds a micro-batch's conservation counters.
const addCounters = `
UPDATE ingest_partitions
SET messages_in       = messages_in + $3,
    messages_rejected = messages_rejected + $4,
    records_in        = records_in + $5,
    records_applied   = records_applied + $6,
    records_duplicate = records_duplicate + $7,
    records_conflict  = records_conflict + $8,
    records_late_fill = records_late_fill + $9,
    records_rejected  = records_rejected + $10
WHERE topic = $1 AND partition = $2`

// insertDeadLetters writes a micro-batch's dead letters in one statement.
const insertDeadLetters = `
INSERT INTO dead_letters (id, topic, partition, "offset", record_index, reason, field, detail, key, raw,
                          producer, epoch, created_at)
SELECT id, $1, $2, off, idx, reason, field, detail, key, raw, producer, epoch, $3
FROM unnest($4::uuid[], $5::bigint[], $6::int[], $7::text[], $8::text[], $9::text[], $10::bytea[], $11::bytea[],
            $12::text[], $13::bigint[])
     AS d(id, off, idx, reason, field, detail, key, raw, producer, epoch)`

const insertJump = `
INSERT INTO ingest_offset_jumps (id, topic, partition, from_offset, to_offset, detected_at, detail)
VALUES ($1, $2, $3, $4, $5, $6, $7)`

// touchPosition records that an idle partition is caught up.
const touchPosition = `
UPDATE ingest_partitions
SET high_watermark  = $4,
    applied_through = GREATEST(applied_through, $5),
    updated_at      = now()
WHERE topic = $1 AND partition = $2 AND next_offset = $3`

const selectStatus = `
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

// noteCustomers records which partition the micro-batch's customers arrive
// on; it writes only for a customer seen for the first time (or moved,
// after the topic was repartitioned).
const noteCustomers = `
INSERT INTO ingest_customers (customer, topic, partition, first_seen)
SELECT c, $1, $2, $4 FROM unnest($3::text[]) AS c
ON CONFLICT (customer, topic) DO UPDATE SET partition = EXCLUDED.partition
WHERE ingest_customers.partition <> EXCLUDED.partition`
