-- Quota rules, decisions and overage (docs/design.md §5). Why it looks like this:
--  * Rules are versioned and insert-only: a change is a new version with a
--    monotonic number and an effective time, so every past decision can be
--    explained by the exact rule it applied. A trigger refuses UPDATE and
--    DELETE so history cannot be rewritten by accident. Usage is never stored
--    with a rule: it is always the period's rollups, counted from the period
--    start, so a rule change can never reset usage or grant a fresh allowance.
--  * quota_decisions keeps the latest published decision per (customer,
--    meter), with the exact JSON that went to Kafka. REST serves it and a new
--    enforcer leader starts from it (it never starts empty, never re-flaps).
--  * quota_overage measures usage admitted while a quota was exceeded
--    (enforce mode) or its decision was stale, per period, customer and meter,
--    for reconciliation (docs/design.md §6 check 7).
--  * quota_leases is the enforcer's leader lease. A lease row, not an
--    advisory lock on a dedicated connection: a lease has an expiry both
--    sides agree on (Postgres's clock), so a leader that cannot reach
--    Postgres knows when to stop publishing to Kafka (an advisory lock is
--    released by the server when it notices a dead session, which the old
--    holder cannot see and may not notice for a long time); it carries a
--    fencing epoch that every decision write checks in the same transaction;
--    and it works through transaction-pooling proxies.

-- +goose Up
CREATE TABLE quota_rules (
    customer     text        NOT NULL CHECK (customer ~ '^[A-Za-z0-9._:-]{1,128}$'),
    meter        text        NOT NULL CHECK (meter ~ '^[A-Za-z0-9._:-]{1,128}$'),
    version      bigint      NOT NULL CHECK (version > 0),
    effective_at timestamptz NOT NULL,
    "limit"      numeric     NOT NULL CHECK ("limit" >= 0),
    warn_at      numeric     NOT NULL CHECK (warn_at > 0 AND warn_at <= 1),
    mode         text        NOT NULL CHECK (mode IN ('enforce', 'shadow')),
    on_stale     text        NOT NULL CHECK (on_stale IN ('allow', 'deny')),
    stale_after  interval    NOT NULL CHECK (stale_after > interval '0'),
    created_at   timestamptz NOT NULL,
    actor        text        NOT NULL CHECK (actor <> ''),
    reason       text        NOT NULL DEFAULT '',
    PRIMARY KEY (customer, meter, version)
);

-- +goose StatementBegin
CREATE FUNCTION quota_rules_insert_only() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    RAISE EXCEPTION 'quota_rules is insert-only: a rule change is a new version';
END;
$$;
-- +goose StatementEnd

CREATE TRIGGER quota_rules_insert_only
BEFORE UPDATE OR DELETE ON quota_rules
FOR EACH ROW EXECUTE FUNCTION quota_rules_insert_only();

-- The latest published decision per (customer, meter).
CREATE TABLE quota_decisions (
    customer     text        NOT NULL,
    meter        text        NOT NULL,
    rule_version bigint      NOT NULL,
    period_start timestamptz NOT NULL,
    state        text        NOT NULL CHECK (state IN ('ok', 'warning', 'exceeded')),
    used         numeric     NOT NULL,
    decided_at   timestamptz NOT NULL,
    stale        boolean     NOT NULL,  -- lag was above stale_after when decided
    leader_epoch bigint      NOT NULL,  -- the lease epoch that wrote it
    decision     jsonb       NOT NULL,  -- exactly what was published to Kafka
    PRIMARY KEY (customer, meter)
);

-- Usage admitted while exceeded (enforce mode) or stale, per period.
CREATE TABLE quota_overage (
    customer       text        NOT NULL,
    meter          text        NOT NULL,
    period_start   timestamptz NOT NULL,
    period         text        NOT NULL,  -- the period's name
    while_exceeded numeric     NOT NULL DEFAULT 0,
    while_stale    numeric     NOT NULL DEFAULT 0,
    over_limit     numeric     NOT NULL DEFAULT 0,  -- the largest used - limit seen
    updated_at     timestamptz NOT NULL,
    PRIMARY KEY (customer, meter, period_start)
);
CREATE INDEX quota_overage_period ON quota_overage (period_start);

CREATE TABLE quota_leases (
    name        text        PRIMARY KEY,
    holder      text        NOT NULL,
    epoch       bigint      NOT NULL,  -- grows by one per new holder: the fencing token
    acquired_at timestamptz NOT NULL,
    expires_at  timestamptz NOT NULL
);

-- +goose Down
DROP TABLE quota_leases, quota_overage, quota_decisions;
DROP TRIGGER quota_rules_insert_only ON quota_rules;
DROP FUNCTION quota_rules_insert_only();
DROP TABLE quota_rules;
