package admission

// The package's SQL, in one place. Every statement is a constant; values are
// always bind parameters. Times are parameters too (Config.Now).

// qGenericPlans makes the statements of a batch's transaction use their
// generic plans, planned once per connection, instead of a plan made again
// at every execution for the arrays they are given.
const qGenericPlans = `SET LOCAL plan_cache_mode = force_generic_plan`

// qGenericKeyPlans is qGenericPlans for the release batch, and keeps
// sequential scans out of its plans: every statement there finds its rows
// by key (grant ids, holders, and those grants' budget rows and draws),
// but a plan made while a table was small scans it whole, and a generic
// plan stays in the connection's cache as the table grows. In the
// admission benchmark, on a new ledger, the look-up of the reported
// grants scanned admission_grants whole, at 8,000 rows by the end of a
// run (docs/performance.md, "Where a tight grant's time goes").
const qGenericKeyPlans = `SELECT set_config('plan_cache_mode', 'force_generic_plan', true), set_config('enable_seqscan', 'off', true)`

// qCustomPlans plans the statements after it at every execution, for the
// tables as they are then: for the rare statements whose right plan
// depends on how many rows there are. Planned once while admission_grants
// was empty, the statement that adopts the live grants of a pool's or the
// global budget at a rule change read every live grant again for each
// live grant, and with 50,000 grants ran for more than ten minutes
// holding its meter's lock (docs/performance.md, "The hot key").
const qCustomPlans = `SET LOCAL plan_cache_mode = force_custom_plan`

const qHolderGeneration = `SELECT generation FROM admission_holders WHERE holder = @holder FOR SHARE`

const qFreeBudget = `
UPDATE admission_budgets SET consumed = consumed - @delta::numeric, updated_at = @now
WHERE customer = @customer AND meter = @meter AND period_start = @period_start`

// qLockReleaseBudgetRow locks the customer's budget row of a grant when a
// release of spent frees capacity (spent <> amount; amount never changes),
// else nothing.
const qLockReleaseBudgetRow = `
SELECT 1 FROM admission_budgets b
JOIN admission_grants g USING (customer, meter, period_start)
WHERE g.id = @id AND g.amount <> @spent::numeric
FOR UPDATE OF b`

// qLockReleaseDraws locks the pool and global budgets a grant drew from,
// in the fixed order, when a release of spent frees capacity, else nothing.
const qLockReleaseDraws = `
SELECT 1 FROM admission_scope_budgets s
JOIN admission_grant_draws d USING (scope, meter, period_start)
WHERE d.grant_id = @id
  AND EXISTS (SELECT 1 FROM admission_grants g WHERE g.id = @id AND g.amount <> @spent::numeric)
ORDER BY s.scope, s.meter, s.period_start
FOR UPDATE OF s`

// qFreeGrantDraws gives back delta to every pool and global budget the
// grant drew from.
const qFreeGrantDraws = `
UPDATE admission_scope_budgets s SET consumed = s.consumed - @delta::numeric, updated_at = @now
FROM admission_grant_draws d
WHERE d.grant_id = @id AND (s.scope, s.meter, s.period_start) = (d.scope, d.meter, d.period_start)`

// grantColumns end with the earliest end of the pool and global periods
// the grant drew from, or of a rate grant's validity at issue (NULL:
// none): renew never passes it. The scopes drawn are each named once: a
// rate grant counted into a period budget of its scope when the rule
// turned from a rate into a limit (or a pool's did) draws from the
// scope's bucket and its period budget.
const grantColumns = `g.id, g.customer, g.meter, g.period_start, b.period, b.period_end, g.rule_version, g.holder, g.generation,
       g.amount, g.spent, g.issued_at, g.valid_until, g.reclaim_at, g.ended_at, g.end_reason,
       g.draws_customer,
       coalesce((SELECT array_agg(x.scope ORDER BY x.scope) FROM (SELECT d.scope FROM admission_grant_draws d WHERE d.grant_id = g.id
                                                                  UNION
                                                                  SELECT r.scope FROM admission_rate_draws r WHERE r.grant_id = g.id
                                                                  EXCEPT
                                                                  SELECT 'customer:' || g.customer WHERE g.draws_customer) x), '{}'),
       least((SELECT min(s.period_end) FROM admission_grant_draws d JOIN admission_scope_budgets s USING (scope, meter, period_start)
              WHERE d.grant_id = g.id),
             (SELECT min(r.until) FROM admission_rate_draws r WHERE r.grant_id = g.id))`

const grantFrom = `
FROM admission_grants g
JOIN admission_budgets b USING (customer, meter, period_start)`

const qGrant = `SELECT ` + grantColumns + grantFrom + ` WHERE g.id = @id`

const qGrantForUpdate = qGrant + ` FOR UPDATE OF g`

const qRenewGrant = `
UPDATE admission_grants
SET spent = @spent::numeric, valid_until = GREATEST(valid_until, @valid_until),
    reclaim_at = GREATEST(reclaim_at, @reclaim_at)
WHERE id = @id`

// qRecordLateSpent records the final spent of a grant reclaimed without
// one: the grant stays ended by expiry (ended_at unset, reclaim_at is when
// it ended) and no budget moves.
const qRecordLateSpent = `
UPDATE admission_grants SET spent = @spent::numeric
WHERE id = @id AND ended_at IS NULL`

const qReleaseGrant = `
UPDATE admission_grants SET spent = @spent::numeric, ended_at = @now, end_reason = 'released'
WHERE id = @id`

// qCustomerGrants lists a customer's grants, newest first, keyset-paged
// below (@after_issued, @after_id) ('infinity' for the first page), by
// admission_grants_customer; qCustomerGrantsLive the live ones, from the
// unended ones (admission_grants_budget); qCustomerGrantsEnded those ended
// by the clock too (a grant past its reclaim time is ended even before a
// sweep marks it). A statement per state, not one whose state filter is
// "empty or equal": as the generic plan Postgres settles on for a prepared statement,
// that read every grant the customer ever had for a page of live ones.
const (
	qCustomerGrantsWhere = `SELECT ` + grantColumns + grantFrom + `
WHERE g.customer = @customer AND (g.issued_at, g.id) < (@after_issued::timestamptz, @after_id::uuid)`
	qCustomerGrantsOrder = `
ORDER BY g.issued_at DESC, g.id DESC
LIMIT @limit`

	qCustomerGrants      = qCustomerGrantsWhere + qCustomerGrantsOrder
	qCustomerGrantsLive  = qCustomerGrantsWhere + ` AND g.ended_at IS NULL AND g.reclaim_at > @now` + qCustomerGrantsOrder
	qCustomerGrantsEnded = qCustomerGrantsWhere + ` AND (g.ended_at IS NOT NULL OR g.reclaim_at <= @now)` + qCustomerGrantsOrder
)

// inForceAtOrEnd is the instant whose rule version a budget row of the
// period [period_start, period_end) shows: now, or its last instant once it
// ended.
const inForceAtOrEnd = `least(@now::timestamptz, b.period_end - interval '1 microsecond')`

// budgetLimitAndVersion (of a budget row b) and scopeLimitAndVersion (of
// a scope budget row s) are the limit and rule version the row shows, one
// version's both: the version in force's (r), or, when that one has no
// period limit (a rate contract, docs/design.md §17) or none is in force,
// the row's own, the version it was last brought to. A coalesce of each
// showed a rate version's number beside an earlier version's limit.
const (
	budgetLimitAndVersion = `CASE WHEN r."limit" IS NOT NULL THEN r."limit" ELSE b."limit" END,
       CASE WHEN r."limit" IS NOT NULL THEN r.version ELSE b.rule_version END`
	scopeLimitAndVersion = `CASE WHEN r."limit" IS NOT NULL THEN r."limit" ELSE s."limit" END,
       CASE WHEN r."limit" IS NOT NULL THEN r.version ELSE s.rule_version END`
)

// qBudgets lists a customer's budgets with what is live, stranded and
// bypassed, newest period first, with the limit and version of the rule
// in force (budgetLimitAndVersion). A row last brought to another version
// than that exact rule's (the rule changed since the row's last grant)
// shows what bringing it would (qBringCustomerBudgets, qAdoptCustomerGrants):
// at least what its period consumed, and its period's grants that did not
// draw from it as live or stranded. For each meter whose exact rule in
// force has no row brought in the current period (@lo, @hi, @period: no
// grant was issued under it yet), it lists the row its first grant will
// bring, the same way, with the rule's limit and version. Nothing is
// written. It lists @limit budgets (all when NULL) after the budget of
// (@after_start, @after_meter) in that order (from the first when
// @after_start is infinity): the rows of the page are picked before what
// they show is read, not every budget of every period the customer had.
const qBudgets = `
(SELECT b.customer, b.meter, b.period, b.period_start, b.period_end,
        ` + budgetLimitAndVersion + `,
        CASE WHEN k.behind
             THEN GREATEST(b.consumed, (SELECT ` + consumptionHead + usageInCustomerPeriod + consumptionTail + `
                                        FROM (SELECT b.customer, b.meter, b.period_start AS lo, b.period_end AS hi) c))
             ELSE b.consumed END,
        coalesce((SELECT sum(g.amount) FROM admission_grants g
                  WHERE (g.customer, g.meter, g.period_start) = (b.customer, b.meter, b.period_start)
                    AND (g.draws_customer OR k.behind) AND g.ended_at IS NULL AND g.reclaim_at > @now), 0) AS live,
        coalesce((SELECT sum(g.amount - g.spent) FROM admission_grants g
                  WHERE (g.customer, g.meter, g.period_start) = (b.customer, b.meter, b.period_start)
                    AND (g.draws_customer OR k.behind) AND g.ended_at IS NULL AND g.reclaim_at <= @now), 0) AS stranded,
        coalesce((SELECT sum(x.amount) FROM admission_bypasses x
                  WHERE (x.customer, x.meter, x.period_start) = (b.customer, b.meter, b.period_start)), 0) AS bypassed
 FROM (SELECT * FROM admission_budgets b
       WHERE b.customer = @customer AND b."limit" IS NOT NULL
         AND (b.period_start < @after_start OR b.period_start = @after_start AND b.meter > @after_meter)
       ORDER BY b.period_start DESC, b.meter LIMIT @limit) b
 LEFT JOIN LATERAL quota_rule_in_force(b.customer, b.meter, ` + inForceAtOrEnd + `) r ON true
 CROSS JOIN LATERAL (SELECT coalesce(r.admission = 'exact' AND r."limit" IS NOT NULL AND b.rule_version <> r.version, false) AS behind) k)
UNION ALL
(SELECT c.customer, c.meter, @period::text, c.lo, c.hi, r."limit", r.version,
        GREATEST(coalesce((SELECT b.consumed FROM admission_budgets b
                           WHERE (b.customer, b.meter, b.period_start) = (c.customer, c.meter, c.lo)), 0),
                 ` + consumptionHead + usageInCustomerPeriod + consumptionTail + `),
        d.live, d.stranded,
        coalesce((SELECT sum(x.amount) FROM admission_bypasses x
                  WHERE (x.customer, x.meter, x.period_start) = (c.customer, c.meter, c.lo)), 0)
 FROM (SELECT DISTINCT q.customer, q.meter, @lo::timestamptz AS lo, @hi::timestamptz AS hi
       FROM quota_rules q WHERE q.customer = @customer) c
 CROSS JOIN LATERAL quota_rule_in_force(c.customer, c.meter, @now) r
 CROSS JOIN LATERAL (SELECT coalesce(sum(g.amount) FILTER (WHERE g.reclaim_at > @now), 0) AS live,
                            coalesce(sum(g.amount - g.spent) FILTER (WHERE g.reclaim_at <= @now), 0) AS stranded
                     FROM admission_grants g
                     WHERE (g.customer, g.meter, g.period_start) = (c.customer, c.meter, c.lo) AND g.ended_at IS NULL) d
 WHERE r.admission = 'exact' AND r."limit" IS NOT NULL
   AND (c.lo < @after_start OR c.lo = @after_start AND c.meter > @after_meter)
   AND NOT EXISTS (SELECT 1 FROM admission_budgets b
                   WHERE (b.customer, b.meter, b.period_start) = (c.customer, c.meter, c.lo) AND b."limit" IS NOT NULL))
ORDER BY 4 DESC, 2 LIMIT @limit`

const qInsertBypass = `
INSERT INTO admission_bypasses (holder, report_id, customer, meter, period_start, period, rule_version, generation,
                                amount, admissions, first_at, last_at, reported_at)
VALUES (@holder, @report_id, @customer, @meter, @period_start, @period, @rule_version, @generation,
        @amount::numeric, @admissions, @first_at, @last_at, @now)`

// qStoredBypassReport is what a holder stored under a report id.
const qStoredBypassReport = `
SELECT customer, meter, period_start, amount, admissions, first_at, last_at
FROM admission_bypasses WHERE holder = @holder AND report_id = @report_id`

// qGrantGauges reads the grants of open periods: live ones, and those
// that ended without a final report (expired; their unspent part is
// stranded until the period ends). Budgets of open periods are few (one
// per exact rule), and each is looked up by admission_grants_budget.
const qGrantGauges = `
SELECT count(*) FILTER (WHERE g.reclaim_at > @now),
       coalesce(sum(g.amount) FILTER (WHERE g.reclaim_at > @now), 0),
       count(*) FILTER (WHERE g.reclaim_at <= @now),
       coalesce(sum(g.amount - g.spent) FILTER (WHERE g.reclaim_at <= @now), 0)
FROM admission_budgets b
JOIN admission_grants g ON (g.customer, g.meter, g.period_start) = (b.customer, b.meter, b.period_start)
WHERE b.period_end > @now AND g.ended_at IS NULL`

// qLockHolder locks one holder's row (in the holder-first order issue,
// renew and release take) and reads its generation.
const qLockHolder = `SELECT generation FROM admission_holders WHERE holder = @holder FOR UPDATE`

// qRetireGrants ends a holder's live grants now by the clock: their
// reclaim time becomes now (never before issue), so they end as expired
// grants do and count as fully spent; nothing is handed back.
const qRetireGrants = `
UPDATE admission_grants
SET valid_until = GREATEST(issued_at, LEAST(valid_until, @now)),
    reclaim_at = GREATEST(issued_at, LEAST(valid_until, @now))
WHERE holder = @holder AND ended_at IS NULL AND reclaim_at > @now`

// qResetHolder forgets a holder's generation: its next grant may come
// from any generation within MaxGenerationStep of 1.
const qResetHolder = `UPDATE admission_holders SET generation = 1, seen_at = @now WHERE holder = @holder`

// Reports in batches (report_batch.go): the same locks as one release, in
// the same fixed order, for every report of the batch at once.

// qShareHolders locks the batch's holder rows shared, sorted, and reads
// their newest generation.
const qShareHolders = `
SELECT holder, generation FROM admission_holders
WHERE holder = ANY(@holders::text[])
ORDER BY holder
FOR SHARE`

// qLockFreedBudgetRows locks, sorted, the customer budget rows of the
// batch's releases that free capacity (spent <> amount).
const qLockFreedBudgetRows = `
SELECT 1 FROM admission_budgets b
JOIN admission_grants g USING (customer, meter, period_start)
JOIN unnest(@free_ids::uuid[], @free_spent::text[]::numeric[]) r(id, spent) ON g.id = r.id
WHERE g.amount <> r.spent
ORDER BY b.customer, b.meter, b.period_start
FOR UPDATE OF b`

// qLockFreedScopeRows locks, sorted, the pool and global rows the batch's
// releases that free capacity drew from.
const qLockFreedScopeRows = `
SELECT 1 FROM admission_scope_budgets s
JOIN admission_grant_draws d USING (scope, meter, period_start)
JOIN admission_grants g ON g.id = d.grant_id
JOIN unnest(@free_ids::uuid[], @free_spent::text[]::numeric[]) r(id, spent) ON g.id = r.id
WHERE g.amount <> r.spent
ORDER BY s.scope, s.meter, s.period_start
FOR UPDATE OF s`

// qGrantsForUpdate locks the batch's grants, sorted, and reads them.
const qGrantsForUpdate = `SELECT ` + grantColumns + grantFrom + `
WHERE g.id = ANY(@ids::uuid[])
ORDER BY g.id
FOR UPDATE OF g`

// qWriteReportedGrants writes every reported grant's state once its
// reports are decided: spent, validity, and the end of the released ones.
const qWriteReportedGrants = `
UPDATE admission_grants g
SET spent = r.spent, valid_until = r.valid_until, reclaim_at = r.reclaim_at,
    ended_at = CASE WHEN r.released THEN @now::timestamptz ELSE g.ended_at END,
    end_reason = CASE WHEN r.released THEN 'released' ELSE g.end_reason END
FROM unnest(@ids::uuid[], @spent::text[]::numeric[], @valid_until::timestamptz[], @reclaim_at::timestamptz[], @released::bool[])
     r(id, spent, valid_until, reclaim_at, released)
WHERE g.id = r.id`

// qFreeBudgets gives back each customer budget row's summed delta.
const qFreeBudgets = `
UPDATE admission_budgets b SET consumed = b.consumed - r.delta, updated_at = @now
FROM unnest(@customers::text[], @meters::text[], @starts::timestamptz[], @deltas::text[]::numeric[]) r(customer, meter, period_start, delta)
WHERE (b.customer, b.meter, b.period_start) = (r.customer, r.meter, r.period_start)`

// qFreeScopeDraws gives back to every pool and global budget the sum of
// what the released grants that drew from it free.
const qFreeScopeDraws = `
UPDATE admission_scope_budgets s SET consumed = s.consumed - f.delta, updated_at = @now
FROM (SELECT d.scope, d.meter, d.period_start, sum(r.delta) AS delta
      FROM admission_grant_draws d
      JOIN unnest(@ids::uuid[], @deltas::text[]::numeric[]) r(id, delta) ON d.grant_id = r.id
      GROUP BY d.scope, d.meter, d.period_start) f
WHERE (s.scope, s.meter, s.period_start) = (f.scope, f.meter, f.period_start)`
