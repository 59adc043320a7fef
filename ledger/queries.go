package ledger

// The ledger's SQL, in one place. Every statement is set-based: arrays in,
// one round trip per statement, all of them pipelined. Numbers go in as
// text cast to NUMERIC by Postgres and come out as NUMERIC scanned straight
// into decimals, so nothing is ever a float.

const (
	// Shared: many Applies at once; period close takes the same key
	// exclusively (periods.CustomerLockSpace).
	qLockCustomersShared = `
SELECT count(pg_advisory_xact_lock_shared($2::int, b))
FROM (SELECT DISTINCT abs(hashtext(c) % $3::int) AS b FROM unnest($1::text[]) AS c ORDER BY 1) AS s`

	qSelectCustomers = `SELECT id, schedule FROM customers WHERE id = ANY($1::text[])`

	qSelectClosedPeriods = `
SELECT customer, period_start FROM period_closes
WHERE customer = ANY($1::text[]) AND period_end > $2`

	qInsertStreams = `
INSERT INTO streams (producer, epoch, customer, meter)
SELECT * FROM unnest($1::text[], $2::bigint[], $3::text[], $4::text[])
ORDER BY 1, 3, 4, 2
ON CONFLICT (producer, customer, meter, epoch) DO NOTHING`

	// Row locks in id order: two Applies never wait on each other in a cycle.
	qLockStreams = `
SELECT s.id, s.producer, s.epoch, s.customer, s.meter, s.last_seq, s.last_total
FROM streams s
JOIN unnest($1::text[], $2::bigint[], $3::text[], $4::text[]) AS k(producer, epoch, customer, meter)
  USING (producer, epoch, customer, meter)
ORDER BY s.id
FOR UPDATE OF s`

	// Apply's first attempt runs inside a savepoint, undone when a new
	// record's operation id turns out to be recorded (see load).
	qSavepointApply  = `SAVEPOINT tally_ledger_apply`
	qRollbackToApply = `ROLLBACK TO SAVEPOINT tally_ledger_apply`

	// The records of a micro-batch, binary, in the columns' order of
	// recordColumns (copy.go encodes the rows).
	qCopyRecords = `COPY records (stream_id, seq, operation_id, customer, meter, total, quantity, occurred_at, ` +
		`final, late_fill, billed, period_start, bucket, prior_period, ingested_at) FROM STDIN BINARY`

	// ANY over an array the planner cannot see (ARRAY(SELECT …) runs at
	// execution), not ANY($1): for a parameter the planner estimates the
	// selectivity of every element of the array, each execution, which
	// costs more than the lookups themselves (docs/ingest-breakdown.md); a
	// join with unnest($1) is planned cheaply but may become a hash join
	// over the whole table. This way it is always the unique index.
	qRecordsByOperation = `
SELECT operation_id, stream_id, seq, total, quantity, occurred_at, final
FROM records WHERE operation_id = ANY(ARRAY(SELECT unnest($1::uuid[])))`

	qRecordsBySeq = `
SELECT r.stream_id, r.seq, r.operation_id
FROM unnest($1::bigint[], $2::bigint[]) AS k(stream_id, seq)
JOIN records r USING (stream_id, seq)`

	// The open gap containing each candidate seq, if any.
	qGapsContaining = `
SELECT DISTINCT g.stream_id, g.from_seq, g.to_seq, g.lower_total, g.upper_total,
       g.upper_quantity, g.unmoved, g.billed_period, g.billed_bucket,
       EXISTS (SELECT 1 FROM period_closes pc WHERE pc.customer = g.customer AND pc.period_start = g.billed_period),
       u.operation_id, u.seq, u.occurred_at, u.period_start, u.bucket,
       CASE WHEN u.seq IS NOT NULL THEN EXISTS (SELECT 1 FROM period_closes pc WHERE pc.customer = g.customer AND pc.period_start = u.period_start) END
FROM unnest($1::bigint[], $2::bigint[]) AS k(stream_id, seq)
CROSS JOIN LATERAL (
  SELECT * FROM gaps g
  WHERE g.stream_id = k.stream_id AND g.from_seq <= k.seq
  ORDER BY g.from_seq DESC LIMIT 1
) AS g
-- The record above the gap, when it is a late fill that came without its
-- own quantity (lateFill moves it once the gap's last seq arrives).
LEFT JOIN records u ON g.upper_quantity IS NULL AND u.stream_id = g.stream_id AND u.seq = g.to_seq + 1 AND u.late_fill
WHERE g.to_seq >= k.seq`

	qUpdateStreams = `
UPDATE streams s
SET last_seq = u.last_seq, last_total = u.last_total::numeric,
    final_seq = coalesce(u.final_seq, s.final_seq), updated_at = $5
FROM unnest($1::bigint[], $2::bigint[], $3::text[], $4::bigint[]) AS u(id, last_seq, last_total, final_seq)
WHERE s.id = u.id`

	// Widens each (stream, period) seq range to the batch's new records
	// (see migration 00020); keys unique and sorted, like the rollups'.
	// Only the range columns change, which no index holds: the update is
	// HOT and writes no index entry.
	qUpsertStreamPeriods = `
INSERT INTO stream_periods AS sp (customer, period_start, stream_id, min_seq, max_seq)
SELECT * FROM unnest(@customer::text[], @period_start::timestamptz[], @stream_id::bigint[], @min_seq::bigint[], @max_seq::bigint[])
ON CONFLICT (customer, period_start, stream_id)
DO UPDATE SET min_seq = least(sp.min_seq, EXCLUDED.min_seq), max_seq = greatest(sp.max_seq, EXCLUDED.max_seq)
WHERE EXCLUDED.min_seq < sp.min_seq OR EXCLUDED.max_seq > sp.max_seq`

	qDeleteGaps = `
DELETE FROM gaps g
USING unnest($1::bigint[], $2::bigint[]) AS d(stream_id, from_seq)
WHERE g.stream_id = d.stream_id AND g.from_seq = d.from_seq`

	qInsertGaps = `
INSERT INTO gaps (stream_id, from_seq, to_seq, customer, meter, lower_total, upper_total,
                  upper_quantity, billed_period, billed_bucket, opened_at, unmoved)
SELECT stream_id, from_seq, to_seq, customer, meter, lower_total::numeric, upper_total::numeric,
       upper_quantity::numeric, billed_period, billed_bucket, @opened_at, unmoved::numeric
FROM unnest(@stream_id::bigint[], @from_seq::bigint[], @to_seq::bigint[], @customer::text[], @meter::text[],
            @lower_total::text[], @upper_total::text[], @upper_quantity::text[], @billed_period::timestamptz[],
            @billed_bucket::timestamptz[], @unmoved::text[])
  AS g(stream_id, from_seq, to_seq, customer, meter, lower_total, upper_total,
       upper_quantity, billed_period, billed_bucket, unmoved)`

	qInsertEntries = `
INSERT INTO entries (id, kind, operation_id, customer, meter, amount, period_start, bucket,
                     prior_period, occurred_at, reason, actor, stream_id, seq, request_hash, created_at)
SELECT id, kind, operation_id, customer, meter, amount::numeric, period_start, bucket,
       prior_period, occurred_at, reason, actor, stream_id, seq, request_hash, @created_at
FROM unnest(@id::uuid[], @kind::text[], @operation_id::uuid[], @customer::text[], @meter::text[], @amount::text[],
            @period_start::timestamptz[], @bucket::timestamptz[], @prior_period::timestamptz[], @occurred_at::timestamptz[],
            @reason::text[], @actor::text[], @stream_id::bigint[], @seq::bigint[], @request_hash::bytea[])
  AS e(id, kind, operation_id, customer, meter, amount, period_start, bucket,
       prior_period, occurred_at, reason, actor, stream_id, seq, request_hash)`

	// One adjustment entry; nothing when its operation id is taken (by a
	// concurrent request that committed first).
	qInsertAdjustment = qInsertEntries + `
ON CONFLICT (operation_id) WHERE kind = 'adjustment' DO NOTHING
RETURNING id`

	qSelectAdjustment = `
SELECT id, period_start, prior_period, occurred_at, request_hash
FROM entries WHERE operation_id = $1 AND kind = 'adjustment'`

	// Keys are unique and sorted (Go aggregates them), so concurrent
	// upserts lock rollup rows in one order.
	qUpsertRollups = `
INSERT INTO rollups AS r (customer, meter, period_start, bucket, quantity)
SELECT customer, meter, period_start, bucket, quantity::numeric
FROM unnest($1::text[], $2::text[], $3::timestamptz[], $4::timestamptz[], $5::text[])
  AS u(customer, meter, period_start, bucket, quantity)
ON CONFLICT (customer, meter, period_start, bucket)
DO UPDATE SET quantity = r.quantity + EXCLUDED.quantity`

	// The same amounts by local day (see migration 00006); the same
	// parameters as qUpsertRollups, $4 being the day.
	qUpsertDailyRollups = `
INSERT INTO rollups_daily AS r (customer, meter, period_start, day, quantity)
SELECT customer, meter, period_start, day, quantity::numeric
FROM unnest($1::text[], $2::text[], $3::timestamptz[], $4::date[], $5::text[])
  AS u(customer, meter, period_start, day, quantity)
ON CONFLICT (customer, period_start, meter, day)
DO UPDATE SET quantity = r.quantity + EXCLUDED.quantity`

	qInsertConflicts = `
INSERT INTO conflicts (id, reason, operation_id, stream_id, seq, customer, meter,
                       existing_operation_id, payload, payload_hash, detected_at)
SELECT *, @detected_at::timestamptz
FROM unnest(@id::uuid[], @reason::text[], @operation_id::uuid[], @stream_id::bigint[], @seq::bigint[],
            @customer::text[], @meter::text[], @existing_operation_id::uuid[], @payload::text[]::jsonb[], @payload_hash::bytea[])
ON CONFLICT (operation_id, stream_id, seq, payload_hash) DO NOTHING`

	qInsertFindings = `
INSERT INTO findings (id, kind, customer, meter, stream_id, seq, period_start, amount, detail, created_at)
SELECT id, kind, customer, meter, stream_id, seq, period_start, amount::numeric, detail, @created_at
FROM unnest(@id::uuid[], @kind::text[], @customer::text[], @meter::text[], @stream_id::bigint[], @seq::bigint[],
            @period_start::timestamptz[], @amount::text[], @detail::text[])
  AS f(id, kind, customer, meter, stream_id, seq, period_start, amount, detail)`
)
