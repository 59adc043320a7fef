package admission

// The SQL of issuing from several budgets (docs/design.md §13). Every
// statement is a constant; values are always bind parameters.

// qApplicableScopes is, for a customer and meter at @now, the pool and
// global scopes whose rule in force is exact, with that rule's limit and
// version, sorted by scope (the lock order).
const qApplicableScopes = `
SELECT s.scope, r."limit"::text, r.version
FROM (SELECT 'global' AS scope
      UNION
      SELECT 'pool:' || m.pool FROM pool_members m
      WHERE m.customer = @customer AND m.joined_at <= @now AND (m.left_at IS NULL OR m.left_at > @now)) s
CROSS JOIN LATERAL (SELECT q."limit", q.version, q.admission FROM quota_scope_rules q
                    WHERE q.scope = s.scope AND q.meter = @meter AND q.effective_at <= @now
                    ORDER BY q.effective_at DESC, q.version DESC LIMIT 1) r
WHERE r.admission = 'exact'
ORDER BY s.scope`

// consumptionOf is what customers consumed in their current periods of a
// meter, from their grants (Σ amount not released + Σ spent released):
// what a pool or global budget counts for members it did not see issued.
const consumptionOf = `
coalesce((SELECT sum(CASE WHEN g.ended_at IS NULL THEN g.amount ELSE g.spent END)
          FROM admission_grants g JOIN admission_budgets b USING (customer, meter, period_start)
          WHERE g.meter = @meter AND b.period_start <= @now AND b.period_end > @now AND `

// The issue batch: sent in one round trip and run as one implicit
// transaction (one Sync), or inside the caller's transaction.

// qLockHolder locks the holder's row first (when it exists), the order
// renew and release follow. The row is written by qIssueDecide only when
// the grant is issued: a refused request changes nothing.
const qLockHolder = `SELECT generation FROM admission_holders WHERE holder = @holder FOR UPDATE`

// qEnsureCustomerBudget creates the customer's budget row of the period if
// needed, without locking an existing row. Its limit is NULL when the
// customer has no exact rule (the row then only carries the period).
const qEnsureCustomerBudget = `
INSERT INTO admission_budgets (customer, meter, period_start, period_end, period, "limit", rule_version, updated_at)
VALUES (@customer, @meter, @cust_start, @cust_end, @cust_period, @cust_limit::numeric, @cust_version, @now)
ON CONFLICT DO NOTHING`

// qEnsureScopeBudgets creates missing pool and global budget rows of the
// period. A new row starts at what its members already consumed this period
// (every customer, for global): a budget created mid-period never hands out
// a fresh allowance.
const qEnsureScopeBudgets = `
INSERT INTO admission_scope_budgets (scope, meter, period_start, period_end, period, "limit", rule_version, consumed, updated_at)
SELECT w.scope, @meter, w.period_start, w.period_end, w.period, w.lim, w.version,
       ` + consumptionOf + `(w.scope = 'global' OR g.customer IN (
                SELECT m.customer FROM pool_members m
                WHERE 'pool:' || m.pool = w.scope AND m.joined_at <= @now AND (m.left_at IS NULL OR m.left_at > @now)))), 0),
       @now
FROM unnest(@scopes::text[], @starts::timestamptz[], @ends::timestamptz[], @names::text[], @limits::numeric[], @versions::bigint[])
     AS w(scope, period_start, period_end, period, lim, version)
WHERE NOT EXISTS (SELECT 1 FROM admission_scope_budgets x
                  WHERE x.scope = w.scope AND x.meter = @meter AND x.period_start = w.period_start)
ON CONFLICT DO NOTHING`

// qLockCustomerBudget locks the customer's budget row: always first.
const qLockCustomerBudget = `
SELECT 1 FROM admission_budgets
WHERE customer = @customer AND meter = @meter AND period_start = @cust_start
FOR UPDATE`

// qLockScopeBudgets locks the scope rows in the fixed order, after the
// customer's row.
const qLockScopeBudgets = `
SELECT 1 FROM admission_scope_budgets s
WHERE s.meter = @meter AND (s.scope, s.period_start) IN (SELECT * FROM unnest(@scopes::text[], @starts::timestamptz[]))
ORDER BY s.scope, s.period_start
FOR UPDATE`

// qIssueDecide decides and, when every budget has room, takes the amount
// from all of them and stores the grant with its draws, in one statement.
// It runs after the locks, so its snapshot sees every budget's consumed as
// of now and the rules and memberships committed before the locks were
// granted. It answers one row per budget with its available and, for a
// budget that refused, the earliest reclaim of its live grants; plus the
// amount granted (NULL when refused), the holder's newest generation, and
// whether the budgets drawn are still exactly those that apply (a rule or
// membership change committed meanwhile makes the caller start over).
const qIssueDecide = `
WITH w AS (SELECT * FROM unnest(@scopes::text[], @starts::timestamptz[]) AS w(scope, period_start)),
cr AS (SELECT q."limit", q.version FROM quota_rules q
       WHERE q.customer = @customer AND q.meter = @meter AND q.effective_at <= @now
       ORDER BY q.version DESC LIMIT 1),
applicable AS (
    SELECT s.scope
    FROM (SELECT 'global' AS scope
          UNION
          SELECT 'pool:' || m.pool FROM pool_members m
          WHERE m.customer = @customer AND m.joined_at <= @now AND (m.left_at IS NULL OR m.left_at > @now)) s
    CROSS JOIN LATERAL (SELECT q.admission FROM quota_scope_rules q
                        WHERE q.scope = s.scope AND q.meter = @meter AND q.effective_at <= @now
                        ORDER BY q.effective_at DESC, q.version DESC LIMIT 1) r
    WHERE r.admission = 'exact'),
cur AS (
    SELECT 0 AS ord, 'customer:' || @customer::text AS scope, b.period_start, b.period_end, b.consumed,
           (SELECT "limit" FROM cr) AS lim, (SELECT version FROM cr) AS version
    FROM admission_budgets b
    WHERE @draws_customer AND b.customer = @customer AND b.meter = @meter AND b.period_start = @cust_start
    UNION ALL
    SELECT 1, s.scope, s.period_start, s.period_end, s.consumed, r."limit", r.version
    FROM admission_scope_budgets s JOIN w USING (scope, period_start)
    LEFT JOIN LATERAL (SELECT q."limit", q.version FROM quota_scope_rules q
                       WHERE q.scope = s.scope AND q.meter = @meter AND q.effective_at <= @now
                       ORDER BY q.effective_at DESC, q.version DESC LIMIT 1) r ON true
    WHERE s.meter = @meter),
calc AS (SELECT *, greatest(lim - consumed, 0) AS available FROM cur),
d AS (
    SELECT coalesce((SELECT generation FROM admission_holders WHERE holder = @holder), 0) AS current_gen,
           (SELECT count(*) FROM cur) = cardinality(@scopes::text[]) + CASE WHEN @draws_customer THEN 1 ELSE 0 END AS complete,
           CASE WHEN @subset THEN NOT EXISTS (SELECT 1 FROM w WHERE w.scope NOT IN (SELECT scope FROM applicable))
                ELSE (SELECT coalesce(array_agg(scope ORDER BY scope), '{}') FROM applicable)
                   = (SELECT coalesce(array_agg(scope ORDER BY scope), '{}') FROM w) END AS same,
           (SELECT min(available) FROM calc) AS avail),
amt AS (
    SELECT CASE WHEN d.current_gen <= @generation AND d.complete AND d.same THEN
                CASE WHEN d.avail IS NULL OR d.avail >= @amount::numeric THEN @amount::numeric
                     WHEN @min_amount::numeric IS NOT NULL AND d.avail >= @min_amount::numeric THEN d.avail END
           END AS amount
    FROM d),
h AS (
    INSERT INTO admission_holders AS h (holder, generation, seen_at)
    SELECT @holder, @generation, @now FROM amt WHERE amt.amount IS NOT NULL
    ON CONFLICT (holder) DO UPDATE
    SET generation = GREATEST(h.generation, EXCLUDED.generation), seen_at = EXCLUDED.seen_at),
uc AS (
    UPDATE admission_budgets b
    SET consumed = b.consumed + amt.amount, "limit" = (SELECT "limit" FROM cr),
        rule_version = coalesce((SELECT version FROM cr), b.rule_version), updated_at = @now
    FROM amt
    WHERE amt.amount IS NOT NULL AND @draws_customer
      AND b.customer = @customer AND b.meter = @meter AND b.period_start = @cust_start),
us AS (
    UPDATE admission_scope_budgets s
    SET consumed = s.consumed + amt.amount, "limit" = coalesce(c.lim, s."limit"),
        rule_version = coalesce(c.version, s.rule_version), updated_at = @now
    FROM amt, cur c
    WHERE amt.amount IS NOT NULL AND c.ord = 1
      AND s.scope = c.scope AND s.meter = @meter AND s.period_start = c.period_start),
g AS (
    INSERT INTO admission_grants (id, customer, meter, period_start, rule_version, holder, generation, amount,
                                  issued_at, valid_until, reclaim_at, draws_customer)
    SELECT @id, @customer, @meter, @cust_start, coalesce((SELECT version FROM cr), 0), @holder, @generation, amt.amount,
           @now, @valid_until, @reclaim_at, @draws_customer
    FROM amt WHERE amt.amount IS NOT NULL
    RETURNING id),
dr AS (
    INSERT INTO admission_grant_draws (grant_id, scope, meter, period_start)
    SELECT g.id, w.scope, @meter, w.period_start FROM g CROSS JOIN w)
SELECT c.scope, c.available::text, c.period_end,
       CASE WHEN amt.amount IS NULL AND c.available < coalesce(@min_amount::numeric, @amount::numeric) THEN
            CASE WHEN c.ord = 0
                 THEN (SELECT min(x.reclaim_at) FROM admission_grants x
                       WHERE x.customer = @customer AND x.meter = @meter AND x.period_start = @cust_start
                         AND x.draws_customer AND x.ended_at IS NULL AND x.reclaim_at > @now)
                 ELSE (SELECT min(x.reclaim_at) FROM admission_grant_draws y JOIN admission_grants x ON x.id = y.grant_id
                       WHERE y.scope = c.scope AND y.meter = @meter AND y.period_start = c.period_start
                         AND x.ended_at IS NULL AND x.reclaim_at > @now)
            END
       END,
       amt.amount::text, d.current_gen, d.complete AND d.same
FROM d CROSS JOIN amt LEFT JOIN calc c ON true
ORDER BY c.ord, c.scope`

// qLockCustomersBudgets locks the current budget rows of @customers, in
// the customer-row order issuing uses.
const qLockCustomersBudgets = `
SELECT 1 FROM admission_budgets
WHERE customer = ANY(@customers::text[]) AND period_start <= @now AND period_end > @now
ORDER BY customer, meter, period_start
FOR UPDATE`

// qLockScopeBudgetsOf locks a scope's budgets of the current period.
const qLockScopeBudgetsOf = `
SELECT 1 FROM admission_scope_budgets
WHERE scope = @scope AND period_start <= @now AND period_end > @now
ORDER BY scope, meter, period_start
FOR UPDATE`

// qBringIn adds to each of a pool's current budgets what @customers (who
// just joined) consumed of its meter in their current periods.
const qBringIn = `
UPDATE admission_scope_budgets s
SET consumed = s.consumed + ` + consumptionOfMeter + `g.customer = ANY(@customers::text[])), 0),
    updated_at = @now
WHERE s.scope = @scope AND s.period_start <= @now AND s.period_end > @now`

// consumptionOfMeter is consumptionOf for the meter of the row s.
const consumptionOfMeter = `
coalesce((SELECT sum(CASE WHEN g.ended_at IS NULL THEN g.amount ELSE g.spent END)
          FROM admission_grants g JOIN admission_budgets b USING (customer, meter, period_start)
          WHERE g.meter = s.meter AND b.period_start <= @now AND b.period_end > @now AND `

// qScopeBudgets lists a scope's budgets with what is live and stranded.
const qScopeBudgets = `
SELECT s.scope, s.meter, s.period, s.period_start, s.period_end, s."limit"::text, s.rule_version, s.consumed::text,
       coalesce((SELECT sum(g.amount) FROM admission_grant_draws d JOIN admission_grants g ON g.id = d.grant_id
                 WHERE (d.scope, d.meter, d.period_start) = (s.scope, s.meter, s.period_start)
                   AND g.ended_at IS NULL AND g.reclaim_at > @now), 0)::text,
       coalesce((SELECT sum(g.amount - g.spent) FROM admission_grant_draws d JOIN admission_grants g ON g.id = d.grant_id
                 WHERE (d.scope, d.meter, d.period_start) = (s.scope, s.meter, s.period_start)
                   AND (g.ended_at IS NOT NULL OR g.reclaim_at <= @now)), 0)::text
FROM admission_scope_budgets s
WHERE s.scope = @scope
ORDER BY s.period_start DESC, s.meter`
