package reconcile

// The package's SQL, in one place: every statement is a named constant,
// every value a bind parameter. Statements over a run's targets take them
// as named arguments (target.args): @customers, @starts and @ends, the
// (customer, period) pairs as parallel arrays, and @all, true when the run
// covers every customer that has the period.
//
// Names: q, then what the statement reads or writes, then what it does.

// qTargets is the common table of a run's targets; statements that start
// with it are built from it by constant concatenation only.
const qTargets = `t AS (SELECT * FROM unnest(@customers::text[], @starts::timestamptz[], @ends::timestamptz[]) AS t(customer, period_start, period_end))`

// A run's transaction: the checks aggregate a whole period at once, so
// the hash aggregates get room to stay in memory (hash_mem_multiplier: a
// period's buckets, one per customer, meter and hour, are one hash table),
// and force_custom_plan keeps Postgres from switching, after five runs on
// a connection, to a generic plan that cannot see how selective the
// targets are (or that @all drops the customer filter). All last for the
// read-only transaction only.
const qRunSettings = `SET LOCAL work_mem = '256MB'; SET LOCAL hash_mem_multiplier = 8; SET LOCAL plan_cache_mode = force_custom_plan`

// The rollup check is hash-shaped; the planner's sort-based alternatives
// for a period's million buckets are a third slower (measured with
// BenchmarkReconcileScan). Only for that statement.
const (
	qSortOff = `SET LOCAL enable_sort = off`
	qSortOn  = `SET LOCAL enable_sort = on`
)

// The stream check's statement is planned from estimates of its CTEs' rows,
// which make it look dear enough to be JIT-compiled: half a second of
// compiling for a statement that runs in a fraction of that. Only for
// that statement; RESET goes back to the database's setting.
const (
	qJITOff   = `SET LOCAL jit = off`
	qJITReset = `RESET jit`
)

// The gauge and unique check runs a few statements per customer, each
// reading by key (a customer's gauge level changes, its unique recount):
// planned again for every customer, as the run's custom plans would have
// them, their planning took longer than their running (about 0.7 ms of
// 1.6 ms a customer with a gauge). Generic plans for that check only.
const (
	qGenericPlans = `SET LOCAL plan_cache_mode = force_generic_plan`
	qCustomPlans  = `SET LOCAL plan_cache_mode = force_custom_plan`
)

const qIngestTablesExist = `SELECT to_regclass('ingest_partitions') IS NOT NULL`

// Runs, findings and verdicts.
const (
	qRunInsert = `
INSERT INTO reconciliation_runs (id, period, customer, deep, status, started_at)
VALUES (@id, @period, @customer, @deep, @status, @started_at)`

	qRunFinish = `
UPDATE reconciliation_runs
SET status = @status, finished_at = @finished_at, entries_scanned = @entries_scanned, checks = @checks,
    totals = @totals, error = @error
WHERE id = @id`

	// Amounts go in as text cast by Postgres: exact, never a float.
	qFindingsInsert = `
INSERT INTO reconciliation_findings (run_id, n, kind, severity, customer, meter, stream, period_start, amount, detail, omitted)
SELECT @run_id, n, kind, severity, customer, meter, stream, period_start, amount::numeric, detail, omitted
FROM unnest(@n::int[], @kind::text[], @severity::text[], @customer::text[], @meter::text[], @stream::text[],
            @period_start::timestamptz[], @amount::text[], @detail::text[], @omitted::bigint[])
  AS f(n, kind, severity, customer, meter, stream, period_start, amount, detail, omitted)`

	qVerdictsInsert = `
INSERT INTO reconciliation_verdicts (run_id, customer, period_start, clean, totals, fingerprint)
SELECT @run_id, customer, period_start, clean, totals, fingerprint
FROM unnest(@customer::text[], @period_start::timestamptz[], @clean::boolean[], @totals::text[]::jsonb[], @fingerprint::text[]::jsonb[])
  AS v(customer, period_start, clean, totals, fingerprint)`

	qRunSelect = `
SELECT period, customer, deep, status, started_at, finished_at, entries_scanned, checks, totals, error
FROM reconciliation_runs WHERE id = $1`

	qFindingsSelect = `
SELECT kind, severity, coalesce(customer, ''), coalesce(meter, ''), coalesce(stream, ''), period_start,
       amount, detail, coalesce(omitted, 0)
FROM reconciliation_findings WHERE run_id = $1 ORDER BY n`

	// A page of runs below the cursor $1 (the largest uuid for the first
	// page), newest first; $2: the limit; $3: the discrepancy severity;
	// findings are counted with those a summary finding stands for;
	// qRunsListOfPeriod those of period $4. Two statements, not one whose
	// filters read "empty or equal": as the generic plan Postgres settles
	// on for a prepared statement, that read every run before the page.
	qRunsSelect = `
SELECT r.id, r.period, coalesce(r.customer, ''), r.deep, r.status, r.started_at, r.finished_at, r.entries_scanned,
       coalesce(r.error, ''),
       (SELECT coalesce(sum(coalesce(f.omitted, 1)), 0) FROM reconciliation_findings f WHERE f.run_id = r.id),
       (SELECT coalesce(sum(coalesce(f.omitted, 1)), 0) FROM reconciliation_findings f WHERE f.run_id = r.id AND f.severity = $3)
FROM reconciliation_runs r
WHERE `
	qRunsPage = `r.id < $1
ORDER BY r.id DESC
LIMIT $2`
	qRunsList         = qRunsSelect + qRunsPage
	qRunsListOfPeriod = qRunsSelect + `r.period = $4 AND ` + qRunsPage
)

// One run per period at a time: a session lock per resolved period name
// in key space runLockSpace.
const (
	qRunLockTry    = `SELECT pg_try_advisory_lock($1::int, hashtext($2))`
	qRunLockUnlock = `SELECT pg_advisory_unlock($1::int, hashtext($2))`

	// A run holds the lock of its own id (space runAliveSpace) while it
	// runs, from before it is stored as running.
	qRunAliveLock   = `SELECT pg_advisory_lock($1::int, hashtext($2::text))`
	qRunAliveUnlock = `SELECT pg_advisory_unlock($1::int, hashtext($2::text))`

	// Runs stored as running whose lock no session holds: their process
	// died (a SIGKILL, an OOM kill, a lost host) before they finished.
	qRunsAbandoned = `
UPDATE reconciliation_runs r
SET status = 'failed', finished_at = now(),
    error = 'the process running it ended before it finished (killed, or its connection to Postgres lost); nothing it checked was closed'
WHERE r.status = 'running'
  AND NOT EXISTS (SELECT 1 FROM pg_locks l
                  WHERE l.locktype = 'advisory' AND l.granted AND l.objsubid = 2
                    AND l.database = (SELECT oid FROM pg_database WHERE datname = current_database())
                    AND l.classid = $1::int::oid AND l.objid = hashtext(r.id::text)::oid)
RETURNING r.id`
)

// Customers and their calendars.
const (
	// $1: one customer, or '' for all.
	qCustomerSchedules = `SELECT id, schedule FROM customers WHERE $1 = '' OR id = $1 ORDER BY id`
	qCustomerExists    = `SELECT EXISTS (SELECT 1 FROM customers WHERE id = $1)`

	// Per customer: its calendar, the start of its first period (the
	// earlier of its creation and its first usage) and its closed periods.
	qCustomersDue = `
SELECT c.id, c.schedule,
       least(c.created_at, (SELECT min(r.period_start) FROM rollups r WHERE r.customer = c.id),
             (SELECT min(g.period_start) FROM gauge_days g WHERE g.customer = c.id),
             (SELECT min(u.period_start) FROM unique_counts u WHERE u.customer = c.id)),
       coalesce((SELECT array_agg(pc.period_start) FROM period_closes pc WHERE pc.customer = c.id), '{}')
FROM customers c`

	// Which of the (customer $1, period start $2) pairs are closed.
	qPeriodsClosed = `
SELECT pc.customer FROM period_closes pc
JOIN unnest($1::text[], $2::timestamptz[]) AS t(customer, period_start) USING (customer, period_start)`
)

// The checks (docs/design.md §6), in the order they run.
const (
	// Every rollup bucket of the targets recomputed from records and
	// entries, per customer and meter: aggregate first, filtering on what
	// the indexes know, then keep the exact (customer, period) pairs. With
	// @all the periods' records are read whole; otherwise the customers'
	// periods are found through stream_periods (migration 00020); with a
	// custom plan, the branch not taken folds away.
	qRollupsCheck = `
WITH ` + qTargets + `,
rec AS (
  SELECT customer, meter, period_start, bucket, sum(billed) AS q, count(*) AS n
  FROM (SELECT customer, meter, period_start, bucket, billed FROM records
        WHERE @all::boolean AND period_start = ANY(@starts)
        UNION ALL
        SELECT customer, meter, period_start, bucket, billed FROM ledger_period_records(@customers, @starts)
        WHERE NOT @all::boolean) AS r
  GROUP BY 1, 2, 3, 4
), ent AS (
  SELECT customer, meter, period_start, bucket, sum(amount) AS q, count(*) AS n
  FROM entries WHERE (@all::boolean OR customer = ANY(@customers)) AND period_start = ANY(@starts) GROUP BY 1, 2, 3, 4
), want AS (
  SELECT customer, meter, period_start, bucket,
         coalesce(r.q, 0) + coalesce(e.q, 0) AS q, coalesce(r.n, 0) + coalesce(e.n, 0) AS n
  FROM rec r FULL JOIN ent e USING (customer, meter, period_start, bucket)
), got AS (
  SELECT customer, meter, period_start, bucket, quantity FROM rollups
  WHERE (@all::boolean OR customer = ANY(@customers)) AND period_start = ANY(@starts)
), b AS (
  SELECT customer, meter, period_start, bucket, coalesce(w.q, 0) AS wq, coalesce(g.quantity, 0) AS gq, coalesce(w.n, 0) AS n
  FROM want w FULL JOIN got g USING (customer, meter, period_start, bucket)
)
SELECT customer, meter, sum(wq), sum(gq), sum(n)::bigint,
       coalesce(string_agg(format('%s: entries %s, rollup %s', bucket, trim_scale(wq), trim_scale(gq)), '; ')
                FILTER (WHERE wq <> gq), '')
FROM b JOIN t USING (customer, period_start)
GROUP BY 1, 2`

	// The daily rollups per customer and meter.
	qDailyRollupsSum = `
WITH ` + qTargets + `
SELECT customer, meter, sum(quantity)
FROM rollups_daily JOIN t USING (customer, period_start)
WHERE (@all::boolean OR customer = ANY(@customers)) AND period_start = ANY(@starts) GROUP BY 1, 2`

	// Prior-period and manual adjustments per customer and meter (rare
	// rows; a partial index finds the prior-period ones): a manual
	// adjustment dated in a closed period (prior_period set) is a
	// prior-period one, as late usage is (docs/design.md §4).
	qBreakdown = `
WITH ` + qTargets + `
SELECT customer, meter, part, sum(q) FROM (
  SELECT customer, meter, 'prior' AS part, billed AS q
  FROM records JOIN t USING (customer, period_start)
  WHERE (@all::boolean OR customer = ANY(@customers)) AND period_start = ANY(@starts) AND prior_period IS NOT NULL
  UNION ALL
  SELECT customer, meter, CASE WHEN prior_period IS NULL THEN 'adjustment' ELSE 'prior' END, amount
  FROM entries JOIN t USING (customer, period_start)
  WHERE (@all::boolean OR customer = ANY(@customers)) AND period_start = ANY(@starts) AND kind = 'adjustment'
) x GROUP BY 1, 2, 3`

	// streamChecksTable holds, for one run, each stream its stream check
	// found adding up further than stream_checks says (seq and billed: its
	// last then). It is temporary (the run's connection's own) and is
	// created before the run's read-only transaction, which may write to it
	// but not create it; qStreamChecksUpsert stores it when the run did not
	// fail.
	streamChecksTable = `CREATE TEMPORARY TABLE stream_checks_found (stream_id bigint NOT NULL, seq bigint NOT NULL, billed numeric NOT NULL)`
	streamChecksDrop  = `DROP TABLE IF EXISTS pg_temp.stream_checks_found`

	// How many of the customers' streams a run sums whole (never found
	// adding up, or all of them in a deep run), and how many there are:
	// streamTotals chooses how qStreamTotals reads their records.
	qStreamsWhole = `
SELECT count(*) FILTER (WHERE ck.stream_id IS NULL OR @whole), count(*)
FROM streams st LEFT JOIN stream_checks ck ON ck.stream_id = st.id
WHERE st.customer = ANY(@customers)`

	// qStreamTotals checks the customers' streams, each from where a run
	// last found it adding up (stream_checks, migration 00047: seq and
	// billed, 0 when none or with @whole, a deep run): it notes those that
	// add up further in stream_checks_found and returns those that do not
	// add up. Streams never checked (or all of them, in a deep run) are
	// summed whole (streamWholeFew or streamWholeMany); those checked
	// before, from there and only when they moved since, by the primary key
	// of records, a stream at a time.
	qStreamTotals = `
WITH s AS (
  SELECT st.id, st.customer, st.meter, st.producer || '/' || st.epoch AS name, st.last_seq, st.last_total,
         coalesce(ck.seq, 0) AS from_seq, coalesce(ck.billed, 0) AS from_billed
  FROM streams st LEFT JOIN stream_checks ck ON ck.stream_id = st.id AND NOT @whole
  WHERE st.customer = ANY(@customers)
), whole AS (%s
), after AS (
  SELECT s.id, a.billed, a.n
  FROM s CROSS JOIN LATERAL (SELECT coalesce(sum(billed), 0) AS billed, count(*) AS n FROM records
                             WHERE stream_id = s.id AND seq > s.from_seq) a
  WHERE s.from_seq > 0 AND s.last_seq > s.from_seq
), summed AS (
  SELECT s.*, coalesce(w.billed, a.billed, 0) AS billed, coalesce(w.n, a.n, 0) AS n
  FROM s LEFT JOIN whole w ON w.id = s.id AND s.from_seq = 0 LEFT JOIN after a ON a.id = s.id
), found AS (
  INSERT INTO pg_temp.stream_checks_found (stream_id, seq, billed)
  SELECT id, last_seq, last_total FROM summed WHERE from_billed + billed = last_total AND last_seq > from_seq
)
SELECT customer, meter, name, last_total, from_seq, from_billed, billed, n
FROM summed WHERE from_billed + billed <> last_total
ORDER BY customer, meter, name`

	// The streams summed whole, when they are few of the run's (new
	// epochs since the last run): each by the primary key of records.
	// The planner cannot see how many the CTE holds, and takes them for
	// few whatever their number.
	streamWholeFew = `
  SELECT stream_id AS id, sum(billed) AS billed, count(*) AS n FROM records
  WHERE stream_id IN (SELECT id FROM s WHERE from_seq = 0) GROUP BY 1`

	// The streams summed whole, when they are many of a run of every
	// customer (a first or deep run): one pass over the records, each
	// stream's sum kept where it is summed whole. By the primary key,
	// stream by stream, a first run over a ledger of 6M records took 25 s,
	// against 2.1–2.3 s for one pass (BenchmarkReconcileScan, 11 months of
	// history). A run of one customer reads its streams by the primary key
	// (streamWholeFew) however many.
	streamWholeMany = `
  SELECT stream_id AS id, sum(billed) AS billed, count(*) AS n FROM records GROUP BY 1`

	// Where the streams found adding up were (seq, billed): never back.
	qStreamChecksUpsert = `
INSERT INTO stream_checks (stream_id, seq, billed, checked_at)
SELECT stream_id, seq, billed, @at::timestamptz FROM pg_temp.stream_checks_found
ON CONFLICT (stream_id) DO UPDATE SET seq = excluded.seq, billed = excluded.billed, checked_at = excluded.checked_at
WHERE stream_checks.seq < excluded.seq`

	qOpenGaps = `
WITH ` + qTargets + `
SELECT g.customer, g.meter, st.producer || '/' || st.epoch, g.from_seq, g.to_seq, g.billed_period,
       g.upper_total - g.upper_quantity - g.lower_total,
       g.upper_total - g.lower_total
FROM gaps g JOIN t ON t.customer = g.customer AND t.period_start = g.billed_period
JOIN streams st ON st.id = g.stream_id
ORDER BY 1, 2, 3, 4`

	// Conflicts whose record occurred in a target period or that were
	// detected in it.
	// What the conflicting record carried: a counter's total, a gauge's
	// level or a unique meter's member.
	qConflicts = `
WITH ` + qTargets + `
SELECT c.customer, c.meter, (c.payload->>'producer') || '/' || (c.payload->>'epoch'), c.reason, c.seq,
       c.operation_id,
       coalesce('total ' || (c.payload->>'total'), 'level ' || (c.payload->>'level'), 'member ' || (c.payload->>'member'), 'no value'),
       coalesce(c.payload->>'occurred_at', '?'), c.detected_at
FROM conflicts c JOIN t ON t.customer = c.customer
 AND ((c.payload->>'occurred_at')::timestamptz >= t.period_start AND (c.payload->>'occurred_at')::timestamptz < t.period_end
      OR c.detected_at >= t.period_start AND c.detected_at < t.period_end)
ORDER BY c.detected_at`

	// Dead letters not replayed or accepted, refused since a target period
	// started: those of its customer, then those whose key is no known
	// customer (with that key, for the report).
	qDeadLettersPending = `
WITH ` + qTargets + `,
pending AS MATERIALIZED (
  SELECT d.* FROM dead_letters d
  WHERE d.replayed_at IS NULL
    AND NOT EXISTS (SELECT 1 FROM reconciliation_acceptances a WHERE a.kind = 'dead_letter' AND a.id = d.id)
)
SELECT t.customer, d.id, d.reason, d.detail, d.partition, d."offset", d.record_index, '' AS key
FROM pending d JOIN t ON d.key = convert_to(t.customer, 'UTF8') AND d.created_at >= t.period_start
UNION ALL
SELECT '', d.id, d.reason, d.detail, d.partition, d."offset", d.record_index, coalesce(encode(d.key, 'escape'), '(none)')
FROM pending d
WHERE d.created_at >= (SELECT min(period_start) FROM t)
  AND (d.key IS NULL OR NOT EXISTS (SELECT 1 FROM customers cu WHERE convert_to(cu.id, 'UTF8') = d.key))
ORDER BY 2`

	// Offset jumps not accepted, detected since the earliest target period
	// started.
	qOffsetJumpsPending = `
WITH ` + qTargets + `
SELECT j.id, j.topic, j.partition, j.from_offset, j.to_offset, j.detected_at, j.detail
FROM ingest_offset_jumps j
WHERE j.detected_at >= (SELECT min(period_start) FROM t)
  AND NOT EXISTS (SELECT 1 FROM reconciliation_acceptances a WHERE a.kind = 'offset_jump' AND a.id = j.id)
ORDER BY j.detected_at`

	// Usage of a target period billed later, as prior-period adjustments.
	qLateUsage = `
WITH ` + qTargets + `
SELECT r.customer, r.meter, r.period_start, sum(r.billed), count(*)
FROM records r JOIN t ON t.customer = r.customer AND r.prior_period = t.period_start
GROUP BY 1, 2, 3 ORDER BY 1, 2, 3`

	// The ledger's own findings about a target period or noted during it.
	qLedgerFindings = `
WITH ` + qTargets + `
SELECT f.kind, f.customer, f.meter, coalesce(st.producer || '/' || st.epoch, ''), f.amount, f.detail
FROM findings f JOIN t ON t.customer = f.customer
 AND (t.period_start = f.period_start OR f.created_at >= t.period_start AND f.created_at < t.period_end)
LEFT JOIN streams st ON st.id = f.stream_id
ORDER BY f.created_at`

	// Superseded streams (few: found from stream state) that never said
	// final and have records in a target period, with the epoch that took
	// over.
	qAbandonedStreams = `
WITH ` + qTargets + `
SELECT st.customer, st.meter, st.producer || '/' || st.epoch, st.last_seq, st.last_total,
       (SELECT min(n.epoch) FROM streams n WHERE n.producer = st.producer AND n.customer = st.customer
          AND n.meter = st.meter AND n.epoch > st.epoch)
FROM streams st JOIN t ON t.customer = st.customer
WHERE st.final_seq IS DISTINCT FROM st.last_seq
  AND EXISTS (SELECT 1 FROM streams n WHERE n.producer = st.producer AND n.customer = st.customer
                AND n.meter = st.meter AND n.epoch > st.epoch)
  AND EXISTS (SELECT 1 FROM stream_periods sp
              WHERE sp.customer = st.customer AND sp.period_start = t.period_start AND sp.stream_id = st.id)
  AND NOT EXISTS (SELECT 1 FROM meters mk WHERE mk.meter = st.meter AND mk.kind = 'unique')
ORDER BY 1, 2, 3`

	// Per partition: records in and the sum of outcomes; refused messages
	// and records and the dead letters kept for them.
	qConservation = `
SELECT p.topic, p.partition, p.records_in,
       p.records_applied + p.records_duplicate + p.records_conflict + p.records_late_fill + p.records_rejected,
       p.records_rejected + p.messages_rejected,
       (SELECT count(*) FROM dead_letters d WHERE d.topic = p.topic AND d.partition = p.partition)
FROM ingest_partitions p ORDER BY 1, 2`

	qOverage = `
WITH ` + qTargets + `
SELECT o.customer, o.meter, o.while_exceeded, o.while_stale, o.over_limit
FROM quota_overage o JOIN t USING (customer, period_start)
WHERE o.while_exceeded > 0 OR o.while_stale > 0
ORDER BY 1, 2`

	// What the lagged quotas of pools and the global scope admitted over,
	// in scope periods (calendar months, UTC) that overlap a target's
	// period: the global one's always, a pool's when the target's customer
	// was its member during the target's period.
	qScopeOverage = `
WITH ` + qTargets + `
SELECT o.customer, o.meter, o.period_start, o.while_exceeded, o.while_stale, o.over_limit
FROM quota_overage o
WHERE (o.customer = 'global' OR o.customer LIKE 'pool:%')
  AND (o.while_exceeded > 0 OR o.while_stale > 0)
  AND EXISTS (
    SELECT 1 FROM t
    WHERE o.period_start < t.period_end
      AND t.period_start < ((o.period_start AT TIME ZONE 'UTC') + interval '1 month') AT TIME ZONE 'UTC'
      AND (o.customer = 'global' OR EXISTS (
        SELECT 1 FROM pool_members m
        WHERE 'pool:' || m.pool = o.customer AND m.customer = t.customer
          AND m.joined_at < t.period_end AND (m.left_at IS NULL OR m.left_at > t.period_start))))
ORDER BY 1, 2, 3`
)

// The deep check.
const (
	// Ingest's position in the run's snapshot (deep.go's Positions).
	qIngestPositions = `SELECT topic, partition, next_offset FROM ingest_partitions`

	// The operation ids of some customers' conflicts (the deep check).
	qConflictingOperations = `SELECT DISTINCT operation_id FROM conflicts WHERE customer = ANY($1)`

	// The deep check (deep.go): deep_kafka's records of the checked
	// customers, the first of each seq per stream as in the ledger (Kafka's
	// order is ord). The deep check recomputes what the ledger applied: a
	// record the ledger refused is left to the dead letters' check while
	// its dead letter is not replayed (a replay applies the same bytes; a
	// loss accepted stops blocking closes here too), and a record it
	// answered as a conflict (never applied) to the conflicts' check, by
	// the hash the conflict is kept under (ledger.ConflictHash; NULL, and
	// so matching no conflict, for a record whose operation id has none).
	qDeepFirsts = `firsts AS (
  SELECT DISTINCT ON (customer, meter, producer, epoch, seq) customer, meter, producer, epoch, seq, total, occurred_at, shape
  FROM pg_temp.deep_kafka k
  WHERE customer = ANY(@checked)
    AND NOT EXISTS (SELECT 1 FROM dead_letters d
                    WHERE d.topic = @topic AND d.partition = k.partition AND d."offset" = k."offset"
                      AND (d.record_index IS NULL OR d.record_index = k.record_index) AND d.replayed_at IS NULL)
    AND NOT EXISTS (SELECT 1 FROM conflicts c
                    WHERE c.operation_id = k.operation_id AND c.seq = k.seq AND c.payload_hash = k.conflict_hash)
  ORDER BY customer, meter, producer, epoch, seq, ord)`

	// Per checked customer and meter, the usage that occurred in its
	// period as the ledger holds it, wherever it is billed, and as Kafka's
	// records recompute it (each record's growth of its stream's running
	// total counts in the period it occurred in), where the two differ; in
	// order.
	//
	// Two amounts the ledger keeps billed in the period of the record that
	// revealed their gap (the first record above them that is not a late
	// fill), where they did not occur, are counted on the ledger's side
	// where Kafka's records place them: a late fill's own quantity it could
	// not move (late_fill_not_reattributed with its amount: one of the two
	// periods closed) in the fill's period; and what an open gap just below
	// a late fill still holds (seqs still missing) in the fill's period,
	// where Kafka's totals place the growth up to the fill.
	qDeepUsageCompare = `
WITH ` + qTargets + `, ` + qDeepFirsts + `,
kept AS (
  SELECT customer, meter, period_start AS occurred, stream_id, seq AS below, amount FROM findings
  WHERE kind = 'late_fill_not_reattributed' AND amount IS NOT NULL AND customer = ANY(@checked)
  UNION ALL
  SELECT g.customer, g.meter, f.period_start, g.stream_id, f.seq,
         coalesce(g.unmoved, greatest(g.upper_total - coalesce(g.upper_quantity, 0) - g.lower_total, 0))
  FROM gaps g JOIN records f ON f.stream_id = g.stream_id AND f.seq = g.to_seq + 1 AND f.late_fill
  WHERE g.customer = ANY(@checked)),
held AS (
  SELECT customer, meter, sum(q) AS q FROM (
    SELECT customer, meter, p.q FROM (
      SELECT customer, meter, period_start, sum(billed) AS q FROM ledger_period_records(@customers, @starts)
      WHERE prior_period IS NULL GROUP BY 1, 2, 3) p
    JOIN t USING (customer, period_start)
    UNION ALL
    SELECT r.customer, r.meter, r.billed FROM records r JOIN t ON t.customer = r.customer AND r.prior_period = t.period_start
    UNION ALL
    SELECT e.customer, e.meter, e.amount FROM entries e JOIN t USING (customer, period_start) WHERE e.kind = 'reattribution'
    UNION ALL
    SELECT n.customer, n.meter, n.q FROM (
      SELECT k.customer, k.meter, k.occurred AS period_start, k.amount AS q FROM kept k
      UNION ALL
      SELECT k.customer, k.meter,
             (SELECT coalesce(r.prior_period, r.period_start) FROM records r
              WHERE r.stream_id = k.stream_id AND r.seq > k.below AND NOT r.late_fill ORDER BY r.seq LIMIT 1),
             -k.amount
      FROM kept k) n
    JOIN t USING (customer, period_start)
  ) u GROUP BY 1, 2),
grown AS (
  SELECT customer, meter, occurred_at,
         total - coalesce(lag(total) OVER (PARTITION BY customer, meter, producer, epoch ORDER BY seq), 0) AS growth
  FROM firsts),
kafka AS (
  SELECT g.customer, g.meter, sum(g.growth) AS q
  FROM grown g JOIN t ON t.customer = g.customer AND g.occurred_at >= t.period_start AND g.occurred_at < t.period_end
  GROUP BY 1, 2)
SELECT customer, meter, t.period_start, coalesce(h.q, 0), coalesce(k.q, 0)
FROM held h FULL JOIN kafka k USING (customer, meter) JOIN t USING (customer)
WHERE customer = ANY(@checked) AND coalesce(h.q, 0) <> coalesce(k.q, 0)
ORDER BY customer COLLATE "C", meter COLLATE "C"`

	// Every stream of the checked customers that the ledger or Kafka's
	// records hold, with where each says it ended (NULL where it holds
	// none of it) and what Kafka's last record of it carries; in order.
	qDeepStreamsCompare = `
WITH ` + qDeepFirsts + `,
kafka AS (
  SELECT DISTINCT ON (customer, meter, producer, epoch) customer, meter, producer, epoch, seq, total, shape
  FROM firsts ORDER BY customer, meter, producer, epoch, seq DESC),
ledger AS (
  SELECT customer, meter, producer, epoch, last_seq AS seq, last_total AS total
  FROM streams WHERE customer = ANY(@checked))
SELECT customer, meter, producer, epoch, l.seq, l.total, k.seq, k.total, k.shape
FROM ledger l FULL JOIN kafka k USING (customer, meter, producer, epoch)
ORDER BY customer COLLATE "C", meter COLLATE "C", producer COLLATE "C", epoch`
)

// The close gate.
const (
	// The newest verdict on (customer $1, period start $2) of a run that
	// did not fail.
	qVerdictLatest = `
SELECT v.run_id, v.clean, v.fingerprint FROM reconciliation_verdicts v
JOIN reconciliation_runs r ON r.id = v.run_id
WHERE v.customer = $1 AND v.period_start = $2 AND r.status <> 'failed'
ORDER BY r.started_at DESC, r.id DESC LIMIT 1`

	// The customer's streams whose billed deltas no longer add up to their
	// last total: the records after where a run last found each adding up
	// (stream_checks), by the primary key of records.
	qStreamsBroken = `
SELECT count(*) FROM streams st
LEFT JOIN stream_checks k ON k.stream_id = st.id
WHERE st.customer = $1
  AND st.last_total <> coalesce(k.billed, 0) + (SELECT coalesce(sum(r.billed), 0) FROM records r
                                                WHERE r.stream_id = st.id AND r.seq > coalesce(k.seq, 0))`

	// Per meter, the ledger rows billed in one customer's period and their
	// sum (stream_periods finds them, migration 00020).
	qLedgerUsage = `
SELECT meter, sum(n)::bigint, sum(q) FROM (
  SELECT meter, count(*) AS n, sum(billed) AS q FROM ledger_period_records(ARRAY[$1::text], ARRAY[$2::timestamptz]) GROUP BY 1
  UNION ALL
  SELECT meter, count(*), sum(amount) FROM entries WHERE customer = $1 AND period_start = $2 GROUP BY 1
) u GROUP BY 1`

	// Per target, everything but usage that a run checks and a close
	// compares. Gauge and unique readings are append-only: their counts
	// see every reading that can change the period, whether or not it
	// changed an aggregate (docs/design.md §4, §16). A unique reading
	// counts in the period it occurred in. A gauge's are read a stream at
	// a time as reconciliation reads them (ledger.GaugeReadingsFor), never
	// its whole history: of the streams begun before the period's end,
	// how many, the seq of each one's last reading at or before the
	// period's start (the level it carries in), and how many follow that
	// one before the period's end. A late reading that can change the
	// period is a new stream, a new last reading before the start (a
	// higher seq), or one in the period (one more); one before the start
	// that a later one supersedes changes nothing, nor does a stream's
	// earlier first reading before the start (it may end an older epoch
	// earlier, still before the start). The sums only grow as readings
	// arrive, so no two arrivals cancel out. "v2/" tells this form from the
	// count of every reading before the period's end that older runs kept
	// (without gauge streams both are "0:" and the unique readings' count).
	// A gauge's prior-period adjustments billed in the period (level-seconds
	// of a closed earlier period that a late reading changed) are counted
	// and summed as the usage of counters is: such a reading need not bear
	// on the period's own level, yet its statement bills it.
	// Ledger findings count in the period they are about and in the one
	// they were noted in; conflicts in the period their record occurred in
	// and in the one they were detected in. Dead letters and offset jumps
	// count for every period that had started when they happened, until
	// they are replayed or accepted.
	qFingerprint = `
WITH ` + qTargets + `,
g AS (
  SELECT g.customer, md5(string_agg(format('%s:%s:%s:%s', g.stream_id, g.from_seq, g.to_seq, g.upper_total), ','
                                    ORDER BY g.stream_id, g.from_seq)) AS h
  FROM gaps g JOIN t ON t.customer = g.customer AND t.period_start = g.billed_period GROUP BY 1
), c AS (
  SELECT t.customer, count(*) AS n FROM conflicts c JOIN t ON t.customer = c.customer
   AND ((c.payload->>'occurred_at')::timestamptz >= t.period_start AND (c.payload->>'occurred_at')::timestamptz < t.period_end
        OR c.detected_at >= t.period_start AND c.detected_at < t.period_end)
  GROUP BY 1
), f AS (
  SELECT f.customer, count(*) AS n FROM findings f JOIN t ON t.customer = f.customer
   AND (t.period_start = f.period_start OR f.created_at >= t.period_start AND f.created_at < t.period_end)
  GROUP BY 1
), l AS (
  SELECT r.customer, count(*) AS n FROM records r JOIN t ON t.customer = r.customer AND r.prior_period = t.period_start GROUP BY 1
), ga AS (
  SELECT a.customer, count(*) || ':' || trim_scale(sum(a.unit_seconds)) AS h
  FROM gauge_adjustments a JOIN t ON t.customer = a.customer AND a.period_start = t.period_start GROUP BY 1
), pending AS MATERIALIZED (
  SELECT d.id, d.key, d.created_at FROM dead_letters d
  WHERE d.replayed_at IS NULL
    AND NOT EXISTS (SELECT 1 FROM reconciliation_acceptances a WHERE a.kind = 'dead_letter' AND a.id = d.id)
), d AS (
  SELECT t.customer, md5(string_agg(p.id::text, ',' ORDER BY p.id)) AS h
  FROM pending p JOIN t ON p.key = convert_to(t.customer, 'UTF8') AND p.created_at >= t.period_start GROUP BY 1
), u AS MATERIALIZED (
  SELECT p.id, p.created_at FROM pending p
  WHERE p.key IS NULL OR NOT EXISTS (SELECT 1 FROM customers cu WHERE convert_to(cu.id, 'UTF8') = p.key)
), j AS MATERIALIZED (
  SELECT j.id, j.detected_at FROM ingest_offset_jumps j
  WHERE NOT EXISTS (SELECT 1 FROM reconciliation_acceptances a WHERE a.kind = 'offset_jump' AND a.id = j.id)
)
SELECT t.customer, coalesce(g.h, ''), coalesce(c.n, 0), coalesce(f.n, 0), coalesce(l.n, 0), coalesce(d.h, ''),
       coalesce((SELECT md5(string_agg(u.id::text, ',' ORDER BY u.id)) FROM u WHERE u.created_at >= t.period_start), ''),
       coalesce((SELECT md5(string_agg(j.id::text, ',' ORDER BY j.id)) FROM j WHERE j.detected_at >= t.period_start), ''),
       (SELECT CASE WHEN kg.n + ku.n = 0 THEN '' WHEN kg.n = 0 THEN '0:' || ku.n ELSE 'v2/' || kg.n || '/' || kg.carried || '/' || kg.held || ':' || ku.n END
        FROM (SELECT count(*) AS n, coalesce(sum(c.seq), 0) AS carried, coalesce(sum(h.n), 0) AS held
              FROM gauge_streams gs
              CROSS JOIN LATERAL (SELECT seq, occurred_at FROM gauge_readings WHERE stream_id = gs.stream_id ORDER BY seq LIMIT 1) f
              CROSS JOIN LATERAL (SELECT coalesce((SELECT seq FROM gauge_readings WHERE stream_id = gs.stream_id AND occurred_at <= t.period_start
                                                   ORDER BY seq DESC LIMIT 1), 0) AS seq) c
              CROSS JOIN LATERAL (SELECT count(*) AS n FROM gauge_readings
                                  WHERE stream_id = gs.stream_id AND seq > c.seq AND occurred_at < t.period_end) h
              WHERE gs.customer = t.customer AND f.occurred_at < t.period_end) kg,
             (SELECT count(*) AS n FROM stream_periods sp
              JOIN unique_readings r ON r.stream_id = sp.stream_id AND r.seq BETWEEN sp.min_seq AND sp.max_seq
                                    AND r.period_start = sp.period_start
              WHERE sp.customer = t.customer AND sp.period_start = t.period_start) ku),
       coalesce(ga.h, '')
FROM t LEFT JOIN g USING (customer) LEFT JOIN c USING (customer) LEFT JOIN f USING (customer)
LEFT JOIN l USING (customer) LEFT JOIN d USING (customer) LEFT JOIN ga USING (customer)`
)

// Acceptances of losses.
const (
	// Whether dead letter $1 exists and was replayed.
	qDeadLetterReplayed = `SELECT true, replayed_at IS NOT NULL FROM dead_letters WHERE id = $1`
	// Whether offset jump $1 exists (a jump is never replayed).
	qOffsetJumpExists = `SELECT true, false FROM ingest_offset_jumps WHERE id = $1`

	qAcceptanceInsert = `
INSERT INTO reconciliation_acceptances (kind, id, actor, reason, accepted_at) VALUES ($1, $2, $3, $4, $5)
ON CONFLICT (kind, id) DO NOTHING`
)
