package admission

// The SQL of issuing from several budgets (docs/design.md §13). Every
// statement is a constant; values are always bind parameters.

// qApplicableScopes is, for a customer and meter at @now, the pool and
// global scopes whose rule in force is exact, with that rule's limit and
// version, sorted by scope (the lock order).
const qApplicableScopes = `
SELECT s.scope, r."limit", r.version
FROM (SELECT 'global' AS scope
      UNION
      SELECT 'pool:' || m.pool FROM pool_members m
      WHERE m.customer = @customer AND m.joined_at <= @now AND (m.left_at IS NULL OR m.left_at > @now)) s
CROSS JOIN LATERAL (SELECT q."limit", q.version, q.admission FROM quota_scope_rules q
                    WHERE q.scope = s.scope AND q.meter = @meter AND q.effective_at <= @now
                    ORDER BY q.effective_at DESC, q.version DESC LIMIT 1) r
WHERE r.admission = 'exact'
ORDER BY s.scope`

// The issue of a batch of requests: two round trips whatever its size,
// one transaction. The first batch locks and reads, the second writes.

// qLockHolders locks the rows of the batch's holders that exist, sorted
// (renew and release lock a holder row first too), and reads their newest
// generation. A holder row is written only when a grant is issued to it: a
// refused request changes nothing.
const qLockHolders = `
SELECT holder, generation FROM admission_holders
WHERE holder = ANY(@holders::text[])
ORDER BY holder
FOR UPDATE`

// qEnsureCustomerBudgets creates the customers' budget rows of the period
// if needed (those this Store has not seen committed), without locking
// existing rows. Their limit is NULL when the
// customer has no exact rule (the row then only carries the period).
// qLockNewCustomersShared takes locks.PoolMembership shared for the
// customers whose budget rows the batch creates, sorted: a concurrent
// join waits for this grant to commit, or this grant waits for the join
// and then reads the new membership.
const qLockNewCustomersShared = `
SELECT pg_advisory_xact_lock_shared(@membership_lock::int, hashtext(c))
FROM (SELECT DISTINCT unnest(@ec_customers::text[]) AS c ORDER BY 1) x`

const qEnsureCustomerBudgets = `
INSERT INTO admission_budgets (customer, meter, period_start, period_end, period, "limit", rule_version, updated_at)
SELECT * , @now::timestamptz FROM unnest(@ec_customers::text[], @ec_meters::text[], @ec_starts::timestamptz[],
                      @ec_ends::timestamptz[], @ec_names::text[], @ec_limits::numeric[], @ec_versions::bigint[])
ORDER BY 1, 2, 3
ON CONFLICT DO NOTHING`

// qEnsureScopeBudgets creates missing pool and global budget rows of the
// period. A new row starts at what its members already consumed this period
// (every customer, for global): a budget created mid-period never hands out
// a fresh allowance.
const qEnsureScopeBudgets = `
INSERT INTO admission_scope_budgets (scope, meter, period_start, period_end, period, "limit", rule_version, consumed, updated_at)
SELECT w.scope, w.meter, w.period_start, w.period_end, w.period, w.lim, w.version,
       coalesce((SELECT sum(CASE WHEN g.ended_at IS NULL THEN g.amount ELSE g.spent END)
                 FROM admission_grants g JOIN admission_budgets b USING (customer, meter, period_start)
                 WHERE g.meter = w.meter AND b.period_start <= @now AND b.period_end > @now
                   AND (w.scope = 'global' OR g.customer IN (
                        SELECT m.customer FROM pool_members m
                        WHERE 'pool:' || m.pool = w.scope AND m.joined_at <= @now AND (m.left_at IS NULL OR m.left_at > @now)))), 0),
       @now
FROM unnest(@es_scopes::text[], @es_meters::text[], @es_starts::timestamptz[], @es_ends::timestamptz[], @es_names::text[],
            @es_limits::numeric[], @es_versions::bigint[])
     AS w(scope, meter, period_start, period_end, period, lim, version)
WHERE NOT EXISTS (SELECT 1 FROM admission_scope_budgets x
                  WHERE x.scope = w.scope AND x.meter = w.meter AND x.period_start = w.period_start)
ORDER BY 1, 2, 3
ON CONFLICT DO NOTHING`

// qLockCustomerBudgets locks the customers' rows, sorted: after the
// holders, before any scope row.
const qLockCustomerBudgets = `
SELECT 1 FROM admission_budgets
WHERE (customer, meter, period_start) IN
      (SELECT * FROM unnest(@c_customers::text[], @c_meters::text[], @c_starts::timestamptz[]))
ORDER BY customer, meter, period_start
FOR UPDATE`

// qLockScopeBudgets locks the pool and global rows, sorted, last.
const qLockScopeBudgets = `
SELECT 1 FROM admission_scope_budgets
WHERE (scope, meter, period_start) IN
      (SELECT * FROM unnest(@s_scopes::text[], @s_meters::text[], @s_starts::timestamptz[]))
ORDER BY scope, meter, period_start
FOR UPDATE`

// The state the batch decides on, read after the locks were granted: a
// fresh snapshot per statement, so it sees every budget's consumed as of
// now, and every rule and membership committed before the locks.

// qCustomerState is each customer row's consumed and the customer's rule
// in force (NULL when there is none).
const qCustomerState = `
SELECT b.customer, b.meter, b.period_start, b.consumed, r."limit", r.version, r.admission
FROM admission_budgets b
LEFT JOIN LATERAL (SELECT q."limit", q.version, q.admission FROM quota_rules q
                   WHERE q.customer = b.customer AND q.meter = b.meter AND q.effective_at <= @now
                   ORDER BY q.version DESC LIMIT 1) r ON true
WHERE (b.customer, b.meter, b.period_start) IN
      (SELECT * FROM unnest(@c_customers::text[], @c_meters::text[], @c_starts::timestamptz[]))`

// qScopeState is each scope row's consumed and its rule in force.
const qScopeState = `
SELECT s.scope, s.meter, s.period_start, s.consumed, r."limit", r.version
FROM admission_scope_budgets s
LEFT JOIN LATERAL (SELECT q."limit", q.version FROM quota_scope_rules q
                   WHERE q.scope = s.scope AND q.meter = s.meter AND q.effective_at <= @now
                   ORDER BY q.effective_at DESC, q.version DESC LIMIT 1) r ON true
WHERE (s.scope, s.meter, s.period_start) IN
      (SELECT * FROM unnest(@s_scopes::text[], @s_meters::text[], @s_starts::timestamptz[]))`

// qApplicableNow is, for each (customer, meter) of the batch, the pool and
// global scopes whose rule in force is exact: what its plan must still be.
const qApplicableNow = `
SELECT k.customer, k.meter, s.scope
FROM unnest(@k_customers::text[], @k_meters::text[]) AS k(customer, meter)
CROSS JOIN LATERAL (SELECT 'global' AS scope
                    UNION
                    SELECT 'pool:' || m.pool FROM pool_members m
                    WHERE m.customer = k.customer AND m.joined_at <= @now AND (m.left_at IS NULL OR m.left_at > @now)) s
CROSS JOIN LATERAL (SELECT q.admission FROM quota_scope_rules q
                    WHERE q.scope = s.scope AND q.meter = k.meter AND q.effective_at <= @now
                    ORDER BY q.effective_at DESC, q.version DESC LIMIT 1) r
WHERE r.admission = 'exact'`

// The writes of a batch, set-based.

// qUpsertHolders records new holders and newer generations (seen_at: when
// the holder's newest generation was first issued a grant).
const qUpsertHolders = `
INSERT INTO admission_holders AS h (holder, generation, seen_at)
SELECT holder, max(generation), @now FROM unnest(@h_holders::text[], @h_generations::bigint[]) AS u(holder, generation)
GROUP BY holder ORDER BY holder
ON CONFLICT (holder) DO UPDATE
SET generation = GREATEST(h.generation, EXCLUDED.generation), seen_at = EXCLUDED.seen_at`

const qTakeCustomerBudgets = `
UPDATE admission_budgets b
SET consumed = b.consumed + u.delta, "limit" = u.lim, rule_version = u.version, updated_at = @now
FROM unnest(@u_customers::text[], @u_meters::text[], @u_starts::timestamptz[], @u_deltas::numeric[],
            @u_limits::numeric[], @u_versions::bigint[]) AS u(customer, meter, period_start, delta, lim, version)
WHERE (b.customer, b.meter, b.period_start) = (u.customer, u.meter, u.period_start)`

const qTakeScopeBudgets = `
UPDATE admission_scope_budgets s
SET consumed = s.consumed + u.delta, "limit" = u.lim, rule_version = u.version, updated_at = @now
FROM unnest(@u_scopes::text[], @u_meters::text[], @u_starts::timestamptz[], @u_deltas::numeric[],
            @u_limits::numeric[], @u_versions::bigint[]) AS u(scope, meter, period_start, delta, lim, version)
WHERE (s.scope, s.meter, s.period_start) = (u.scope, u.meter, u.period_start)`

const qInsertGrants = `
INSERT INTO admission_grants (id, customer, meter, period_start, rule_version, holder, generation, amount,
                              issued_at, valid_until, reclaim_at, draws_customer)
SELECT id, customer, meter, period_start, rule_version, holder, generation, amount, @now, valid_until, reclaim_at, draws_customer
FROM unnest(@g_ids::uuid[], @g_customers::text[], @g_meters::text[], @g_starts::timestamptz[], @g_versions::bigint[],
            @g_holders::text[], @g_generations::bigint[], @g_amounts::numeric[], @g_valid_until::timestamptz[],
            @g_reclaim_at::timestamptz[], @g_draws_customer::boolean[])
     AS g(id, customer, meter, period_start, rule_version, holder, generation, amount, valid_until, reclaim_at, draws_customer)`

const qInsertDraws = `
INSERT INTO admission_grant_draws (grant_id, scope, meter, period_start)
SELECT * FROM unnest(@d_ids::uuid[], @d_scopes::text[], @d_meters::text[], @d_starts::timestamptz[])`

// qEarliestReclaims is, for budgets that refused, when their earliest live
// grant is reclaimed (NULL: none live). Read after the batch committed.
const qEarliestReclaims = `
SELECT k.i,
       CASE WHEN k.scope LIKE 'customer:%'
            THEN (SELECT min(x.reclaim_at) FROM admission_grants x
                  WHERE x.customer = substr(k.scope, 10) AND x.meter = k.meter AND x.period_start = k.period_start
                    AND x.draws_customer AND x.ended_at IS NULL AND x.reclaim_at > @now)
            ELSE (SELECT min(x.reclaim_at) FROM admission_grant_draws y JOIN admission_grants x ON x.id = y.grant_id
                  WHERE y.scope = k.scope AND y.meter = k.meter AND y.period_start = k.period_start
                    AND x.ended_at IS NULL AND x.reclaim_at > @now)
       END
FROM unnest(@r_scopes::text[], @r_meters::text[], @r_starts::timestamptz[]) WITH ORDINALITY AS k(scope, meter, period_start, i)`

// qLockJoiningCustomers takes locks.PoolMembership exclusively for the
// joining @customers, sorted (see qLockNewCustomersShared).
const qLockJoiningCustomers = `
SELECT pg_advisory_xact_lock(@membership_lock::int, hashtext(c))
FROM (SELECT DISTINCT unnest(@customers::text[]) AS c ORDER BY 1) x`

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
SELECT s.scope, s.meter, s.period, s.period_start, s.period_end, s."limit", s.rule_version, s.consumed,
       coalesce((SELECT sum(g.amount) FROM admission_grant_draws d JOIN admission_grants g ON g.id = d.grant_id
                 WHERE (d.scope, d.meter, d.period_start) = (s.scope, s.meter, s.period_start)
                   AND g.ended_at IS NULL AND g.reclaim_at > @now), 0),
       coalesce((SELECT sum(g.amount - g.spent) FROM admission_grant_draws d JOIN admission_grants g ON g.id = d.grant_id
                 WHERE (d.scope, d.meter, d.period_start) = (s.scope, s.meter, s.period_start)
                   AND g.ended_at IS NULL AND g.reclaim_at <= @now), 0)
FROM admission_scope_budgets s
WHERE s.scope = @scope
ORDER BY s.period_start DESC, s.meter`
