-- Unique meters count their members from the readings themselves
-- (docs/design.md §16). Why:
--  * Every unique record wrote its reading and two member rows (its
--    period's and its bucket day's) in unique_members, each through
--    INSERT ... ON CONFLICT: about 1,100 bytes of WAL and 45 µs of Postgres
--    CPU per record, 0.3 × counter ingest (docs/performance.md). A reading
--    now carries its period and bucket day (DayBucket), and the first
--    reading written for a member and day is marked "counted"; a partial
--    index over the counted readings, by a hash of (customer, meter,
--    member) and period, answers what the counts need ("was this member
--    already seen in the period, on which days") in one index scan per
--    micro-batch whatever its customers, at most a row per member and day
--    however often the member is seen. The readings go in with a binary
--    COPY, and unique_members is gone.
--  * Reconciliation's recount of distinct members and the close gate's
--    fingerprint read every reading of a customer's period, counted or
--    not, as they read a counter's records: through the seq ranges of its
--    streams in stream_periods (migration 00020), which unique streams now
--    keep too (backfilled here); the check of abandoned epochs, which
--    finds its streams there, skips unique streams as before (its finding
--    speaks of totals). The index by (customer, occurred_at) is gone.
--  * The member index holds a 64-bit hash, not the text: text keys compare
--    through the database's collation and made inserts twice as dear.
--    Every look-up compares the
--    text itself on the rows the index finds, so a collision costs a row
--    read, never a count. hashtextextended is the hash Postgres's hash
--    partitioning stores, kept the same across versions for that reason.
--  * Backfill, exact: a reading's bucket day is the latest per-day member
--    row of its customer, meter and member starting at or before its
--    occurred_at (the member was active on the reading's own day, so that
--    day has a row, and no later day of the member starts before the
--    reading). A reading without one would fail the NOT NULL: the
--    migration stops rather than guess. The counted reading of a member
--    day is its earliest.

-- +goose Up
ALTER TABLE unique_readings ADD COLUMN period_start timestamptz, ADD COLUMN day timestamptz,
    ADD COLUMN member_key bigint NOT NULL GENERATED ALWAYS AS (hashtextextended(customer || '/' || meter || '/' || member, 0)) STORED,
    ADD COLUMN counted boolean NOT NULL DEFAULT false;
CREATE INDEX unique_members_backfill ON unique_members (customer, meter, member, day) WHERE per_day;
UPDATE unique_readings r SET (period_start, day) = (
    SELECT m.period_start, m.day FROM unique_members m
    WHERE m.per_day AND m.customer = r.customer AND m.meter = r.meter AND m.member = r.member AND m.day <= r.occurred_at
    ORDER BY m.day DESC LIMIT 1);
ALTER TABLE unique_readings ALTER COLUMN period_start SET NOT NULL, ALTER COLUMN day SET NOT NULL,
    ALTER COLUMN counted DROP DEFAULT;
UPDATE unique_readings r SET counted = true
FROM (SELECT DISTINCT ON (customer, meter, member, period_start, day) stream_id, seq FROM unique_readings
      ORDER BY customer, meter, member, period_start, day, occurred_at, stream_id, seq) f
WHERE r.stream_id = f.stream_id AND r.seq = f.seq;
DROP TABLE unique_members;
DROP INDEX unique_readings_customer;
CREATE INDEX unique_readings_members ON unique_readings (member_key, period_start) WHERE counted;
INSERT INTO stream_periods (customer, period_start, stream_id, min_seq, max_seq)
SELECT customer, period_start, stream_id, min(seq), max(seq) FROM unique_readings GROUP BY 1, 2, 3;

-- +goose Down
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
INSERT INTO unique_members (customer, meter, period_start, per_day, day, member, first_at)
SELECT customer, meter, period_start, false, period_start, member, min(occurred_at)
FROM unique_readings GROUP BY customer, meter, period_start, member;
INSERT INTO unique_members (customer, meter, period_start, per_day, day, member, first_at)
SELECT customer, meter, period_start, true, day, member, min(occurred_at)
FROM unique_readings GROUP BY customer, meter, period_start, day, member;
DELETE FROM stream_periods sp WHERE EXISTS (SELECT 1 FROM unique_readings r WHERE r.stream_id = sp.stream_id);
DROP INDEX unique_readings_members;
CREATE INDEX unique_readings_customer ON unique_readings (customer, occurred_at);
ALTER TABLE unique_readings DROP COLUMN period_start, DROP COLUMN day, DROP COLUMN member_key,
    DROP COLUMN counted;
