package quota

// The package's SQL, in one place. Every statement is a constant; values are
// always bind parameters.

// qLockRule serialises new versions of one rule: $1 is locks.QuotaRule,
// $2 "customer/meter".
const qLockRule = `SELECT pg_advisory_xact_lock($1::int, hashtext($2))`

// qLockMeterKindsShared is the ledger's meter-kinds lock (locks.MeterKinds,
// key 0), shared: a rule and a declaration changing its meter's kind take turns.
const qLockMeterKindsShared = `SELECT pg_advisory_xact_lock_shared($1::int, 0)`

// qMeterHasRules: whether any customer or scope rule names meter $1.
const qMeterHasRules = `
SELECT EXISTS (SELECT 1 FROM quota_rules WHERE meter = $1) OR EXISTS (SELECT 1 FROM quota_scope_rules WHERE meter = $1)`

// qLatestVersion is the highest version of a rule and the effective time
// and version of the version in force at $3.
const qLatestVersion = `
SELECT coalesce((SELECT max(version) FROM quota_rules WHERE customer = $1 AND meter = $2), 0), r.version, r.effective_at
FROM (SELECT 1) x LEFT JOIN quota_rule_in_force($1, $2, $3) r ON true`

const qInsertRule = `
INSERT INTO quota_rules (customer, meter, version, effective_at, "limit", warn_at, mode, on_stale,
                         stale_after, created_at, actor, reason, admission, on_unreachable, local_amount, local_every,
                         rate_amount, rate_burst, rate_per, max_skew)
VALUES ($1, $2, $3, $4, $5::numeric, $6::numeric, $7, $8, make_interval(secs => $9), $10, $11, $12,
        $13, $14, $15::numeric, CASE WHEN $16::bigint > 0 THEN make_interval(secs => $16) END,
        $17::numeric, $18::numeric, $19::bigint * interval '1 microsecond', $20::bigint * interval '1 microsecond')`

// qCurrentRules is the version in force at $2 of each of customer $1's
// meters.
const qCurrentRules = `
SELECT ` + ruleColumns + `
FROM (SELECT DISTINCT meter AS k_meter FROM quota_rules WHERE customer = $1) k
CROSS JOIN LATERAL quota_rule_in_force($1, k.k_meter, $2)
ORDER BY meter`

const qRuleHistory = `
SELECT ` + ruleColumns + `
FROM quota_rules
WHERE customer = $1 AND meter = $2
ORDER BY version`

// qRuleHistoryLatest is the latest $3 versions of a rule, newest first.
const qRuleHistoryLatest = `
SELECT ` + ruleColumns + `
FROM quota_rules
WHERE customer = $1 AND meter = $2
ORDER BY version DESC LIMIT $3`

// qEffectiveRules is every current rule (of one customer when $2 is not
// NULL) with its customer's billing calendar (NULL: the customer has no
// usage yet, so it has the default calendar).
const qEffectiveRules = `
SELECT ` + ruleColumns + `, (SELECT c.schedule FROM customers c WHERE c.id = q.customer)
FROM (SELECT DISTINCT customer AS k_customer, meter AS k_meter FROM quota_rules
      WHERE effective_at <= $1 AND ($2::text IS NULL OR customer = $2)) k
CROSS JOIN LATERAL quota_rule_in_force(k.k_customer, k.k_meter, $1) q
WHERE q."limit" IS NOT NULL -- a rate rule (docs/design.md §17) has no period to decide on
ORDER BY customer, meter`

// qUsage reads, for each (customer, meter) in one round trip, the billed
// usage of its current period, the usage of the rollup buckets since
// recent_from (the fallback rate), the usage of the previous period (for
// the overage of its last minutes after a period boundary), and as_of: the applied-through time of
// the customer's ingest partition, or the minimum over every partition of
// the topic (NULL when any partition's is unknown). Rollups only: never raw
// records. Two variants: with and without the ingest_customers table.
const qUsageHead = `
WITH k AS (
    SELECT * FROM unnest($1::text[], $2::text[], $3::timestamptz[], $4::timestamptz[], $5::timestamptz[])
         WITH ORDINALITY AS k(customer, meter, period_start, prev_start, recent_from, i)
), topic AS (
    SELECT CASE WHEN count(*) = 0 OR bool_or(applied_through IS NULL) THEN NULL
                ELSE min(applied_through) END AS as_of
    FROM ingest_partitions WHERE topic = $6
)
SELECT k.i,
       coalesce((SELECT sum(u.quantity) FROM rollups u
                 WHERE u.customer = k.customer AND u.meter = k.meter AND u.period_start = k.period_start), 0)::text,
       coalesce((SELECT sum(u.quantity) FROM rollups u
                 WHERE u.customer = k.customer AND u.meter = k.meter
                   AND u.period_start >= k.prev_start AND u.bucket >= k.recent_from), 0)::text,
       coalesce((SELECT sum(u.quantity) FROM rollups u
                 WHERE u.customer = k.customer AND u.meter = k.meter AND u.period_start = k.prev_start), 0)::text,
`

const qUsageByTopic = qUsageHead + `       topic.as_of
FROM k CROSS JOIN topic
ORDER BY k.i`

const qUsageByCustomer = qUsageHead + `       CASE WHEN ic.partition IS NULL THEN topic.as_of ELSE p.applied_through END
FROM k CROSS JOIN topic
LEFT JOIN ingest_customers ic ON ic.customer = k.customer AND ic.topic = $6
LEFT JOIN ingest_partitions p ON p.topic = ic.topic AND p.partition = ic.partition
ORDER BY k.i`

// qRulesUndecided reads, for each key (customer or scope, meter) with a
// published decision that the snapshot at $4 did not decide, the version
// of the rule in force at $4 (NULL: none), whether it has a lagged period
// limit after all (a version committed since the snapshot: decided at the
// next evaluation) and, for a customer, its billing calendar.
const qRulesUndecided = `
SELECT k.i, coalesce(r.version, s.version),
       coalesce(r."limit" IS NOT NULL, s."limit" IS NOT NULL AND s.admission = 'lagged', false),
       (SELECT c.schedule FROM customers c WHERE c.id = k.customer AND NOT k.scoped)
FROM unnest($1::text[], $2::text[], $3::boolean[]) WITH ORDINALITY AS k(customer, meter, scoped, i)
LEFT JOIN LATERAL quota_rule_in_force(k.customer, k.meter, $4) r ON NOT k.scoped
LEFT JOIN LATERAL quota_scope_rule_in_force(k.customer, k.meter, $4) s ON k.scoped
ORDER BY k.i`

const qHasIngestCustomers = `SELECT to_regclass('ingest_customers') IS NOT NULL`

const qLoadDecisions = `SELECT decision FROM quota_decisions`

const qCustomerDecisions = `SELECT decision FROM quota_decisions WHERE customer = $1`

// qExactDecisions are the stored decisions made under an exact customer
// rule, by key (pool and global decisions are made for lagged rules only).
const qExactDecisions = `
SELECT d.customer || '/' || d.meter FROM quota_decisions d
JOIN quota_rules r ON r.customer = d.customer AND r.meter = d.meter AND r.version = d.rule_version
WHERE r.admission = 'exact'`

// qFence holds the lease row (shared) for the rest of the transaction: a
// competing acquire waits for it, and a deposed leader finds no row.
const qFence = `
SELECT 1 FROM quota_leases
WHERE name = $1 AND holder = $2 AND epoch = $3 AND expires_at > now()
FOR SHARE`

const qStoreDecisions = `
INSERT INTO quota_decisions (customer, meter, rule_version, period_start, state, used, decided_at, stale, leader_epoch, decision)
SELECT customer, meter, rule_version, period_start, state, used::numeric, decided_at, stale, $10, decision
FROM unnest($1::text[], $2::text[], $3::bigint[], $4::timestamptz[], $5::text[], $6::text[], $7::timestamptz[],
            $8::boolean[], $9::jsonb[])
     AS d(customer, meter, rule_version, period_start, state, used, decided_at, stale, decision)
ON CONFLICT (customer, meter) DO UPDATE
SET rule_version = EXCLUDED.rule_version, period_start = EXCLUDED.period_start, state = EXCLUDED.state,
    used = EXCLUDED.used, decided_at = EXCLUDED.decided_at, stale = EXCLUDED.stale,
    leader_epoch = EXCLUDED.leader_epoch, decision = EXCLUDED.decision`

const qAddOverage = `
INSERT INTO quota_overage (customer, meter, period_start, period, while_exceeded, while_stale, over_limit, updated_at)
SELECT customer, meter, period_start, period, ex::numeric, st::numeric, ol::numeric, $8
FROM unnest($1::text[], $2::text[], $3::timestamptz[], $4::text[], $5::text[], $6::text[], $7::text[])
     AS o(customer, meter, period_start, period, ex, st, ol)
ON CONFLICT (customer, meter, period_start) DO UPDATE
SET while_exceeded = quota_overage.while_exceeded + EXCLUDED.while_exceeded,
    while_stale    = quota_overage.while_stale + EXCLUDED.while_stale,
    over_limit     = GREATEST(quota_overage.over_limit, EXCLUDED.over_limit),
    updated_at     = EXCLUDED.updated_at`

const qOverage = `
SELECT customer, meter, period_start, period, while_exceeded::text, while_stale::text, over_limit::text, updated_at
FROM quota_overage
WHERE period_start = $1 AND ($2::text IS NULL OR customer = $2)
ORDER BY customer, meter`

// Lease statements. Times are Postgres's clock, so every contender agrees.
const qAcquireLease = `
INSERT INTO quota_leases AS l (name, holder, epoch, acquired_at, expires_at)
VALUES ($1, $2, 1, now(), now() + make_interval(secs => $3))
ON CONFLICT (name) DO UPDATE
SET holder = EXCLUDED.holder, epoch = l.epoch + 1, acquired_at = now(), expires_at = EXCLUDED.expires_at
WHERE l.expires_at <= now()
RETURNING epoch`

const qRenewLease = `
UPDATE quota_leases SET expires_at = now() + make_interval(secs => $4)
WHERE name = $1 AND holder = $2 AND epoch = $3`

const qReleaseLease = `
UPDATE quota_leases SET expires_at = now()
WHERE name = $1 AND holder = $2 AND epoch = $3`

// qScopeLatestVersion is the highest version of a scope rule and the
// effective time of the version in force at @now.
const qScopeLatestVersion = `
SELECT coalesce((SELECT max(version) FROM quota_scope_rules WHERE scope = @scope AND meter = @meter), 0), r.effective_at
FROM (SELECT 1) x LEFT JOIN quota_scope_rule_in_force(@scope, @meter, @now) r ON true`

const qInsertScopeRule = `
INSERT INTO quota_scope_rules (scope, meter, version, effective_at, "limit", warn_at, mode, admission,
                               created_at, actor, reason, rate_amount, rate_burst, rate_per, max_skew)
VALUES (@scope, @meter, @version, @effective_at, @limit::numeric, @warn_at::numeric, @mode, @admission,
        @created_at, @actor, @reason, @rate_amount::numeric, @rate_burst::numeric,
        @rate_per::bigint * interval '1 microsecond', @max_skew::bigint * interval '1 microsecond')`

const scopeRuleColumns = `scope, meter, version, effective_at, "limit"::text, warn_at::text, mode, admission,
       created_at, actor, reason, ` + rateSelect

// qScopeRules is the rule in force at @now of each meter of @scope.
const qScopeRules = `
SELECT ` + scopeRuleColumns + `
FROM (SELECT DISTINCT meter AS k_meter FROM quota_scope_rules WHERE scope = @scope) k
CROSS JOIN LATERAL quota_scope_rule_in_force(@scope, k.k_meter, @now)
ORDER BY meter`

// qScopeRulesInForce is every lagged pool and global rule in force at @now.
const qScopeRulesInForce = `
SELECT ` + scopeRuleColumns + `
FROM (SELECT DISTINCT scope AS k_scope, meter AS k_meter FROM quota_scope_rules WHERE effective_at <= @now) k
CROSS JOIN LATERAL quota_scope_rule_in_force(k.k_scope, k.k_meter, @now)
WHERE admission = 'lagged'
ORDER BY scope, meter`

// qScopeUsageHead reads, per (scope, meter), the usage of its members in
// the scope's period and the one before, from rollups. A pool's member is
// every customer in the pool at some time since the previous period's
// start: its usage counts from the period's start (joining brings the
// period's usage in) until it left (leaving takes nothing back, and what
// it uses after leaving is no longer the pool's). Global: every customer.
const qScopeUsageHead = `
WITH k AS (
    SELECT * FROM unnest(@scopes::text[], @meters::text[]) WITH ORDINALITY AS k(scope, meter, i)
), mem AS (
    SELECT k.i, m.customer, CASE WHEN bool_or(m.left_at IS NULL) THEN NULL ELSE max(m.left_at) END AS until
    FROM k JOIN pool_members m ON k.scope = 'pool:' || m.pool
    WHERE m.joined_at <= @now AND (m.left_at IS NULL OR m.left_at > @prev_start)
    GROUP BY k.i, m.customer
    UNION
    SELECT DISTINCT k.i, u.customer, NULL::timestamptz FROM k JOIN rollups u ON k.scope = 'global' AND u.meter = k.meter
    WHERE u.bucket >= @prev_start AND u.bucket < @end
), topic AS (
    SELECT CASE WHEN count(*) = 0 OR bool_or(applied_through IS NULL) THEN NULL
                ELSE min(applied_through) END AS as_of
    FROM ingest_partitions WHERE topic = @topic
)
SELECT k.i,
       coalesce((SELECT sum(u.quantity) FROM rollups u JOIN mem ON mem.customer = u.customer AND mem.i = k.i
                 WHERE u.meter = k.meter AND u.bucket >= @start AND u.bucket < @end
                   AND (mem.until IS NULL OR u.bucket < mem.until)), 0)::text,
       coalesce((SELECT sum(u.quantity) FROM rollups u JOIN mem ON mem.customer = u.customer AND mem.i = k.i
                 WHERE u.meter = k.meter AND u.bucket >= @prev_start AND u.bucket < @start
                   AND (mem.until IS NULL OR u.bucket < mem.until)), 0)::text,
`

const qScopeUsageByTopic = qScopeUsageHead + `       topic.as_of
FROM k CROSS JOIN topic
ORDER BY k.i`

// With ingest_customers: as_of is the oldest applied-through of the
// members' partitions (the topic's for a member without one, and for a
// pool without members); unknown when any is.
const qScopeUsageByCustomer = qScopeUsageHead + `       (SELECT CASE WHEN count(*) = 0 THEN topic.as_of WHEN bool_or(x.a IS NULL) THEN NULL ELSE min(x.a) END
        FROM (SELECT CASE WHEN ic.partition IS NULL THEN topic.as_of ELSE p.applied_through END AS a
              FROM mem
              LEFT JOIN ingest_customers ic ON ic.customer = mem.customer AND ic.topic = @topic
              LEFT JOIN ingest_partitions p ON p.topic = ic.topic AND p.partition = ic.partition
              WHERE mem.i = k.i) x)
FROM k CROSS JOIN topic
ORDER BY k.i`
