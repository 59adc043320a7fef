-- Pools and a global budget: several budgets per request (docs/design.md §13).
-- Why it looks like this:
--  * pools are named groups of customers (a plan, a tenant group). Membership
--    is history, never overwritten: a row per stay (joined_at, left_at), so
--    "who was in the pool at t" is always answerable and a pool's usage can
--    be explained after the fact. A customer may be in several pools; at most
--    one open stay per (pool, customer).
--  * quota_scope_rules are the rules of the scopes that are not a customer:
--    'pool:<name>' and 'global'. Versioned and insert-only like quota_rules
--    (a trigger refuses UPDATE and DELETE), with mode (enforce/shadow) and
--    admission (lagged/exact). A separate table rather than a scope column on
--    quota_rules: a customer id may contain ':' and could be called
--    'global', so scopes never share a key space with customers.
--  * admission_scope_budgets is one row per (scope, meter, period) of an exact
--    pool or global rule, in the scope's own calendar (monthly, UTC). Issuing
--    locks every budget a request draws from, customer row first, then scope
--    rows sorted by (scope, meter, period_start), so two requests over
--    overlapping budgets never deadlock. consumed has the same meaning as on
--    admission_budgets.
--  * admission_grant_draws records which scope budgets a grant drew from, so
--    release frees each of them and reconciliation reads them.
--    admission_grants.draws_customer says whether the grant drew from its
--    customer's budget (a request may name a subset of its budgets).
--  * admission_budgets."limit" may be NULL: the customer's budget row of a
--    grant that drew only from pool or global budgets, when the customer has
--    no exact rule (the row still carries the grant's customer period).

-- +goose Up
CREATE TABLE pools (
    name       text        PRIMARY KEY CHECK (name ~ '^[A-Za-z0-9._-]{1,128}$'),
    created_at timestamptz NOT NULL,
    updated_at timestamptz NOT NULL
);

CREATE TABLE pool_members (
    pool      text        NOT NULL REFERENCES pools (name),
    customer  text        NOT NULL CHECK (customer ~ '^[A-Za-z0-9._:-]{1,128}$'),
    joined_at timestamptz NOT NULL,
    left_at   timestamptz CHECK (left_at >= joined_at),  -- equal: a stay that never counted
    actor     text        NOT NULL CHECK (actor <> ''),
    PRIMARY KEY (pool, customer, joined_at)
);
CREATE UNIQUE INDEX pool_members_open ON pool_members (pool, customer) WHERE left_at IS NULL;
CREATE INDEX pool_members_customer ON pool_members (customer, joined_at);

CREATE TABLE quota_scope_rules (
    scope        text        NOT NULL CHECK (scope = 'global' OR scope ~ '^pool:[A-Za-z0-9._-]{1,128}$'),
    meter        text        NOT NULL CHECK (meter ~ '^[A-Za-z0-9._:-]{1,128}$'),
    version      bigint      NOT NULL CHECK (version > 0),
    effective_at timestamptz NOT NULL,
    "limit"      numeric     NOT NULL CHECK ("limit" >= 0),
    warn_at      numeric     NOT NULL CHECK (warn_at > 0 AND warn_at <= 1),
    mode         text        NOT NULL CHECK (mode IN ('enforce', 'shadow')),
    admission    text        NOT NULL CHECK (admission IN ('lagged', 'exact')),
    created_at   timestamptz NOT NULL,
    actor        text        NOT NULL CHECK (actor <> ''),
    reason       text        NOT NULL DEFAULT '',
    PRIMARY KEY (scope, meter, version)
);

-- +goose StatementBegin
CREATE FUNCTION quota_scope_rules_insert_only() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    RAISE EXCEPTION 'quota_scope_rules is insert-only: a rule change is a new version';
END;
$$;
-- +goose StatementEnd

CREATE TRIGGER quota_scope_rules_insert_only
BEFORE UPDATE OR DELETE ON quota_scope_rules
FOR EACH ROW EXECUTE FUNCTION quota_scope_rules_insert_only();

CREATE TABLE admission_scope_budgets (
    scope        text        NOT NULL,
    meter        text        NOT NULL,
    period_start timestamptz NOT NULL,
    period_end   timestamptz NOT NULL CHECK (period_end > period_start),
    period       text        NOT NULL,
    "limit"      numeric     NOT NULL CHECK ("limit" >= 0),
    rule_version bigint      NOT NULL,
    consumed     numeric     NOT NULL DEFAULT 0 CHECK (consumed >= 0),
    updated_at   timestamptz NOT NULL,
    PRIMARY KEY (scope, meter, period_start)
);

ALTER TABLE admission_budgets ALTER COLUMN "limit" DROP NOT NULL;
ALTER TABLE admission_grants ADD COLUMN draws_customer boolean NOT NULL DEFAULT true;

CREATE TABLE admission_grant_draws (
    grant_id     uuid        NOT NULL REFERENCES admission_grants (id),
    scope        text        NOT NULL,
    meter        text        NOT NULL,
    period_start timestamptz NOT NULL,
    PRIMARY KEY (grant_id, scope),
    FOREIGN KEY (scope, meter, period_start) REFERENCES admission_scope_budgets (scope, meter, period_start)
);
CREATE INDEX admission_grant_draws_budget ON admission_grant_draws (scope, meter, period_start);

-- +goose Down
DROP TABLE admission_grant_draws, admission_scope_budgets;
ALTER TABLE admission_grants DROP COLUMN draws_customer;
DELETE FROM admission_budgets WHERE "limit" IS NULL;
ALTER TABLE admission_budgets ALTER COLUMN "limit" SET NOT NULL;
DROP TRIGGER quota_scope_rules_insert_only ON quota_scope_rules;
DROP FUNCTION quota_scope_rules_insert_only();
DROP TABLE quota_scope_rules, pool_members, pools;
