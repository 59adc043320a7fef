-- Billed usage per (customer, period, meter, local day). Why it exists:
--  * The usage endpoint's default answer is a period by day. Summing a
--    month of hourly rollups per request reads up to 744 rows per meter;
--    Postgres's cost per request grows with those rows, and under 50
--    concurrent clients it was the larger half of the API's latency. This
--    table holds at most 31 rows per meter and month.
--  * It is maintained by the ledger in the same transaction as the hourly
--    rollups, from the same amounts: day is the local date, in the zone of
--    the calendar in force at the period's start, of the hourly bucket the
--    amount went to. Calendar changes take effect at period boundaries, so
--    one period has one zone and its days are well defined.
--  * Reconciliation checks that a meter's days add up to its hours, as it
--    checks the hours against records and entries.
--  * The primary key leads with (customer, period_start) and includes the
--    quantity, so a request is one index-only range scan; updates are
--    non-HOT for it, which ingest pays once per (customer, meter, day) per
--    micro-batch.
--  * Existing hourly rollups are summed into days here, with the zone from
--    each customer's stored calendar history (Postgres's zone rules; the
--    ledger uses Go's from now on).

-- +goose Up
CREATE TABLE rollups_daily (
    customer     text        NOT NULL,
    period_start timestamptz NOT NULL,
    meter        text        NOT NULL,
    day          date        NOT NULL,
    quantity     numeric     NOT NULL,
    PRIMARY KEY (customer, period_start, meter, day) INCLUDE (quantity)
);

-- The zone of the version in force at the period's start, found like
-- periods.Schedule.CalendarAt: the newest version in force, else the first.
-- A customer without a stored calendar has the default one (UTC).
WITH zones AS (
    SELECT p.customer, p.period_start, coalesce(nullif(z.zone, ''), 'UTC') AS zone
    FROM (SELECT DISTINCT customer, period_start FROM rollups) p
    LEFT JOIN customers c ON c.id = p.customer
    LEFT JOIN LATERAL (
        SELECT e.v -> 'calendar' ->> 'zone' AS zone
        FROM jsonb_array_elements(c.schedule) WITH ORDINALITY AS e(v, i)
        WHERE e.i = 1 OR (e.v ->> 'effective_from')::timestamptz <= p.period_start
        ORDER BY e.i DESC
        LIMIT 1) z ON true
)
INSERT INTO rollups_daily (customer, period_start, meter, day, quantity)
SELECT r.customer, r.period_start, r.meter, (r.bucket AT TIME ZONE z.zone)::date, sum(r.quantity)
FROM rollups r JOIN zones z USING (customer, period_start)
GROUP BY 1, 2, 3, 4;

-- +goose Down
DROP TABLE rollups_daily;
