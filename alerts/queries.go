package alerts

// The package's SQL, in one place. Every statement is a constant; values
// are always bind parameters.

// qLockRule serialises new versions of one rule: $1 is locks.AlertRule,
// $2 the rule's name.
const qLockRule = `SELECT pg_advisory_xact_lock($1::int, hashtext($2))`

const qLatestRuleVersion = `
SELECT coalesce(max(version), 0),
       coalesce((SELECT NOT deleted FROM alert_rules WHERE name = $1 ORDER BY version DESC LIMIT 1), false)
FROM alert_rules WHERE name = $1`

const qInsertRule = `
INSERT INTO alert_rules (name, version, subject, meter, thresholds, notify_on, hysteresis_percent, endpoints, deleted, created_at, actor)
VALUES (@name, @version, @subject, @meter, @thresholds::jsonb, @notify_on, @hysteresis::numeric, @endpoints, @deleted, @created_at, @actor)`

// qRule is the latest version of one rule (deleted or not).
const qRule = `SELECT ` + ruleColumns + ` FROM alert_rules WHERE name = $1 ORDER BY version DESC LIMIT 1`

// qLatestRules is the latest version of every rule, deleted or not.
const qLatestRules = `SELECT DISTINCT ON (name) ` + ruleColumns + ` FROM alert_rules ORDER BY name, version DESC`

// qRules is the latest live version of every rule.
const qRules = `
SELECT ` + ruleColumns + ` FROM (
    SELECT DISTINCT ON (name) * FROM alert_rules ORDER BY name, version DESC
) r WHERE NOT deleted ORDER BY name`

// qLockWebhooks holds the named webhooks (shared) for the rest of the
// transaction, so none is deleted before the rule naming it commits.
const qLockWebhooks = `SELECT name FROM alert_webhooks WHERE name = ANY($1::text[]) ORDER BY name FOR SHARE`

const qUnknownWebhooks = `
SELECT coalesce(array_agg(e ORDER BY o), '{}') FROM unnest($1::text[]) WITH ORDINALITY AS x(e, o)
WHERE NOT EXISTS (SELECT 1 FROM alert_webhooks w WHERE w.name = x.e)`

// qCustomers is every known customer (the subjects of a "customers" rule).
const qCustomers = `SELECT id FROM customers ORDER BY id`

// qStates is every state that is triggered (to resolve when its
// period ended, its threshold or rule went away) and every state of a
// period that began since @since (the rules' current periods, with the
// transitions counted so far); qStatesOfRule the same of rule @rule. Each
// reads by alert_states_period and alert_states_triggered, never the
// states past periods left behind (migration 00050).
const qStates = `
SELECT rule, subject, threshold, period_start, period, meter, state, transitions, used::text, "limit"::text, changed_at
FROM alert_states WHERE period_start >= @since
UNION ALL
SELECT rule, subject, threshold, period_start, period, meter, state, transitions, used::text, "limit"::text, changed_at
FROM alert_states WHERE state = 'triggered' AND period_start < @since`

const qStatesOfRule = `
SELECT rule, subject, threshold, period_start, period, meter, state, transitions, used::text, "limit"::text, changed_at
FROM alert_states WHERE period_start >= @since AND rule = @rule
UNION ALL
SELECT rule, subject, threshold, period_start, period, meter, state, transitions, used::text, "limit"::text, changed_at
FROM alert_states WHERE state = 'triggered' AND period_start < @since AND rule = @rule`

// qUpsertStates writes each state's transition. The meter is written too:
// a rule version may move a threshold to another meter, and the state,
// whose count goes on, is then of the new one (a stale meter would read as
// a rule change at every evaluation and resolve and trigger it again).
const qUpsertStates = `
INSERT INTO alert_states (rule, subject, threshold, period_start, period, meter, state, transitions, used, "limit", changed_at)
SELECT rule, subject, threshold, period_start, period, meter, state, transitions, used::numeric, lim::numeric, @at
FROM unnest(@rules::text[], @subjects::text[], @thresholds::text[], @starts::timestamptz[], @periods::text[],
            @meters::text[], @states::text[], @transitions::int[], @used::text[], @limits::text[])
     AS s(rule, subject, threshold, period_start, period, meter, state, transitions, used, lim)
ON CONFLICT (rule, subject, threshold, period_start) DO UPDATE
SET meter = EXCLUDED.meter, state = EXCLUDED.state, transitions = EXCLUDED.transitions, used = EXCLUDED.used,
    "limit" = EXCLUDED."limit", changed_at = EXCLUDED.changed_at`

const qInsertEvents = `
INSERT INTO alert_events (id, rule, subject, meter, type, body, occurred_at)
SELECT id, rule, subject, meter, type, body, @at
FROM unnest(@ids::uuid[], @rules::text[], @subjects::text[], @meters::text[], @types::text[], @bodies::text[])
     WITH ORDINALITY AS e(id, rule, subject, meter, type, body, o)
ORDER BY o
ON CONFLICT (id) DO NOTHING`

// qInsertDeliveries adds one delivery per (event, endpoint), with the
// event's seq (its commit order). Its times are the database's (now(): its
// transaction's), as are those the dispatcher compares them with: created
// now, due now, given up @retry_for from now, whatever the evaluator's
// clock says (the event's occurred_at).
const qInsertDeliveries = `
INSERT INTO alert_deliveries (event_id, endpoint, rule, subject, seq, state, next_attempt_at, give_up_at, created_at)
SELECT e.id, d.endpoint, e.rule, e.subject, e.seq, 'pending', now(), now() + make_interval(secs => @retry_for), now()
FROM unnest(@ids::uuid[], @endpoints::text[]) AS d(id, endpoint)
JOIN alert_events e ON e.id = d.id
ON CONFLICT (event_id, endpoint) DO NOTHING`

// qClaim claims the due heads: the oldest pending delivery of each
// (endpoint, rule, subject), if its next attempt is due and no live claim
// holds it. The claim is re-checked on the row (two dispatchers never
// claim the same one).
const qClaim = `
WITH heads AS (
    SELECT DISTINCT ON (endpoint, rule, subject) event_id, endpoint, next_attempt_at, claimed_until
    FROM alert_deliveries WHERE state = 'pending'
    ORDER BY endpoint, rule, subject, seq
), due AS (
    SELECT event_id, endpoint FROM heads
    WHERE next_attempt_at <= now() AND (claimed_until IS NULL OR claimed_until < now())
    ORDER BY next_attempt_at
    LIMIT @limit
)
UPDATE alert_deliveries d SET claimed_until = now() + make_interval(secs => @claim)
FROM due, alert_events e
WHERE d.event_id = due.event_id AND d.endpoint = due.endpoint AND e.id = d.event_id
  AND d.state = 'pending' AND (d.claimed_until IS NULL OR d.claimed_until < now())
RETURNING d.event_id, d.endpoint, d.rule, d.subject, e.meter, e.type, e.body, d.attempts, d.backoff_attempts`

const qRelease = `UPDATE alert_deliveries SET claimed_until = NULL WHERE event_id = $1 AND endpoint = $2 AND state = 'pending'`

// qDelivered returns how long the delivery took, from when it was
// written, by the database's clock.
const qDelivered = `
UPDATE alert_deliveries SET state = 'delivered', attempts = attempts + 1, last_attempt_at = now(), last_status = @status,
       last_error = NULL, delivered_at = now(), claimed_until = NULL
WHERE event_id = @id AND endpoint = @endpoint AND state = 'pending'
RETURNING extract(epoch FROM now() - created_at)::float8`

// qAttemptFailed counts the attempt twice: in attempts (every attempt, as
// shown) and in backoff_attempts (those since the delivery was last made
// pending, which the backoff counts).
const qAttemptFailed = `
UPDATE alert_deliveries SET attempts = attempts + 1, backoff_attempts = backoff_attempts + 1, last_attempt_at = now(), last_status = @status, last_error = @error,
       next_attempt_at = now() + make_interval(secs => @backoff), claimed_until = NULL,
       state = CASE WHEN now() + make_interval(secs => @backoff) >= give_up_at THEN 'failed' ELSE 'pending' END
WHERE event_id = @id AND endpoint = @endpoint AND state = 'pending'
RETURNING state`

const qOldestPending = `SELECT coalesce(extract(epoch FROM now() - min(created_at)), 0)::float8 FROM alert_deliveries WHERE state = 'pending'`

// qRedeliver starts the backoff again (backoff_attempts 0): a receiver
// mended after its deliveries failed gets them after 1 s, 2 s, 4 s … again,
// not at the hour the failed attempts had reached. attempts goes on.
const qRedeliver = `
UPDATE alert_deliveries SET state = 'pending', next_attempt_at = now(), claimed_until = NULL, backoff_attempts = 0,
       give_up_at = now() + make_interval(secs => @retry_for)
WHERE event_id = @id AND (state = 'failed' OR state = 'delivered' AND NOT EXISTS (
    SELECT 1 FROM alert_deliveries f WHERE f.event_id = @id AND f.state = 'failed'))`

const qEventExists = `SELECT EXISTS (SELECT 1 FROM alert_events WHERE id = $1)`

// qEvents lists events newest first, with their deliveries, below seq
// @before (the largest bigint for the first page); qEventsOfRule one rule's
// (alert_events_rule); qEventsInState those with a delivery in @state (the
// page of events chosen first, by alert_deliveries_state, a delivery
// naming its event's rule), qEventsOfRuleInState one rule's of those. Only
// the page's deliveries are read. A statement per filter, not one with
// "@rule IS NULL OR …": as the generic plan Postgres settles on for a
// prepared statement, one plan for every filter read every event newer
// than the page (and every other rule's) on the way.
const (
	qEventsSelect = `
SELECT e.id, e.seq, e.rule, e.subject, e.type, e.body, e.occurred_at,
       coalesce((SELECT json_agg(json_build_object('endpoint', d.endpoint, 'state', d.state, 'attempts', d.attempts,
            'last_attempt_at', d.last_attempt_at, 'last_status', d.last_status, 'last_error', d.last_error,
            'next_attempt_at', CASE WHEN d.state = 'pending' THEN d.next_attempt_at END, 'delivered_at', d.delivered_at)
            ORDER BY d.endpoint) FROM alert_deliveries d WHERE d.event_id = e.id), '[]')
FROM alert_events e
WHERE `
	qEventsOrder = `
ORDER BY e.seq DESC
LIMIT @limit`
	qEventsInStateWhere = `e.seq = ANY (ARRAY(
        SELECT DISTINCT x.seq FROM alert_deliveries x
        WHERE x.state = @state AND x.seq < @before`
	qEventsInStateEnd = `
        ORDER BY x.seq DESC LIMIT @limit))`

	qEvents              = qEventsSelect + `e.seq < @before` + qEventsOrder
	qEventsOfRule        = qEventsSelect + `e.rule = @rule AND e.seq < @before` + qEventsOrder
	qEventsInState       = qEventsSelect + qEventsInStateWhere + qEventsInStateEnd + qEventsOrder
	qEventsOfRuleInState = qEventsSelect + qEventsInStateWhere + ` AND x.rule = @rule` + qEventsInStateEnd + qEventsOrder
)

const qWebhooks = `SELECT name, url, events, created_at, updated_at, rotated_at, previous_until FROM alert_webhooks ORDER BY name`
const qWebhook = `SELECT name, url, events, created_at, updated_at, rotated_at, previous_until FROM alert_webhooks WHERE name = $1`

// qWebhookSecrets: the previous secret only while its overlap lasts.
const qWebhookSecrets = `
SELECT name, url, events, secret, CASE WHEN previous_until > now() THEN previous_secret END
FROM alert_webhooks`

const qPutWebhook = `
INSERT INTO alert_webhooks AS w (name, url, events, secret, created_at, updated_at, rotated_at)
VALUES (@name, @url, @events, @secret, @at, @at, @at)
ON CONFLICT (name) DO UPDATE SET url = EXCLUDED.url, events = EXCLUDED.events, updated_at = EXCLUDED.updated_at
RETURNING (xmax = 0)`

// qRotateSecret: the secret replaced is the previous one, until @keep_us
// microseconds after the rotation (@keep_us NULL: none). Both times are
// now(), the clock qWebhookSecrets reads previous_until by.
const qRotateSecret = `
UPDATE alert_webhooks
SET previous_secret = CASE WHEN @keep_us::bigint IS NOT NULL THEN secret END,
    previous_until = now() + @keep_us::bigint * interval '1 microsecond',
    secret = @secret, rotated_at = now()
WHERE name = @name`

// qWebhookUsers is every live rule naming webhook $1 among its endpoints.
const qWebhookUsers = `
SELECT coalesce(array_agg(name ORDER BY name), '{}') FROM (
    SELECT DISTINCT ON (name) name, endpoints, deleted FROM alert_rules ORDER BY name, version DESC
) r WHERE NOT deleted AND $1 = ANY(endpoints)`

const qDeleteWebhook = `DELETE FROM alert_webhooks WHERE name = $1`

const qLockWebhook = `SELECT 1 FROM alert_webhooks WHERE name = $1 FOR UPDATE`

// qFailDeliveriesOf fails the pending deliveries to a webhook being deleted.
const qFailDeliveriesOf = `
UPDATE alert_deliveries SET state = 'failed', last_error = 'the webhook was deleted', claimed_until = NULL
WHERE endpoint = $1 AND state = 'pending'`
