package ledger

// The SQL of meter declarations, gauges and unique counts (docs/design.md
// §16), in one place, like queries.go for counters.

const (
	// The gauge and unique paths' first attempt runs inside a savepoint,
	// undone when a new record's operation id turns out to be recorded.
	qSavepointKinds  = `SAVEPOINT tally_ledger_kinds`
	qRollbackToKinds = `ROLLBACK TO SAVEPOINT tally_ledger_kinds`

	qLockMeterKinds       = `SELECT pg_advisory_xact_lock($1::int, 0)`
	qLockMeterKindsShared = `SELECT pg_advisory_xact_lock_shared($1::int, 0)`

	qSelectKinds = `SELECT meter, kind FROM meters WHERE meter = ANY($1::text[])`

	// The batch's operation ids ($1) held by another kind than $2. Gauge
	// and unique readings exist only once a meter of that kind is declared
	// (a kind never changes once used), so the uncorrelated EXISTS,
	// evaluated once, skips those probes until then. The array is hidden
	// from the planner as in qRecordsByOperation.
	qOperationsOfOtherKinds = `
SELECT operation_id, 'counter' FROM records
WHERE $2::text <> 'counter' AND operation_id = ANY(ARRAY(SELECT unnest($1::uuid[])))
UNION ALL
SELECT operation_id, 'gauge' FROM gauge_readings
WHERE $2::text <> 'gauge' AND EXISTS (SELECT FROM meters WHERE kind = 'gauge') AND operation_id = ANY(ARRAY(SELECT unnest($1::uuid[])))
UNION ALL
SELECT operation_id, 'unique' FROM unique_readings
WHERE $2::text <> 'unique' AND EXISTS (SELECT FROM meters WHERE kind = 'unique') AND operation_id = ANY(ARRAY(SELECT unnest($1::uuid[])))`

	// Whether a gauge or unique meter is declared: until one is, a counter
	// batch's operation ids cannot be held by another kind, and the batch
	// need not send them (see applier.load).
	qOtherKindsDeclared = `SELECT EXISTS (SELECT FROM meters WHERE kind <> 'counter')`

	qSelectMeter  = `SELECT meter, kind, unit, description, created_at, updated_at FROM meters WHERE meter = $1`
	qSelectMeters = `SELECT meter, kind, unit, description, created_at, updated_at FROM meters ORDER BY meter`

	// A meter is used once it has a stream: streams has no index by meter
	// alone, but this runs only when a declaration changes a kind.
	// A meter has usage once it has a stream or an entry (an adjustment is
	// an amount of a counter).
	qMeterHasStreams = `SELECT EXISTS (SELECT 1 FROM streams WHERE meter = $1) OR EXISTS (SELECT 1 FROM entries WHERE meter = $1)`

	qUpsertMeter = `
INSERT INTO meters (meter, kind, unit, description, created_at, updated_at)
VALUES (@meter, @kind, @unit, @description, @now, @now)
ON CONFLICT (meter) DO UPDATE SET kind = EXCLUDED.kind, unit = EXCLUDED.unit,
    description = EXCLUDED.description, updated_at = EXCLUDED.updated_at
WHERE (meters.kind, meters.unit, meters.description) IS DISTINCT FROM (EXCLUDED.kind, EXCLUDED.unit, EXCLUDED.description)`

	// One exclusive lock per (customer, meter), sorted, in the class $1:
	// locks.GaugeLevel (a gauge's buckets are read, recomputed and written
	// back) or locks.UniqueMembers (a member's readings are looked up
	// before the batch's go in), so two batches of one customer's meter
	// take turns.
	qLockCustomerMeters = `
SELECT count(pg_advisory_xact_lock($1::int, h))
FROM (SELECT DISTINCT hashtext(c || '/' || m) AS h FROM unnest($2::text[], $3::text[]) AS k(c, m) ORDER BY 1) AS s`

	qGaugeStreams = `
SELECT s.id, g.last_seq, g.last_level, g.last_at, g.first_at, g.ends_at
FROM unnest($1::text[], $2::bigint[], $3::text[], $4::text[]) AS k(producer, epoch, customer, meter)
JOIN streams s USING (producer, epoch, customer, meter)
JOIN gauge_streams g ON g.stream_id = s.id`

	// For each stream, when the earliest newer epoch of its producer,
	// customer and meter began (NULL: none).
	qGaugeNewerEpochs = `
SELECT s.id, (SELECT min(g.first_at) FROM streams s2 JOIN gauge_streams g ON g.stream_id = s2.id
              WHERE s2.producer = k.producer AND s2.customer = k.customer AND s2.meter = k.meter AND s2.epoch > k.epoch)
FROM unnest($1::text[], $2::bigint[], $3::text[], $4::text[]) AS k(producer, epoch, customer, meter)
JOIN streams s USING (producer, epoch, customer, meter)`

	// Older epochs of the batch's streams whose level may still be running
	// at $6 (the batch's earliest reading).
	qGaugeOlderEpochs = `
SELECT DISTINCT s.id, s.producer, s.epoch, s.customer, s.meter, g.last_seq, g.last_level, g.last_at, g.first_at, g.ends_at
FROM unnest($1::text[], $2::bigint[], $3::text[], $4::text[]) AS k(producer, epoch, customer, meter)
JOIN streams s ON s.producer = k.producer AND s.customer = k.customer AND s.meter = k.meter AND s.epoch < k.epoch
JOIN gauge_streams g ON g.stream_id = s.id
WHERE g.ends_at IS NULL OR g.ends_at > $5`

	// The recorded readings under operation ids (the array hidden from
	// the planner as in qRecordsByOperation).
	qGaugeByOperation = `
SELECT operation_id, stream_id, seq, level, occurred_at, final FROM gauge_readings
WHERE operation_id = ANY(ARRAY(SELECT unnest($1::uuid[])))`

	// The recorded reading at, just below and just above each seq.
	qGaugeNeighbours = `
SELECT r.stream_id, r.seq, r.operation_id, r.level, r.occurred_at, r.final
FROM unnest($1::bigint[], $2::bigint[]) AS k(stream_id, seq)
CROSS JOIN LATERAL (
  (SELECT * FROM gauge_readings g WHERE g.stream_id = k.stream_id AND g.seq <= k.seq ORDER BY g.seq DESC LIMIT 2)
  UNION ALL
  (SELECT * FROM gauge_readings g WHERE g.stream_id = k.stream_id AND g.seq > k.seq ORDER BY g.seq LIMIT 1)
) AS r`

	// A stream's readings from the one in force at $2 on.
	qGaugeReadingsFrom = `
SELECT stream_id, seq, operation_id, level, occurred_at, final FROM gauge_readings
WHERE stream_id = $1 AND seq >= coalesce(
  (SELECT max(seq) FROM gauge_readings WHERE stream_id = $1 AND occurred_at <= $2), 1)`

	// The buckets of each (customer, meter) from $3 through $4, and the
	// last one before $3.
	qGaugeDays = `
SELECT k.customer, k.meter, d.day_start, d.day_end, d.period_start, d.level_in, d.max_prefix, d.last_at, d.unit_seconds, d.level_out
FROM unnest($1::text[], $2::text[], $3::timestamptz[], $4::timestamptz[]) AS k(customer, meter, lo, hi)
CROSS JOIN LATERAL (
  (SELECT * FROM gauge_days g WHERE g.customer = k.customer AND g.meter = k.meter AND g.day_start < k.lo
   ORDER BY g.day_start DESC LIMIT 1)
  UNION ALL
  (SELECT * FROM gauge_days g WHERE g.customer = k.customer AND g.meter = k.meter AND g.day_start BETWEEN k.lo AND k.hi)
) AS d`

	qGaugePointsIn = `
SELECT k.customer, k.meter, p.at, p.delta
FROM unnest($1::text[], $2::text[], $3::timestamptz[], $4::timestamptz[]) AS k(customer, meter, lo, hi)
JOIN gauge_points p ON p.customer = k.customer AND p.meter = k.meter AND p.at >= k.lo AND p.at < k.hi
ORDER BY 1, 2, 3`

	// The readings of a micro-batch, binary, in the columns' order of
	// gaugeColumns (gauge_days.go encodes the rows).
	qCopyGaugeReadings = `COPY gauge_readings (stream_id, seq, operation_id, customer, meter, level, occurred_at, ` +
		`final, late_fill, ingested_at) FROM STDIN BINARY`

	qUpsertGaugeStreams = `
INSERT INTO gauge_streams AS g (stream_id, customer, meter, last_seq, last_level, last_at, first_at, ends_at)
SELECT stream_id, customer, meter, last_seq, last_level::numeric, last_at, first_at, ends_at
FROM unnest(@stream_id::bigint[], @customer::text[], @meter::text[], @last_seq::bigint[], @last_level::text[],
            @last_at::timestamptz[], @first_at::timestamptz[], @ends_at::timestamptz[])
  AS u(stream_id, customer, meter, last_seq, last_level, last_at, first_at, ends_at)
ORDER BY stream_id
ON CONFLICT (stream_id) DO UPDATE SET last_seq = EXCLUDED.last_seq, last_level = EXCLUDED.last_level,
    last_at = EXCLUDED.last_at, first_at = EXCLUDED.first_at, ends_at = EXCLUDED.ends_at`

	qUpdateStreamSeqs = `
UPDATE streams s SET last_seq = u.last_seq, final_seq = coalesce(u.final_seq, s.final_seq), updated_at = $4
FROM unnest($1::bigint[], $2::bigint[], $3::bigint[]) AS u(id, last_seq, final_seq)
WHERE s.id = u.id`

	qUpsertGaugePoints = `
INSERT INTO gauge_points AS p (customer, meter, at, delta)
SELECT * FROM unnest(@customer::text[], @meter::text[], @at::timestamptz[], @delta::text[]::numeric[])
ON CONFLICT (customer, meter, at) DO UPDATE SET delta = p.delta + EXCLUDED.delta`

	qUpsertGaugeDays = `
INSERT INTO gauge_days AS d (customer, meter, day_start, day_end, period_start, level_in, max_prefix, last_at, unit_seconds, level_out)
SELECT customer, meter, day_start, day_end, period_start, level_in::numeric, max_prefix::numeric, last_at, unit_seconds::numeric, level_out::numeric
FROM unnest(@customer::text[], @meter::text[], @day_start::timestamptz[], @day_end::timestamptz[], @period_start::timestamptz[],
            @level_in::text[], @max_prefix::text[], @last_at::timestamptz[], @unit_seconds::text[], @level_out::text[])
  AS u(customer, meter, day_start, day_end, period_start, level_in, max_prefix, last_at, unit_seconds, level_out)
ON CONFLICT (customer, meter, day_start) DO UPDATE SET level_in = EXCLUDED.level_in, max_prefix = EXCLUDED.max_prefix,
    last_at = EXCLUDED.last_at, unit_seconds = EXCLUDED.unit_seconds, level_out = EXCLUDED.level_out`

	// A level change open to the end of time shifts every later bucket by
	// a constant: their shape is unchanged.
	qShiftGaugeDays = `
UPDATE gauge_days d SET level_in = d.level_in + u.shift::numeric, max_prefix = d.max_prefix + u.shift::numeric,
    level_out = d.level_out + u.shift::numeric,
    unit_seconds = d.unit_seconds + u.shift::numeric * extract(epoch FROM d.day_end - d.day_start)
FROM unnest(@customer::text[], @meter::text[], @after::timestamptz[], @shift::text[]) AS u(customer, meter, after, shift)
WHERE d.customer = u.customer AND d.meter = u.meter AND d.day_start > u.after`

	qInsertGaugeAdjustments = `
INSERT INTO gauge_adjustments (id, customer, meter, period_start, prior_period, unit_seconds, operation_id, created_at)
SELECT id, customer, meter, period_start, prior_period, unit_seconds::numeric, operation_id, @now
FROM unnest(@id::uuid[], @customer::text[], @meter::text[], @period_start::timestamptz[], @prior_period::timestamptz[],
            @unit_seconds::text[], @operation_id::uuid[])
  AS a(id, customer, meter, period_start, prior_period, unit_seconds, operation_id)`

	// Usage: a gauge's buckets in a period and the last one before it.

	// Every declared gauge's buckets of a customer in a period ($3, $4),
	// and the last bucket before it (its level is carried in); ahead: the
	// bucket ends after the read's now ($5) and has a change point at or
	// after it (a reading stamped ahead of now, at most
	// ledger.MaxClockSkew ahead of when it was applied). A flag in the
	// output, not a filter, so the plan is the one without it.
	qKindGaugeDays = `
SELECT m.meter, d.day_start, d.day_end, d.level_in, d.max_prefix, d.last_at, d.unit_seconds, d.level_out, d.ahead
FROM meters m CROSS JOIN LATERAL (
  (SELECT g.*, false AS ahead FROM gauge_days g
   WHERE g.customer = $1 AND g.meter = m.meter AND g.day_start < $3 ORDER BY g.day_start DESC LIMIT 1)
  UNION ALL
  (SELECT g.*, g.day_end > $5::timestamptz AND g.last_at >= $5::timestamptz FROM gauge_days g
   WHERE g.customer = $1 AND g.meter = m.meter AND g.day_start >= $3 AND g.day_start < $4)
) AS d
WHERE m.kind = 'gauge' AND ($2::text IS NULL OR m.meter = $2)
ORDER BY m.meter, d.day_start`

	qKindGaugeAdjustments = `
SELECT meter, sum(unit_seconds) FROM gauge_adjustments
WHERE customer = $1 AND period_start = $2 AND ($3::text IS NULL OR meter = $3) GROUP BY meter`

	// A bucket's change points in [$3, $4): of an ahead bucket from the
	// read's now on (at most the skew window's), and rarely those before
	// it (see KindsRead.Finish).
	qGaugePointsBetween = `SELECT at, delta FROM gauge_points WHERE customer = $1 AND meter = $2 AND at >= $3 AND at < $4 ORDER BY at`

	// Reconciliation and tests: every reading of a customer's gauge, a
	// stream at a time (gauge_streams_customer, then the readings'
	// primary key).
	qGaugeReadingsOf = `
SELECT s.producer, s.epoch, r.seq, r.level, r.occurred_at, r.final
FROM gauge_streams g JOIN streams s ON s.id = g.stream_id JOIN gauge_readings r ON r.stream_id = g.stream_id
WHERE g.customer = $1 AND g.meter = $2`

	// Reconciliation of a period: the readings GaugeReadingsFor returns,
	// a stream at a time (gauge_streams_customer, then the readings'
	// primary key: no index finds readings by time, migration 00037). A
	// stream's occurred_at never decreases with seq, so its last reading
	// at or before start ($3) is found walking back from its newest, and
	// the period's readings follow it by seq.
	qGaugeReadingsFor = `
SELECT s.producer, s.epoch, r.seq, r.level, r.occurred_at, r.final
FROM gauge_streams g JOIN streams s ON s.id = g.stream_id
CROSS JOIN LATERAL (SELECT coalesce((SELECT seq FROM gauge_readings WHERE stream_id = g.stream_id AND occurred_at <= $3
                                     ORDER BY seq DESC LIMIT 1), 0) AS seq) carry
JOIN gauge_readings r ON r.stream_id = g.stream_id AND r.seq >= carry.seq AND r.occurred_at < $4
WHERE g.customer = $1 AND g.meter = $2`

	// The changes of level the readings of qGaugeReadingsFor make, in time
	// order, by RecomputeGauge's rules: a reading holds its level from its
	// occurred_at until its stream's next reading or the first reading (of
	// those read) of a newer epoch of its producer, whichever comes first;
	// a final reading, a level of 0 and one ended when it begins make none.
	qGaugeLevelChangesFor = `
WITH rs AS (` + qGaugeReadingsFor + `),
firsts AS (SELECT producer, epoch, min(occurred_at) AS first FROM rs GROUP BY 1, 2),
ends AS (SELECT f.producer, f.epoch, (SELECT min(n.first) FROM firsts n WHERE n.producer = f.producer AND n.epoch > f.epoch) AS epoch_end
         FROM firsts f),
spans AS (
  SELECT rs.level, rs.final, rs.occurred_at AS from_at,
         least(lead(rs.occurred_at) OVER (PARTITION BY rs.producer, rs.epoch ORDER BY rs.seq), ends.epoch_end) AS to_at
  FROM rs JOIN ends USING (producer, epoch)),
held AS (SELECT level, from_at, to_at FROM spans WHERE NOT final AND level <> 0 AND (to_at IS NULL OR from_at < to_at))
SELECT at, d FROM (
  SELECT from_at AS at, level AS d FROM held
  UNION ALL
  SELECT to_at, -level FROM held WHERE to_at IS NOT NULL
) c ORDER BY at`

	// The array is hidden from the planner as in qRecordsByOperation.
	qUniqueByOperation = `
SELECT operation_id, stream_id, seq, member, occurred_at, final FROM unique_readings
WHERE operation_id = ANY(ARRAY(SELECT unnest($1::uuid[])))`

	qUniqueBySeq = `
SELECT r.stream_id, r.seq, r.operation_id
FROM unnest($1::bigint[], $2::bigint[]) AS k(stream_id, seq)
JOIN unique_readings r USING (stream_id, seq)`

	// The readings of a micro-batch, binary, in the columns' order of
	// uniqueColumns (unique.go encodes the rows).
	qCopyUniqueReadings = `COPY unique_readings (stream_id, seq, operation_id, customer, meter, member, occurred_at, ` +
		`final, late_fill, ingested_at, period_start, day, counted, indexed) FROM STDIN BINARY`

	// The counted readings (the first of each member and day) of the
	// members ($1 customers, $2 meters, $3 members, $4 periods,
	// pairwise): a descent of unique_readings_counted per member (the
	// subquery is kept apart so that it stays one), at most a row per
	// member and day. A row is another member's when hashes collide: the
	// caller keys what it finds by the row's customer, meter and member.
	qCountedMembers = `
SELECT r.customer, r.meter, r.member, r.period_start, r.day
FROM unnest($1::text[], $2::text[], $3::text[], $4::timestamptz[]) AS k(c, m, member, p)
CROSS JOIN LATERAL (
  SELECT * FROM unique_readings r
  WHERE hashtextextended(r.customer || '/' || r.meter, 0) = hashtextextended(k.c || '/' || k.m, 0)
    AND r.period_start = k.p AND hashtextextended(r.member, 0) = hashtextextended(k.member, 0) AND r.counted AND r.indexed
  OFFSET 0) r`

	// The counted readings of whole indexed periods ($1 customers, $2
	// meters, $3 periods, pairwise): a range of unique_readings_counted
	// each.
	qCountedInPeriods = `
SELECT k.c, k.m, k.p, r.member, r.day
FROM unnest($1::text[], $2::text[], $3::timestamptz[]) AS k(c, m, p)
CROSS JOIN LATERAL (
  SELECT r.member, r.day FROM unique_readings r
  WHERE hashtextextended(r.customer || '/' || r.meter, 0) = hashtextextended(k.c || '/' || k.m, 0)
    AND r.period_start = k.p AND r.counted AND r.indexed AND r.customer = k.c AND r.meter = k.m
  OFFSET 0) r`

	// The counted readings of whole periods not indexed (as
	// qCountedInPeriods): through the seq ranges of the meter's streams
	// in stream_periods and the readings' primary key, as qUniqueRecount
	// reads them; fewer rows than Config.UniqueIndexAfter a period.
	qCountedInStreams = `
SELECT k.c, k.m, k.p, r.member, r.day
FROM unnest($1::text[], $2::text[], $3::timestamptz[]) AS k(c, m, p)
JOIN stream_periods sp ON sp.customer = k.c AND sp.period_start = k.p
JOIN streams s ON s.id = sp.stream_id AND s.meter = k.m
CROSS JOIN LATERAL (
  SELECT r.member, r.day FROM unique_readings r
  WHERE r.stream_id = sp.stream_id AND r.seq BETWEEN sp.min_seq AND sp.max_seq AND r.period_start = k.p AND r.counted
  OFFSET 0) r`

	// The periods ($1 customers, $2 meters, $3 periods, pairwise) go into
	// the member index: their counted readings, found as in
	// qCountedInStreams (how many is the answer), and every row of their
	// counts.
	qIndexPeriods = `
WITH k AS (SELECT * FROM unnest($1::text[], $2::text[], $3::timestamptz[]) AS k(c, m, p)),
ranges AS (
  SELECT sp.stream_id, sp.min_seq, sp.max_seq, k.p FROM k
  JOIN stream_periods sp ON sp.customer = k.c AND sp.period_start = k.p
  JOIN streams s ON s.id = sp.stream_id AND s.meter = k.m),
readings AS (
  UPDATE unique_readings r SET indexed = true
  FROM ranges x
  WHERE r.stream_id = x.stream_id AND r.seq BETWEEN x.min_seq AND x.max_seq AND r.period_start = x.p
    AND r.counted AND NOT r.indexed
  RETURNING 1),
counts AS (
  UPDATE unique_counts c SET indexed = true
  FROM k WHERE c.customer = k.c AND c.meter = k.m AND c.period_start = k.p AND NOT c.indexed)
SELECT count(*) FROM readings`

	// For periods without a row yet ($1 customers, $2 meters, $3
	// periods, pairwise): the seqs the meter's streams span in the
	// customer's latest earlier period of the meter (0: none), found as
	// qUniqueCountVersions finds a period's. A period whose predecessor
	// reached Config.UniqueIndexAfter is indexed from its first reading.
	qPreviousPeriodSpans = `
SELECT k.c, k.m, k.p, coalesce((
  SELECT sum(sp.max_seq - sp.min_seq + 1) FROM stream_periods sp JOIN streams s ON s.id = sp.stream_id
  WHERE sp.customer = k.c AND s.meter = k.m AND sp.period_start = (
    SELECT max(u.period_start) FROM unique_counts u
    WHERE u.customer = k.c AND u.meter = k.m AND u.period_start < k.p AND NOT u.per_day)), 0)
FROM unnest($1::text[], $2::text[], $3::timestamptz[]) AS k(c, m, p)`

	qAddUniqueCounts = `
INSERT INTO unique_counts AS c (customer, meter, period_start, per_day, day, members, indexed)
SELECT * FROM unnest(@customer::text[], @meter::text[], @period_start::timestamptz[], @per_day::boolean[], @day::timestamptz[],
                     @members::bigint[], @indexed::boolean[])
ORDER BY 1, 2, 3, 4, 5
ON CONFLICT (customer, meter, period_start, per_day, day) DO UPDATE SET members = c.members + EXCLUDED.members,
                                                                        indexed = c.indexed OR EXCLUDED.indexed
RETURNING customer, meter, period_start, per_day, xmin::text::bigint, members`

	// The period rows of unique_counts ($1 customers, $2 meters, $3
	// periods, pairwise): the version of what a Ledger remembers of each
	// period (unique_cache.go), the period's member days (what reading it
	// whole would hold), whether it is indexed and, when it is not, the
	// seqs its streams span in it (at least its readings: what
	// qCountedInStreams reads).
	qUniqueCountVersions = `
SELECT u.customer, u.meter, u.period_start, u.xmin::text::bigint, u.members,
       (SELECT coalesce(sum(d.members), 0) FROM unique_counts d
        WHERE d.customer = u.customer AND d.meter = u.meter AND d.period_start = u.period_start AND d.per_day),
       u.indexed,
       CASE WHEN u.indexed THEN 0 ELSE
         (SELECT coalesce(sum(sp.max_seq - sp.min_seq + 1), 0) FROM stream_periods sp JOIN streams s ON s.id = sp.stream_id
          WHERE sp.customer = u.customer AND sp.period_start = u.period_start AND s.meter = u.meter) END
FROM unnest($1::text[], $2::text[], $3::timestamptz[]) AS k(customer, meter, period_start)
JOIN unique_counts u ON u.customer = k.customer AND u.meter = k.meter AND u.period_start = k.period_start
                    AND NOT u.per_day AND u.day = k.period_start`

	qUniqueUsage = `
SELECT meter, per_day, day, members FROM unique_counts
WHERE customer = $1 AND period_start = $2 AND ($3::text IS NULL OR meter = $3) ORDER BY meter, per_day, day`

	// Declared kinds are few: streams of their meters, by a scan of
	// streams (one row per stream), once per reconciliation run.
	qKindCustomers = `
SELECT DISTINCT s.customer FROM streams s JOIN meters m ON m.meter = s.meter WHERE m.kind <> 'counter'`

	// A gauge_streams row is written with a stream's first reading.
	qGaugeMetersWithReadings = `SELECT DISTINCT meter FROM gauge_streams WHERE customer = $1 ORDER BY 1`

	qGaugeMovesOut = `
SELECT meter, sum(unit_seconds) FROM gauge_adjustments WHERE customer = $1 AND prior_period = $2 GROUP BY meter`

	// Reconciliation: distinct members from every reading of the period,
	// found as a counter's records are, through the seq ranges of its
	// streams in stream_periods; a reading counted in the period although
	// its occurred_at lies outside it is not recounted, so a wrong
	// attribution shows as a difference.
	qUniqueRecount = `
SELECT r.meter, count(DISTINCT r.member) FILTER (WHERE r.occurred_at >= $2 AND r.occurred_at < $3)
FROM stream_periods sp
JOIN unique_readings r ON r.stream_id = sp.stream_id AND r.seq BETWEEN sp.min_seq AND sp.max_seq AND r.period_start = sp.period_start
WHERE sp.customer = $1 AND sp.period_start = $2 GROUP BY r.meter`
)
