-- Alerts (docs/design.md §15), owned by package alerts. Why:
--  * Billing teams want to be told when a customer crosses 80% or 100% of
--    its quota and when it is back below, not to poll. An alert's state
--    per (rule, subject, threshold, period) is kept here, and each
--    transition is stored with its event in the same transaction (an
--    outbox): a crash or a change of enforcer leader neither loses nor
--    repeats a transition, and the event id is derived from the rule,
--    subject, threshold, period and transition number, so a redelivery
--    carries the same id.
--  * Deliveries are rows too, one per event and endpoint, so delivery is
--    at least once and in order per (rule, subject, endpoint): only the
--    oldest pending delivery of a (endpoint, rule, subject) is attempted.
--  * alert_rules is versioned and insert-only like quota rules; a DELETE
--    is a version marked deleted, so the history says who removed it.

-- +goose Up
CREATE TABLE alert_rules (
    name               text        NOT NULL,
    version            bigint      NOT NULL,
    subject            text        NOT NULL,
    meter              text        NOT NULL,
    thresholds         jsonb       NOT NULL,
    notify_on          text[]      NOT NULL,
    hysteresis_percent numeric     NOT NULL,
    endpoints          text[]      NOT NULL,
    deleted            boolean     NOT NULL DEFAULT false,
    created_at         timestamptz NOT NULL,
    actor              text        NOT NULL,
    PRIMARY KEY (name, version)
);

CREATE TABLE alert_webhooks (
    name       text        PRIMARY KEY,
    url        text        NOT NULL,
    events     text[]      NOT NULL,
    secret     text        NOT NULL,
    created_at timestamptz NOT NULL,
    updated_at timestamptz NOT NULL,
    rotated_at timestamptz NOT NULL
);

-- One row per (rule, subject, threshold, period) that ever left ok.
-- transitions counts its transitions (the event id's last part).
CREATE TABLE alert_states (
    rule         text        NOT NULL,
    subject      text        NOT NULL,
    threshold    text        NOT NULL, -- "value:100" or "percent:80"
    period_start timestamptz NOT NULL,
    period       text        NOT NULL,
    meter        text        NOT NULL,
    state        text        NOT NULL CHECK (state IN ('ok', 'triggered')),
    transitions  integer     NOT NULL,
    used         numeric     NOT NULL,
    "limit"      numeric,
    changed_at   timestamptz NOT NULL,
    PRIMARY KEY (rule, subject, threshold, period_start)
);
CREATE INDEX alert_states_triggered ON alert_states (rule) WHERE state = 'triggered';

CREATE TABLE alert_events (
    id          uuid        PRIMARY KEY,
    seq         bigserial   NOT NULL UNIQUE, -- commit order of the one evaluator
    rule        text        NOT NULL,
    subject     text        NOT NULL,
    meter       text        NOT NULL,
    type        text        NOT NULL,
    body        text        NOT NULL,        -- the exact bytes every delivery sends
    occurred_at timestamptz NOT NULL
);
CREATE INDEX alert_events_rule ON alert_events (rule, seq);

CREATE TABLE alert_deliveries (
    event_id        uuid        NOT NULL REFERENCES alert_events (id),
    endpoint        text        NOT NULL, -- a webhook's name, or "kafka"
    rule            text        NOT NULL,
    subject         text        NOT NULL,
    seq             bigint      NOT NULL,
    state           text        NOT NULL CHECK (state IN ('pending', 'delivered', 'failed')),
    attempts        integer     NOT NULL DEFAULT 0,
    next_attempt_at timestamptz NOT NULL,
    give_up_at      timestamptz NOT NULL,
    claimed_until   timestamptz,
    last_attempt_at timestamptz,
    last_status     integer,
    last_error      text,
    delivered_at    timestamptz,
    created_at      timestamptz NOT NULL,
    PRIMARY KEY (event_id, endpoint)
);
CREATE INDEX alert_deliveries_pending ON alert_deliveries (endpoint, rule, subject, seq) WHERE state = 'pending';
CREATE INDEX alert_deliveries_state ON alert_deliveries (state, seq);

-- +goose Down
DROP TABLE alert_deliveries;
DROP TABLE alert_events;
DROP TABLE alert_states;
DROP TABLE alert_webhooks;
DROP TABLE alert_rules;
