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
CROSS JOIN LATERAL quota_scope_rule_in_force(s.scope, @meter, @now) r
WHERE r.admission = 'exact' AND r."limit" IS NOT NULL
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
// existing rows. A new row has no limit and rule version 0: it is brought
// to the rule in force (qBringCustomerBudgets) before anything is decided
// on it, and keeps a NULL limit while the customer has no exact rule (the
// row then only carries the period).
// qLockNewCustomersShared takes locks.PoolMembership shared for the
// customers whose budget rows the batch creates, sorted: a concurrent
// join waits for this grant to commit, or this grant waits for the join
// and then reads the new membership.
const qLockNewCustomersShared = `
SELECT pg_advisory_xact_lock_shared(@membership_lock::int, hashtext(c))
FROM (SELECT DISTINCT unnest(@ec_customers::text[]) AS c ORDER BY 1) x`

const qEnsureCustomerBudgets = `
INSERT INTO admission_budgets (customer, meter, period_start, period_end, period, "limit", rule_version, updated_at)
SELECT *, NULL::numeric, 0, @now::timestamptz FROM unnest(@ec_customers::text[], @ec_meters::text[], @ec_starts::timestamptz[],
                      @ec_ends::timestamptz[], @ec_names::text[])
ORDER BY 1, 2, 3
ON CONFLICT DO NOTHING`

// qEnsureScopeBudgets creates missing pool and global budget rows of the
// period, at consumed 0 and rule version 0: qBringScopeBudgets brings each
// to what its period already consumed before anything is decided on it.
const qEnsureScopeBudgets = `
INSERT INTO admission_scope_budgets (scope, meter, period_start, period_end, period, "limit", rule_version, consumed, updated_at)
SELECT w.scope, w.meter, w.period_start, w.period_end, w.period, w.lim, 0, 0, @now
FROM unnest(@es_scopes::text[], @es_meters::text[], @es_starts::timestamptz[], @es_ends::timestamptz[], @es_names::text[],
            @es_limits::text[]::numeric[])
     AS w(scope, meter, period_start, period_end, period, lim)
WHERE NOT EXISTS (SELECT 1 FROM admission_scope_budgets x
                  WHERE x.scope = w.scope AND x.meter = w.meter AND x.period_start = w.period_start)
ORDER BY 1, 2, 3
ON CONFLICT DO NOTHING`

// qLockMeters takes locks.ExactScope for every meter of the batch, sorted:
// exclusively for the meters whose pool or global budgets the batch brings
// to a new rule version (@lm_exclusive), shared for the others. A batch
// that brings a scope's budget so waits for every grant in flight on its
// meter, and counts it.
const qLockMeters = `
SELECT CASE WHEN y.x THEN pg_advisory_xact_lock(@exact_scope_lock::int, hashtext(y.m))::text
            ELSE pg_advisory_xact_lock_shared(@exact_scope_lock::int, hashtext(y.m))::text END
FROM (SELECT m, x FROM unnest(@lm_meters::text[], @lm_exclusive::boolean[]) AS u(m, x) ORDER BY m) y`

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

// Bringing a budget to the version and period in force (docs/design.md
// §12, §13). A budget row records the rule version it was last brought to.
// When the version in force is another one (the row is new, the rule
// changed, or it turned exact again after being lagged), the row's
// consumed becomes at least what its period already consumed: a rule that
// turns exact mid-period, or again, never starts from zero and never
// forgets what was granted or metered meanwhile.
//
// What a customer consumed of a meter in a period (consumptionHead ...
// consumptionTail, with the period as [lo, hi) and the customer c) is
//
//	Σ its grants issued in the period (amount while not released, else spent)
//	+ max(0, metered usage − Σ what its grants may have admitted − bypasses)
//
// where a grant may have admitted its spent, or its amount once it ended
// without a final report. Usage the grants and bypasses do not explain was
// admitted some other way (while the rule was lagged) and counts too.

// consumptionHead + a usage condition + consumptionTail is that sum for c
// (customer, meter, lo, hi); the usage condition is usageInScopePeriod or
// usageInCustomerPeriod.
const consumptionHead = `
(SELECT coalesce(sum(CASE WHEN g.ended_at IS NULL THEN g.amount ELSE g.spent END), 0)
   FROM admission_grants g WHERE g.customer = c.customer AND g.meter = c.meter AND g.issued_at >= c.lo AND g.issued_at < c.hi)
+ GREATEST(0,
   (SELECT coalesce(sum(u.quantity), 0) FROM rollups u WHERE u.customer = c.customer AND u.meter = c.meter AND `

const consumptionTail = `)
 - (SELECT coalesce(sum(CASE WHEN g.ended_at IS NULL AND g.reclaim_at <= @now THEN g.amount ELSE g.spent END), 0)
   FROM admission_grants g WHERE g.customer = c.customer AND g.meter = c.meter AND g.issued_at >= c.lo AND g.issued_at < c.hi)
 - (SELECT coalesce(sum(x.amount), 0) FROM admission_bypasses x
     WHERE x.customer = c.customer AND x.meter = c.meter AND x.first_at >= c.lo AND x.first_at < c.hi))`

// A pool's or the global period (monthly, UTC) is whole hours: its usage
// is the rollup buckets in it. A customer's period is its rollups' own.
const (
	usageInScopePeriod    = `u.bucket >= c.lo AND u.bucket < c.hi`
	usageInCustomerPeriod = `u.period_start = c.lo`
)

// scopeMembers is, for the scope budget row t, every customer whose
// consumption it counts, with [lo, hi): a pool's members of the period
// from the period's start (joining brings what the member consumed this
// period) until they left (leaving takes nothing back; what a customer
// uses after it left is not the pool's); for global, every customer with
// grants or usage of the meter in the period.
const scopeMembers = `
SELECT m.customer, t.meter, t.period_start AS lo,
       least(t.period_end, CASE WHEN bool_or(m.left_at IS NULL) THEN t.period_end ELSE max(m.left_at) END) AS hi
FROM pool_members m
WHERE 'pool:' || m.pool = t.scope AND m.joined_at <= @now AND (m.left_at IS NULL OR m.left_at > t.period_start)
GROUP BY m.customer
UNION ALL
SELECT x.customer, t.meter, t.period_start, t.period_end
FROM (SELECT g.customer FROM admission_grants g
      WHERE g.meter = t.meter AND g.issued_at >= t.period_start AND g.issued_at < t.period_end
      UNION
      SELECT u.customer FROM rollups u
      WHERE u.meter = t.meter AND u.bucket >= t.period_start AND u.bucket < t.period_end) x
WHERE t.scope = 'global'`

// scopeConsumption is what the scope budget row t's period consumed.
const scopeConsumption = `(SELECT coalesce(sum(` + consumptionHead + usageInScopePeriod + consumptionTail + `), 0) FROM (` + scopeMembers + `) c)`

// qAdoptCustomerGrants marks as drawn from their customer's budget the live
// grants of the period that did not draw from it (the customer's rule was
// not exact), on the rows qBringCustomerBudgets brings: it counts them at
// their amount, so their release must free what they did not spend.
const qAdoptCustomerGrants = `
UPDATE admission_grants g SET draws_customer = true
FROM unnest(@bc_customers::text[], @bc_meters::text[], @bc_starts::timestamptz[]) AS k(customer, meter, period_start)
JOIN admission_budgets b USING (customer, meter, period_start)
CROSS JOIN LATERAL quota_rule_in_force(k.customer, k.meter, @now) r
WHERE (g.customer, g.meter, g.period_start) = (k.customer, k.meter, k.period_start)
  AND r.admission = 'exact' AND r."limit" IS NOT NULL AND b.rule_version <> r.version AND NOT g.draws_customer AND g.ended_at IS NULL`

// qBringCustomerBudgets brings the customer rows of @bc_ (those this Store
// has not seen at the planned version) whose exact rule in force is not
// the version they were last brought to. Every grant of a
// customer locks its customer row, so no grant of theirs is in flight.
const qBringCustomerBudgets = `
UPDATE admission_budgets b
SET consumed = GREATEST(b.consumed, (SELECT ` + consumptionHead + usageInCustomerPeriod + consumptionTail + `
                                     FROM (SELECT b.customer, b.meter, b.period_start AS lo, b.period_end AS hi) c)),
    "limit" = r."limit", rule_version = r.version, updated_at = @now
FROM unnest(@bc_customers::text[], @bc_meters::text[], @bc_starts::timestamptz[]) AS k(customer, meter, period_start)
CROSS JOIN LATERAL quota_rule_in_force(k.customer, k.meter, @now) r
WHERE (b.customer, b.meter, b.period_start) = (k.customer, k.meter, k.period_start)
  AND r.admission = 'exact' AND r."limit" IS NOT NULL AND b.rule_version <> r.version`

// scopeRowsToBring are the pool and global rows of @b_ (those whose meter
// the batch locked exclusively) whose exact rule in force is not the
// version they were last brought to, as t.
const scopeRowsToBring = `
(SELECT x.scope, x.meter, x.period_start, x.period_end, r."limit" AS lim, r.version
 FROM unnest(@b_scopes::text[], @b_meters::text[], @b_starts::timestamptz[]) AS k(scope, meter, period_start)
 JOIN admission_scope_budgets x USING (scope, meter, period_start)
 CROSS JOIN LATERAL quota_scope_rule_in_force(x.scope, x.meter, @now) r
 WHERE r.admission = 'exact' AND r."limit" IS NOT NULL AND x.rule_version <> r.version) t`

// adoptGrants records as drawn from each scope row t the live grants that
// its consumption counts and that did not draw from it (issued while its
// rule was lagged, or before their customer joined): the row counts them
// at their amount, so their release must free what they did not spend.
// It runs before the count: a release in flight commits first, and is
// then counted at its spent.
const adoptGrants = `
INSERT INTO admission_grant_draws (grant_id, scope, meter, period_start)
SELECT g.id, t.scope, t.meter, t.period_start
FROM `

const adoptGrantsTail = `
CROSS JOIN LATERAL (` + scopeMembers + `) c
JOIN admission_grants g ON g.customer = c.customer AND g.meter = c.meter AND g.issued_at >= c.lo AND g.issued_at < c.hi
WHERE g.ended_at IS NULL
ON CONFLICT DO NOTHING`

const qAdoptScopeGrants = adoptGrants + scopeRowsToBring + adoptGrantsTail

// qBringScopeBudgets brings the rows of scopeRowsToBring to what their
// period consumed.
const qBringScopeBudgets = `
UPDATE admission_scope_budgets s
SET consumed = GREATEST(s.consumed, ` + scopeConsumption + `),
    "limit" = t.lim, rule_version = t.version, updated_at = @now
FROM ` + scopeRowsToBring + `
WHERE (s.scope, s.meter, s.period_start) = (t.scope, t.meter, t.period_start)`

// The state the batch decides on, read after the locks were granted: a
// fresh snapshot per statement, so it sees every budget's consumed as of
// now, and every rule and membership committed before the locks.

// qCustomerState is each customer row's consumed, the version it was
// brought to, and the customer's rule in force (NULL when there is none).
const qCustomerState = `
SELECT b.customer, b.meter, b.period_start, b.consumed, b.rule_version, r."limit", r.version, r.admission
FROM admission_budgets b
LEFT JOIN LATERAL quota_rule_in_force(b.customer, b.meter, @now) r ON true
WHERE (b.customer, b.meter, b.period_start) IN
      (SELECT * FROM unnest(@c_customers::text[], @c_meters::text[], @c_starts::timestamptz[]))`

// qScopeState is each scope row's consumed, the version it was brought
// to, and its rule in force (limit NULL unless exact).
const qScopeState = `
SELECT s.scope, s.meter, s.period_start, s.consumed, s.rule_version,
       CASE WHEN r.admission = 'exact' AND r."limit" IS NOT NULL THEN r."limit" END, r.version
FROM admission_scope_budgets s
LEFT JOIN LATERAL quota_scope_rule_in_force(s.scope, s.meter, @now) r ON true
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
CROSS JOIN LATERAL quota_scope_rule_in_force(s.scope, k.meter, @now) r
WHERE r.admission = 'exact' AND r."limit" IS NOT NULL`

// The writes of a batch, set-based.

// qInsertHolders records holders that had no row when the batch locked
// its holders, sorted (seen_at: when the holder's newest generation was
// first issued a grant). No ON CONFLICT: a row another batch created
// meanwhile is not locked here, out of the lock order, but fails the
// batch (holderCreated), which runs again with that row locked.
const qInsertHolders = `
INSERT INTO admission_holders (holder, generation, seen_at)
SELECT holder, max(generation), @now FROM unnest(@h_holders::text[], @h_generations::bigint[]) AS u(holder, generation)
GROUP BY holder ORDER BY holder`

// qRaiseHolderGenerations records newer generations of holders whose rows
// the batch locked.
const qRaiseHolderGenerations = `
UPDATE admission_holders h SET generation = GREATEST(h.generation, u.generation), seen_at = @now
FROM (SELECT holder, max(generation) AS generation FROM unnest(@h_holders::text[], @h_generations::bigint[]) AS x(holder, generation)
      GROUP BY holder) u
WHERE h.holder = u.holder`

const qTakeCustomerBudgets = `
UPDATE admission_budgets b
SET consumed = b.consumed + u.delta, "limit" = u.lim, rule_version = u.version, updated_at = @now
FROM unnest(@u_customers::text[], @u_meters::text[], @u_starts::timestamptz[], @u_deltas::text[]::numeric[],
            @u_limits::text[]::numeric[], @u_versions::bigint[]) AS u(customer, meter, period_start, delta, lim, version)
WHERE (b.customer, b.meter, b.period_start) = (u.customer, u.meter, u.period_start)`

const qTakeScopeBudgets = `
UPDATE admission_scope_budgets s
SET consumed = s.consumed + u.delta, "limit" = u.lim, rule_version = u.version, updated_at = @now
FROM unnest(@u_scopes::text[], @u_meters::text[], @u_starts::timestamptz[], @u_deltas::text[]::numeric[],
            @u_limits::text[]::numeric[], @u_versions::bigint[]) AS u(scope, meter, period_start, delta, lim, version)
WHERE (s.scope, s.meter, s.period_start) = (u.scope, u.meter, u.period_start)`

// qInsertGrants writes the batch's grants; a debit's (g_debits) is
// written spent in full and released at once (debit.go).
const qInsertGrants = `
INSERT INTO admission_grants (id, customer, meter, period_start, rule_version, holder, generation, amount, spent,
                              issued_at, valid_until, reclaim_at, ended_at, end_reason, draws_customer)
SELECT id, customer, meter, period_start, rule_version, holder, generation, amount,
       CASE WHEN debit THEN amount ELSE 0 END, @now, valid_until, reclaim_at,
       CASE WHEN debit THEN @now::timestamptz END, CASE WHEN debit THEN 'released' END, draws_customer
FROM unnest(@g_ids::uuid[], @g_customers::text[], @g_meters::text[], @g_starts::timestamptz[], @g_versions::bigint[],
            @g_holders::text[], @g_generations::bigint[], @g_amounts::text[]::numeric[], @g_valid_until::timestamptz[],
            @g_reclaim_at::timestamptz[], @g_draws_customer::boolean[], @g_debits::boolean[])
     AS g(id, customer, meter, period_start, rule_version, holder, generation, amount, valid_until, reclaim_at, draws_customer, debit)`

const qInsertDraws = `
INSERT INTO admission_grant_draws (grant_id, scope, meter, period_start)
SELECT * FROM unnest(@d_ids::uuid[], @d_scopes::text[], @d_meters::text[], @d_starts::timestamptz[])`

// qEarliestReclaims is, for budgets that refused, when their earliest live
// grant is reclaimed (NULL: none live), and what the live grants of other
// holders than the one refused still hold, as far as their spend reports
// have said (0: none). Read after the batch committed.
const qEarliestReclaims = `
SELECT k.i, min(x.reclaim_at),
       coalesce(sum(x.amount - x.spent) FILTER (WHERE x.holder <> k.holder AND x.valid_until > @now), 0)
FROM unnest(@r_scopes::text[], @r_meters::text[], @r_starts::timestamptz[], @r_holders::text[])
       WITH ORDINALITY AS k(scope, meter, period_start, holder, i)
LEFT JOIN LATERAL (
    SELECT g.reclaim_at, g.amount, g.spent, g.holder, g.valid_until FROM admission_grants g
    WHERE k.scope LIKE 'customer:%'
      AND g.customer = substr(k.scope, 10) AND g.meter = k.meter AND g.period_start = k.period_start
      AND g.draws_customer AND g.ended_at IS NULL AND g.reclaim_at > @now
    UNION ALL
    SELECT g.reclaim_at, g.amount, g.spent, g.holder, g.valid_until
    FROM admission_grant_draws y JOIN admission_grants g ON g.id = y.grant_id
    WHERE k.scope NOT LIKE 'customer:%'
      AND y.scope = k.scope AND y.meter = k.meter AND y.period_start = k.period_start
      AND g.ended_at IS NULL AND g.reclaim_at > @now
) x ON true
GROUP BY k.i`

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

// qRecountPool brings each of a pool's budgets of the current period to at
// least what its members consumed this period, after customers joined:
// a joining customer brings its consumption of the pool's period in, and
// one that left and rejoined is counted once (scopeMembers counts each
// customer once, over every stay of the period).
const qRecountPool = `
UPDATE admission_scope_budgets s
SET consumed = GREATEST(s.consumed, ` + scopeConsumption + `), updated_at = @now
FROM ` + poolRowsNow + `
WHERE (s.scope, s.meter, s.period_start) = (t.scope, t.meter, t.period_start)`

// poolRowsNow are @scope's budget rows of the current period, as t.
const poolRowsNow = `(SELECT scope, meter, period_start, period_end FROM admission_scope_budgets
      WHERE scope = @scope AND period_start <= @now AND period_end > @now) t`

// qAdoptPoolGrants is adoptGrants for a pool's rows after a join.
const qAdoptPoolGrants = adoptGrants + poolRowsNow + adoptGrantsTail

// scopeRowGrants are the ids of the grants a scope row t counts once it is
// brought (qAdoptScopeGrants): those that drew from it, and its members'
// grants of the period.
const scopeRowGrants = `
SELECT d.grant_id FROM admission_grant_draws d WHERE (d.scope, d.meter, d.period_start) = (t.scope, t.meter, t.period_start)
UNION
SELECT g.id FROM (` + scopeMembers + `) c
JOIN admission_grants g ON g.customer = c.customer AND g.meter = c.meter AND g.issued_at >= c.lo AND g.issued_at < c.hi`

// qScopeBudgets lists a scope's budgets with what is live and stranded,
// with the limit and version of the rule in force (as qBudgets). A row
// last brought to another version than that exact rule's shows what
// bringing it would (qAdoptScopeGrants, qBringScopeBudgets): at least
// what its period consumed, and its members' grants as live or stranded.
// For each meter whose exact rule in force has no row in the current
// period (@lo, @hi, @period: no grant was issued under it yet), it lists
// the row its first grant will create and bring (qEnsureScopeBudgets),
// the same way, with the rule's limit and version. Nothing is written.
const qScopeBudgets = `
(SELECT s.scope, s.meter, s.period, s.period_start, s.period_end,
        ` + scopeLimitAndVersion + `,
        CASE WHEN t.behind THEN GREATEST(s.consumed, ` + scopeConsumption + `) ELSE s.consumed END,
        CASE WHEN t.behind
             THEN coalesce((SELECT sum(g.amount) FROM admission_grants g
                            WHERE g.id IN (` + scopeRowGrants + `) AND g.ended_at IS NULL AND g.reclaim_at > @now), 0)
             ELSE coalesce((SELECT sum(g.amount) FROM admission_grant_draws d JOIN admission_grants g ON g.id = d.grant_id
                            WHERE (d.scope, d.meter, d.period_start) = (s.scope, s.meter, s.period_start)
                              AND g.ended_at IS NULL AND g.reclaim_at > @now), 0) END,
        CASE WHEN t.behind
             THEN coalesce((SELECT sum(g.amount - g.spent) FROM admission_grants g
                            WHERE g.id IN (` + scopeRowGrants + `) AND g.ended_at IS NULL AND g.reclaim_at <= @now), 0)
             ELSE coalesce((SELECT sum(g.amount - g.spent) FROM admission_grant_draws d JOIN admission_grants g ON g.id = d.grant_id
                            WHERE (d.scope, d.meter, d.period_start) = (s.scope, s.meter, s.period_start)
                              AND g.ended_at IS NULL AND g.reclaim_at <= @now), 0) END
 FROM admission_scope_budgets s
 LEFT JOIN LATERAL quota_scope_rule_in_force(s.scope, s.meter, least(@now::timestamptz, s.period_end - interval '1 microsecond')) r ON true
 CROSS JOIN LATERAL (SELECT s.scope, s.meter, s.period_start, s.period_end,
                            coalesce(r.admission = 'exact' AND r."limit" IS NOT NULL AND s.rule_version <> r.version, false) AS behind) t
 WHERE s.scope = @scope)
UNION ALL
(SELECT t.scope, t.meter, @period::text, t.period_start, t.period_end, t.lim, t.version, ` + scopeConsumption + `, d.live, d.stranded
 FROM (SELECT q.scope, q.meter, @lo::timestamptz AS period_start, @hi::timestamptz AS period_end, r."limit" AS lim, r.version
       FROM (SELECT DISTINCT scope, meter FROM quota_scope_rules WHERE scope = @scope) q
       CROSS JOIN LATERAL quota_scope_rule_in_force(q.scope, q.meter, @now) r
       WHERE r.admission = 'exact' AND r."limit" IS NOT NULL) t
 CROSS JOIN LATERAL (SELECT coalesce(sum(g.amount) FILTER (WHERE g.reclaim_at > @now), 0) AS live,
                            coalesce(sum(g.amount - g.spent) FILTER (WHERE g.reclaim_at <= @now), 0) AS stranded
                     FROM (` + scopeMembers + `) c
                     JOIN admission_grants g ON g.customer = c.customer AND g.meter = c.meter AND g.issued_at >= c.lo AND g.issued_at < c.hi
                     WHERE g.ended_at IS NULL) d
 WHERE NOT EXISTS (SELECT 1 FROM admission_scope_budgets s
                   WHERE (s.scope, s.meter, s.period_start) = (t.scope, t.meter, t.period_start)))
ORDER BY 4 DESC, 2`
