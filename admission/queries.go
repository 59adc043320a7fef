package admission

// The package's SQL, in one place. Every statement is a constant; values are
// always bind parameters. Times are parameters too (Config.Now).

// qUpsertHolder records a holder's newest generation and locks its row for
// the transaction; it returns the newest generation ever shown.
const qUpsertHolder = `
INSERT INTO admission_holders AS h (holder, generation, seen_at)
VALUES (@holder, @generation, @now)
ON CONFLICT (holder) DO UPDATE
SET generation = GREATEST(h.generation, EXCLUDED.generation), seen_at = EXCLUDED.seen_at
RETURNING generation`

const qHolderGeneration = `SELECT generation FROM admission_holders WHERE holder = @holder FOR SHARE`

// qLockBudget creates the budget row of a period if needed and locks it.
const qLockBudget = `
INSERT INTO admission_budgets AS b (customer, meter, period_start, period_end, period, "limit", rule_version, updated_at)
VALUES (@customer, @meter, @period_start, @period_end, @period, @limit::numeric, @rule_version, @now)
ON CONFLICT (customer, meter, period_start) DO UPDATE SET updated_at = EXCLUDED.updated_at
RETURNING consumed::text`

const qSetBudget = `
UPDATE admission_budgets
SET "limit" = @limit::numeric, rule_version = @rule_version, consumed = consumed + @delta::numeric, updated_at = @now
WHERE customer = @customer AND meter = @meter AND period_start = @period_start`

const qFreeBudget = `
UPDATE admission_budgets SET consumed = consumed - @delta::numeric, updated_at = @now
WHERE customer = @customer AND meter = @meter AND period_start = @period_start`

const qLockBudgetRow = `
SELECT 1 FROM admission_budgets
WHERE customer = @customer AND meter = @meter AND period_start = @period_start
FOR UPDATE`

const qEarliestReclaim = `
SELECT min(reclaim_at) FROM admission_grants
WHERE customer = @customer AND meter = @meter AND period_start = @period_start
  AND ended_at IS NULL AND reclaim_at > @now`

const grantColumns = `g.id, g.customer, g.meter, g.period_start, b.period, b.period_end, g.rule_version, g.holder, g.generation,
       g.amount::text, g.spent::text, g.issued_at, g.valid_until, g.reclaim_at, g.ended_at, g.end_reason`

const grantFrom = `
FROM admission_grants g
JOIN admission_budgets b USING (customer, meter, period_start)`

// qIssue moves consumed and inserts the grant in one round trip (the
// budget row is already locked by qLockBudget).
const qIssue = `
WITH b AS (` + qSetBudget + `)
INSERT INTO admission_grants (id, customer, meter, period_start, rule_version, holder, generation, amount,
                              issued_at, valid_until, reclaim_at)
VALUES (@id, @customer, @meter, @period_start, @rule_version, @holder, @generation, @amount::numeric,
        @now, @valid_until, @reclaim_at)`

const qGrant = `SELECT ` + grantColumns + grantFrom + ` WHERE g.id = @id`

const qGrantForUpdate = qGrant + ` FOR UPDATE OF g`

const qRenewGrant = `
UPDATE admission_grants
SET spent = @spent::numeric, valid_until = GREATEST(valid_until, @valid_until),
    reclaim_at = GREATEST(reclaim_at, @reclaim_at)
WHERE id = @id`

const qReleaseGrant = `
UPDATE admission_grants SET spent = @spent::numeric, ended_at = @now, end_reason = 'released'
WHERE id = @id`

// qCustomerGrants lists a customer's grants, live or ended by the clock
// (a grant past its reclaim time is ended even before a sweep marks it),
// newest first, keyset-paged by (issued_at, id).
const qCustomerGrants = `SELECT ` + grantColumns + grantFrom + `
WHERE g.customer = @customer
  AND (@state::text = ''
       OR (@state = 'live' AND g.ended_at IS NULL AND g.reclaim_at > @now)
       OR (@state = 'ended' AND (g.ended_at IS NOT NULL OR g.reclaim_at <= @now)))
  AND (@after_issued::timestamptz IS NULL OR (g.issued_at, g.id) < (@after_issued, @after_id::uuid))
ORDER BY g.issued_at DESC, g.id DESC
LIMIT @limit`

// qBudgets lists a customer's budgets with what is live, stranded and
// bypassed, newest period first.
const qBudgets = `
SELECT b.customer, b.meter, b.period, b.period_start, b.period_end, b."limit"::text, b.rule_version, b.consumed::text,
       coalesce((SELECT sum(g.amount) FROM admission_grants g
                 WHERE (g.customer, g.meter, g.period_start) = (b.customer, b.meter, b.period_start)
                   AND g.ended_at IS NULL AND g.reclaim_at > @now), 0)::text AS live,
       coalesce((SELECT sum(g.amount - g.spent) FROM admission_grants g
                 WHERE (g.customer, g.meter, g.period_start) = (b.customer, b.meter, b.period_start)
                   AND (g.ended_at IS NOT NULL OR g.reclaim_at <= @now)), 0)::text AS stranded,
       coalesce((SELECT sum(x.amount) FROM admission_bypasses x
                 WHERE (x.customer, x.meter, x.period_start) = (b.customer, b.meter, b.period_start)), 0)::text AS bypassed
FROM admission_budgets b
WHERE b.customer = @customer
ORDER BY b.period_start DESC, b.meter`

const qInsertBypass = `
INSERT INTO admission_bypasses (holder, report_id, customer, meter, period_start, period, rule_version, generation,
                                amount, admissions, first_at, last_at, reported_at)
VALUES (@holder, @report_id, @customer, @meter, @period_start, @period, @rule_version, @generation,
        @amount::numeric, @admissions, @first_at, @last_at, @now)
ON CONFLICT DO NOTHING`

// qGrantGauges reads the grants of open periods: live ones, and those
// that ended without a final report (expired; their unspent part is
// stranded until the period ends). Budgets of open periods are few (one
// per exact rule), and each is looked up by admission_grants_budget.
const qGrantGauges = `
SELECT count(*) FILTER (WHERE g.reclaim_at > @now),
       coalesce(sum(g.amount) FILTER (WHERE g.reclaim_at > @now), 0)::text,
       count(*) FILTER (WHERE g.reclaim_at <= @now),
       coalesce(sum(g.amount - g.spent) FILTER (WHERE g.reclaim_at <= @now), 0)::text
FROM admission_budgets b
JOIN admission_grants g ON (g.customer, g.meter, g.period_start) = (b.customer, b.meter, b.period_start)
WHERE b.period_end > @now AND g.ended_at IS NULL`
