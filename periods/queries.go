package periods

// The package's SQL, in one place: every statement a named constant, every
// value a bind parameter. Amounts come out as NUMERIC, scanned straight into
// decimals.

// The customers table is written here only: by SetCalendar and by
// QueueCreateCustomers (the ledger's create-on-first-usage).
const (
	qSelectCustomer = `SELECT schedule, created_at FROM customers WHERE id = $1`

	qSelectCustomerForUpdate = qSelectCustomer + ` FOR UPDATE`

	// A customer created by SetCalendar: its calendar applies from the beginning.
	qInsertCustomer = `
INSERT INTO customers (id, schedule, created_at, updated_at)
VALUES ($1, $2, $3, $3)
ON CONFLICT (id) DO NOTHING
RETURNING created_at`

	qUpdateSchedule = `UPDATE customers SET schedule = $2, updated_at = $3 WHERE id = $1`

	// Sorted ids, so concurrent batches lock new rows in one order.
	qInsertDefaultCustomers = `
INSERT INTO customers (id, schedule)
SELECT id, $2::jsonb FROM unnest($1::text[]) AS id
ORDER BY id
ON CONFLICT (id) DO NOTHING`
)

const (
	qSelectSchedule = `SELECT schedule FROM customers WHERE id = $1`

	// The customer lock (see CustomerLockSpace), exclusive, until the
	// transaction ends: $1 the key space, $2 the customer, $3 the buckets.
	qLockCustomer = `SELECT pg_advisory_xact_lock($1::int, abs(hashtext($2::text) % $3::int))`

	qSelectStatement = `SELECT statement FROM period_closes WHERE customer = $1 AND period_start = $2`

	// The close record, with the statement it froze.
	qInsertClose = `
INSERT INTO period_closes (customer, period_start, period_end, closed_at, statement, forced, reason, actor, reconciliation_id)
VALUES (@customer, @period_start, @period_end, @closed_at, @statement, @forced, @reason, @actor, @reconciliation_id)`

	// Per period of the customer with usage (counter rollups, gauge days,
	// gauge prior-period adjustments, unique counts) or a close record:
	// each counter meter's billed total (meters and totals, in meter
	// order), whether it is closed, the gauges with a bucket in it and
	// those of them whose level carried out of its last bucket (the
	// level it leaves to the periods after) is not 0, newest first.
	qListPeriods = `
SELECT period_start,
       coalesce(array_agg(meter ORDER BY meter) FILTER (WHERE meter IS NOT NULL), '{}'),
       coalesce(array_agg(q::text ORDER BY meter) FILTER (WHERE meter IS NOT NULL), '{}'),
       bool_or(closed),
       coalesce(array_agg(gauge ORDER BY gauge) FILTER (WHERE gauge IS NOT NULL), '{}'),
       coalesce(array_agg(gauge ORDER BY gauge) FILTER (WHERE held), '{}')
FROM (
  SELECT period_start, meter, trim_scale(sum(quantity)) AS q, false AS closed, NULL::text AS gauge, false AS held
  FROM rollups WHERE customer = $1 GROUP BY period_start, meter
  UNION ALL
  SELECT period_start, NULL, NULL::numeric, true, NULL, false FROM period_closes WHERE customer = $1
  UNION ALL
  (SELECT DISTINCT ON (meter, period_start) period_start, NULL, NULL::numeric, false, meter, level_out <> 0
   FROM gauge_days WHERE customer = $1 ORDER BY meter, period_start, day_start DESC)
  UNION ALL
  SELECT DISTINCT period_start, NULL, NULL::numeric, false, NULL, false FROM gauge_adjustments WHERE customer = $1
  UNION ALL
  SELECT DISTINCT period_start, NULL, NULL::numeric, false, NULL, false FROM unique_counts WHERE customer = $1
) s GROUP BY 1 ORDER BY 1 DESC`
)

const (
	// Per meter: usage, prior-period adjustments, manual adjustments, and
	// the rollups' total for the cross-check. A manual adjustment dated in
	// a closed period (prior_period set) is a prior-period adjustment, as
	// late usage is (docs/design.md §4).
	qStatementLines = `
WITH src AS (
  SELECT meter,
         CASE WHEN prior_period IS NULL THEN billed ELSE 0 END AS usage,
         CASE WHEN prior_period IS NULL THEN 0 ELSE billed END AS prior,
         0::numeric AS adj
  FROM ledger_period_records(ARRAY[$1::text], ARRAY[$2::timestamptz])
  UNION ALL
  SELECT meter,
         CASE WHEN kind = 'reattribution' THEN amount ELSE 0 END,
         CASE WHEN kind = 'adjustment' AND prior_period IS NOT NULL THEN amount ELSE 0 END,
         CASE WHEN kind = 'adjustment' AND prior_period IS NULL THEN amount ELSE 0 END
  FROM entries WHERE customer = $1 AND period_start = $2
), lines AS (
  SELECT meter, sum(usage) AS usage, sum(prior) AS prior, sum(adj) AS adj FROM src GROUP BY meter
), rolled AS (
  SELECT meter, sum(quantity) AS q FROM rollups WHERE customer = $1 AND period_start = $2 GROUP BY meter
)
SELECT meter, trim_scale(coalesce(l.usage, 0)), trim_scale(coalesce(l.prior, 0)),
       trim_scale(coalesce(l.adj, 0)), trim_scale(coalesce(r.q, 0))
FROM lines l FULL JOIN rolled r USING (meter)
ORDER BY meter`

	// The same columns from the rollups (index-only, see rollups_usage):
	// usage is the billed total less the parts kept apart, which are rare
	// rows read by their own indexes (records_prior, entries_period).
	qLiveStatementLines = `
WITH rolled AS (
  SELECT meter, sum(quantity) AS q FROM rollups WHERE customer = $1 AND period_start = $2 GROUP BY meter
), prior AS (
  SELECT meter, sum(q) AS q FROM (
    SELECT meter, billed AS q FROM records
    WHERE customer = $1 AND period_start = $2 AND prior_period IS NOT NULL
    UNION ALL
    SELECT meter, amount FROM entries
    WHERE customer = $1 AND period_start = $2 AND kind = 'adjustment' AND prior_period IS NOT NULL
  ) p GROUP BY meter
), adj AS (
  SELECT meter, sum(amount) AS q FROM entries
  WHERE customer = $1 AND period_start = $2 AND kind = 'adjustment' AND prior_period IS NULL GROUP BY meter
)
SELECT meter, trim_scale(coalesce(r.q, 0) - coalesce(p.q, 0) - coalesce(a.q, 0)),
       trim_scale(coalesce(p.q, 0)), trim_scale(coalesce(a.q, 0)), trim_scale(coalesce(r.q, 0))
FROM rolled r FULL JOIN prior p USING (meter) FULL JOIN adj a USING (meter)
ORDER BY meter`

	// What the period absorbed of closed ones, per closed period and
	// meter: a counter's late usage and manual adjustments dated there,
	// and a gauge's level-seconds that a late reading changed there
	// (gauge_adjustments).
	qStatementAbsorbed = `
SELECT prior_period, meter, trim_scale(sum(q)) FROM (
  SELECT prior_period, meter, billed AS q
  FROM records WHERE customer = $1 AND period_start = $2 AND prior_period IS NOT NULL
  UNION ALL
  SELECT prior_period, meter, amount
  FROM entries WHERE customer = $1 AND period_start = $2 AND kind = 'adjustment' AND prior_period IS NOT NULL
  UNION ALL
  SELECT prior_period, meter, unit_seconds
  FROM gauge_adjustments WHERE customer = $1 AND period_start = $2
) a GROUP BY 1, 2 ORDER BY 1, 2`
)
