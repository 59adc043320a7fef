-- Meter kinds (docs/design.md §16): gauges (levels such as seats or bytes
-- stored) and unique counts (distinct members such as active users), kept
-- exact and incrementally, with the same stream, seq and operation-id rules
-- as counters. Why it looks like this:
--  * meters: a meter is declared once with its kind; an undeclared meter is
--    a counter. The kind never changes once the meter has streams (package
--    ledger checks that under a lock on streams).
--  * A gauge reading changes the customer's level over exactly the
--    interval it governs (from its occurred_at to the stream's next
--    reading). gauge_points holds the customer level's change points (net
--    delta per instant); gauge_days holds, per bucket (a local day of the
--    period's zone, cut at period boundaries), the level carried in, the
--    max, the level-seconds and the level carried out. A reading rewrites
--    the one or two buckets its interval starts and ends in (from their
--    change points) and shifts the buckets it covers whole by a constant;
--    a bucket without a row holds the previous row's level throughout. So
--    neither a reading nor a usage query reads the period's readings.
--  * Unique members are kept per period and per bucket day with their
--    counts beside them, maintained in the same statement as the insert:
--    a retransmit inserts nothing and counts nothing.
--  * All of it is derivable from gauge_readings and unique_readings;
--    reconciliation recomputes it from them.

-- +goose Up
CREATE TABLE meters (
    meter       text PRIMARY KEY,
    kind        text NOT NULL CHECK (kind IN ('counter', 'gauge', 'unique')),
    unit        text NOT NULL DEFAULT '',
    description text NOT NULL DEFAULT '',
    created_at  timestamptz NOT NULL,
    updated_at  timestamptz NOT NULL
);

-- A gauge stream's state: its highest seq and that reading's level (0 after
-- a final), and when a newer epoch of the same producer, customer and
-- meter began (its level ends there).
CREATE TABLE gauge_streams (
    stream_id  bigint PRIMARY KEY,
    customer   text        NOT NULL,
    meter      text        NOT NULL,
    last_seq   bigint      NOT NULL,
    last_level numeric     NOT NULL,
    last_at    timestamptz NOT NULL,
    first_at   timestamptz NOT NULL,  -- its earliest reading: where it ends older epochs
    ends_at    timestamptz
);

CREATE TABLE gauge_readings (
    stream_id    bigint      NOT NULL,
    seq          bigint      NOT NULL CHECK (seq > 0),
    operation_id uuid        NOT NULL UNIQUE,
    customer     text        NOT NULL,
    meter        text        NOT NULL,
    level        numeric     NOT NULL CHECK (level >= 0),
    occurred_at  timestamptz NOT NULL,
    final        boolean     NOT NULL,
    late_fill    boolean     NOT NULL,
    ingested_at  timestamptz NOT NULL,
    PRIMARY KEY (stream_id, seq)
);
-- Reconciliation recomputes a customer's gauges from its readings.
CREATE INDEX gauge_readings_customer ON gauge_readings (customer, meter, occurred_at);

CREATE TABLE gauge_points (
    customer text        NOT NULL,
    meter    text        NOT NULL,
    at       timestamptz NOT NULL,
    delta    numeric     NOT NULL,
    PRIMARY KEY (customer, meter, at)
);

CREATE TABLE gauge_days (
    customer     text        NOT NULL,
    meter        text        NOT NULL,
    day_start    timestamptz NOT NULL,
    day_end      timestamptz NOT NULL,
    period_start timestamptz NOT NULL,
    level_in     numeric     NOT NULL,  -- the level just before day_start
    max_prefix   numeric,               -- the highest level in [day_start, last_at); NULL when that is empty
    last_at      timestamptz,           -- the bucket's last change point, NULL when it has none
    unit_seconds numeric     NOT NULL,  -- the integral of the level over the whole bucket
    level_out    numeric     NOT NULL,  -- the level from last_at to day_end
    PRIMARY KEY (customer, meter, day_start)
);

-- unit_seconds that changed in a closed period, billed in the first period
-- not closed (a prior-period adjustment; the closed statement stays).
CREATE TABLE gauge_adjustments (
    id           uuid PRIMARY KEY,
    customer     text        NOT NULL,
    meter        text        NOT NULL,
    period_start timestamptz NOT NULL,
    prior_period timestamptz NOT NULL,
    unit_seconds numeric     NOT NULL,
    operation_id uuid        NOT NULL,
    created_at   timestamptz NOT NULL
);
CREATE INDEX gauge_adjustments_period ON gauge_adjustments (customer, period_start);
CREATE INDEX gauge_adjustments_prior ON gauge_adjustments (customer, prior_period);

CREATE TABLE unique_readings (
    stream_id    bigint      NOT NULL,
    seq          bigint      NOT NULL CHECK (seq > 0),
    operation_id uuid        NOT NULL UNIQUE,
    customer     text        NOT NULL,
    meter        text        NOT NULL,
    member       text        NOT NULL,
    occurred_at  timestamptz NOT NULL,
    final        boolean     NOT NULL,
    late_fill    boolean     NOT NULL,
    ingested_at  timestamptz NOT NULL,
    PRIMARY KEY (stream_id, seq)
);
-- Reconciliation recounts a customer's members from its readings.
CREATE INDEX unique_readings_customer ON unique_readings (customer, occurred_at);

-- day is the bucket's start (see gauge_days); period rows have day = period_start
-- and per_day false.
CREATE TABLE unique_members (
    customer     text        NOT NULL,
    meter        text        NOT NULL,
    period_start timestamptz NOT NULL,
    per_day      boolean     NOT NULL,
    day          timestamptz NOT NULL,
    member       text        NOT NULL,
    first_at     timestamptz NOT NULL,
    PRIMARY KEY (customer, meter, period_start, per_day, day, member)
);

CREATE TABLE unique_counts (
    customer     text        NOT NULL,
    meter        text        NOT NULL,
    period_start timestamptz NOT NULL,
    per_day      boolean     NOT NULL,
    day          timestamptz NOT NULL,
    members      bigint      NOT NULL,
    PRIMARY KEY (customer, meter, period_start, per_day, day)
);
-- A usage answer for every meter reads one period's counts.
CREATE INDEX unique_counts_period ON unique_counts (customer, period_start);

CREATE TRIGGER gauge_days_notify_insert AFTER INSERT ON gauge_days
    REFERENCING NEW TABLE AS changed FOR EACH STATEMENT EXECUTE FUNCTION tally_notify_customers();
CREATE TRIGGER gauge_days_notify_update AFTER UPDATE ON gauge_days
    REFERENCING NEW TABLE AS changed FOR EACH STATEMENT EXECUTE FUNCTION tally_notify_customers();
CREATE TRIGGER unique_counts_notify_insert AFTER INSERT ON unique_counts
    REFERENCING NEW TABLE AS changed FOR EACH STATEMENT EXECUTE FUNCTION tally_notify_customers();
CREATE TRIGGER unique_counts_notify_update AFTER UPDATE ON unique_counts
    REFERENCING NEW TABLE AS changed FOR EACH STATEMENT EXECUTE FUNCTION tally_notify_customers();

-- +goose Down
DROP TABLE unique_counts, unique_members, unique_readings, gauge_adjustments, gauge_days,
    gauge_points, gauge_readings, gauge_streams, meters;
