-- The bucket days of gauges (gauge_days) and unique meters (unique_readings.day,
-- the per-day rows of unique_counts) start at the first instant of their
-- local date (ledger.DayBucket, periods.DayStart). Before, a bucket day
-- started at time.Date's local midnight, which, on a date whose midnight
-- the zone's clocks skip (America/Havana 2026-03-08: 23:59:59 CST, then
-- 01:00 CDT), is an instant of the day before (23:00 CST), and, on a date
-- whose midnight comes twice in a zone east of UTC (Asia/Amman
-- 2021-10-29), may be the second. Such a day's bucket was keyed by that
-- instant and the day before ended there. Why this migration re-keys the
-- rows rather than leaving them:
--  * Period totals were right (the buckets still tiled the period), but
--    usage by day showed the first hour of the day in the day before, and
--    new readings of such a day, keyed by the right instant, would start a
--    second bucket overlapping the stored one.
--  * The re-keying is exact and one-to-one. A wrong bound is recognised
--    as time.Date's answer for a date D (recomputed here from Postgres's
--    zone rules: the offset at the wall time read as UTC, then the offset
--    at that instant) that is not D's first instant, and becomes D's
--    first instant (tally_resolve_wall below, a port of
--    periods.resolveWall). Each wrong key stood for exactly one local
--    day, so no two keys merge: a member counted once in a day stays
--    counted once, on the same reading, and unique_counts keeps its
--    numbers under the new key. A gauge bucket whose bounds move is
--    recomputed from gauge_points, as the ledger recomputes a bucket.
--  * A period boundary is never re-keyed. Only a calendar anchored at a
--    wall time other than 00:00 can put a period boundary between a wrong
--    bound and the right one (Havana anchored at 23:30); such a bound is
--    left as it is and counted in a WARNING. A period starting exactly at
--    such a midnight (its first bucket stretched over the next day) is not
--    split here (docs/operations.md).
--  * Postgres's zone rules stand in for Go's here, as in migration 00006:
--    the two read the same tz database on one host.
--  * Upgrade every ingest member together: a process of the build before
--    keys new readings of such days the old way.

-- +goose Up
-- +goose StatementBegin
CREATE FUNCTION tally_offset(z text, t timestamptz) RETURNS interval LANGUAGE sql IMMUTABLE AS
$$ SELECT (t AT TIME ZONE z) - (t AT TIME ZONE 'UTC') $$;
-- +goose StatementEnd

-- time.Date(y, m, d, 0, 0, 0, 0, loc): what the ledger stored.
-- +goose StatementBegin
CREATE FUNCTION tally_go_midnight(z text, d date) RETURNS timestamptz LANGUAGE sql IMMUTABLE AS
$$ SELECT (d::timestamp AT TIME ZONE 'UTC') - tally_offset(z, (d::timestamp AT TIME ZONE 'UTC') - tally_offset(z, d::timestamp AT TIME ZONE 'UTC')) $$;
-- +goose StatementEnd

-- The first instant the wall clock of zone z reads w, or, where it skips
-- w, the instant it jumps past it: periods.resolveWall, walking the
-- zone's offset spans from a day before w. A span's end is found hour by
-- hour, then to the second (tz transitions fall on whole seconds).
-- +goose StatementBegin
CREATE FUNCTION tally_resolve_wall(z text, w timestamp) RETURNS timestamptz LANGUAGE plpgsql IMMUTABLE AS $$
DECLARE
  wu timestamptz := w AT TIME ZONE 'UTC';
  t  timestamptz := wu - interval '24 hours';
  o  interval;
  e  timestamptz;
  s  timestamptz;
  lo timestamptz;
  hi timestamptz;
  mid timestamptz;
BEGIN
  LOOP
    o := tally_offset(z, t);
    e := NULL;
    s := t;
    WHILE e IS NULL AND s < wu + interval '24 hours' LOOP
      IF tally_offset(z, s + interval '1 hour') <> o THEN
        lo := s;
        hi := s + interval '1 hour';
        WHILE hi - lo > interval '1 second' LOOP
          mid := lo + date_trunc('second', (hi - lo) / 2);
          IF tally_offset(z, mid) = o THEN lo := mid; ELSE hi := mid; END IF;
        END LOOP;
        e := hi;
      END IF;
      s := s + interval '1 hour';
    END LOOP;
    IF e IS NULL OR wu - o < e THEN
      RETURN wu - o;
    END IF;
    IF wu - tally_offset(z, e) < e THEN
      RETURN e;
    END IF;
    t := e;
  END LOOP;
END $$;
-- +goose StatementEnd

-- Each stored period's zone and anchor time: the calendar in force at its
-- start, found as migration 00006 finds it.
CREATE TEMPORARY TABLE day_zones ON COMMIT DROP AS
SELECT p.customer, p.period_start, coalesce(nullif(z.zone, ''), 'UTC') AS zone,
       coalesce(nullif(z.anchor_time, ''), '00:00')::time AS anchor_time
FROM (SELECT DISTINCT customer, period_start FROM gauge_days
      UNION SELECT DISTINCT customer, period_start FROM unique_counts) p
LEFT JOIN customers c ON c.id = p.customer
LEFT JOIN LATERAL (
    SELECT e.v -> 'calendar' ->> 'zone' AS zone, e.v -> 'calendar' ->> 'anchor_time' AS anchor_time
    FROM jsonb_array_elements(c.schedule) WITH ORDINALITY AS e(v, i)
    WHERE e.i = 1 OR (e.v ->> 'effective_from')::timestamptz <= p.period_start
    ORDER BY e.i DESC
    LIMIT 1) z ON true;

-- Every stored bound that is not its period's start: whether it is
-- time.Date's midnight of its own local date or of the next, and that
-- date's first instant.
CREATE TEMPORARY TABLE day_moves ON COMMIT DROP AS
WITH bounds AS (
    SELECT customer, period_start, day_start AS old FROM gauge_days
    UNION SELECT customer, period_start, day_end FROM gauge_days
    UNION SELECT customer, period_start, day FROM unique_counts WHERE per_day),
dated AS (
    SELECT b.customer, b.period_start, b.old, z.zone, z.anchor_time, d.d
    FROM bounds b JOIN day_zones z USING (customer, period_start)
    CROSS JOIN LATERAL (VALUES ((b.old AT TIME ZONE z.zone)::date), ((b.old AT TIME ZONE z.zone)::date + 1)) AS d(d)
    WHERE b.old <> b.period_start AND tally_go_midnight(z.zone, d.d) = b.old),
starts AS (
    SELECT zone, d, tally_resolve_wall(zone, d::timestamp) AS new FROM (SELECT DISTINCT zone, d FROM dated) x)
SELECT customer, period_start, zone, anchor_time, d, old, new
FROM dated JOIN starts USING (zone, d);
DELETE FROM day_moves WHERE new = old;

-- A period boundary between the old bound and the new one (only a
-- calendar anchored off midnight can put one there): left as it is.
CREATE TEMPORARY TABLE day_moves_left ON COMMIT DROP AS
SELECT * FROM day_moves m
WHERE m.anchor_time <> '00:00' AND EXISTS (
    SELECT 1 FROM (VALUES (m.d - 1), (m.d)) AS a(d)
    WHERE tally_resolve_wall(m.zone, a.d + m.anchor_time) BETWEEN least(m.old, m.new) AND greatest(m.old, m.new));
DELETE FROM day_moves m USING day_moves_left l
WHERE m.customer = l.customer AND m.period_start = l.period_start AND m.old = l.old;

-- +goose StatementBegin
DO $$
DECLARE n bigint;
BEGIN
  SELECT count(*) INTO n FROM day_moves_left;
  IF n > 0 THEN
    RAISE WARNING 'tally: % bucket-day bounds of calendars anchored off midnight were left keyed by time.Date''s midnight (a period boundary lies between it and the day''s first instant)', n;
  END IF;
END $$;
-- +goose StatementEnd

-- Gauges: re-key the bounds, then recompute the moved buckets from their
-- change points (ledger dayRow.recompute): the level carried in, the
-- highest level before the last change point, the last change point, the
-- level-seconds and the level carried out.
CREATE TEMPORARY TABLE day_gauges (customer text, meter text, day_start timestamptz) ON COMMIT DROP;
WITH s AS (
    UPDATE gauge_days g SET day_start = m.new FROM day_moves m
    WHERE g.customer = m.customer AND g.period_start = m.period_start AND g.day_start = m.old
    RETURNING g.customer, g.meter, g.day_start)
INSERT INTO day_gauges SELECT * FROM s;
WITH e AS (
    UPDATE gauge_days g SET day_end = m.new FROM day_moves m
    WHERE g.customer = m.customer AND g.period_start = m.period_start AND g.day_end = m.old
    RETURNING g.customer, g.meter, g.day_start)
INSERT INTO day_gauges SELECT * FROM e;
UPDATE gauge_days g SET level_in = r.level_in, max_prefix = r.max_prefix, last_at = r.last_at,
    unit_seconds = r.unit_seconds, level_out = r.level_out
FROM (
    SELECT g.customer, g.meter, g.day_start, li.level_in,
           CASE WHEN pt.first_at IS NULL THEN NULL
                WHEN pt.first_at > g.day_start THEN greatest(li.level_in, pt.max_inner)
                ELSE pt.max_inner END AS max_prefix,
           pt.last_at,
           trim_scale(li.level_in * extract(epoch FROM coalesce(pt.first_at, g.day_end) - g.day_start) + coalesce(pt.inner_sec, 0)) AS unit_seconds,
           li.level_in + coalesce(pt.total, 0) AS level_out
    FROM (SELECT DISTINCT * FROM day_gauges) a
    JOIN gauge_days g USING (customer, meter, day_start)
    CROSS JOIN LATERAL (
        SELECT coalesce(sum(p.delta), 0) AS level_in FROM gauge_points p
        WHERE p.customer = g.customer AND p.meter = g.meter AND p.at < g.day_start) li
    CROSS JOIN LATERAL (
        SELECT min(x.at) AS first_at, max(x.at) AS last_at, sum(x.delta) AS total,
               li.level_in + max(x.after) FILTER (WHERE x.next IS NOT NULL) AS max_inner,
               sum((li.level_in + x.after) * extract(epoch FROM coalesce(x.next, g.day_end) - x.at)) AS inner_sec
        FROM (SELECT p.at, p.delta, sum(p.delta) OVER (ORDER BY p.at) AS after, lead(p.at) OVER (ORDER BY p.at) AS next
              FROM gauge_points p
              WHERE p.customer = g.customer AND p.meter = g.meter AND p.at >= g.day_start AND p.at < g.day_end) x) pt
) r
WHERE g.customer = r.customer AND g.meter = r.meter AND g.day_start = r.day_start;

-- Unique meters: the readings of each moved day (through the seq ranges
-- of the period's streams, as the ledger reads a period), and the day's
-- count. One key for one key: the counted readings stay counted.
UPDATE unique_readings r SET day = m.new
FROM day_moves m
JOIN stream_periods sp ON sp.customer = m.customer AND sp.period_start = m.period_start
WHERE r.stream_id = sp.stream_id AND r.seq BETWEEN sp.min_seq AND sp.max_seq
  AND r.period_start = m.period_start AND r.day = m.old;
UPDATE unique_counts c SET day = m.new FROM day_moves m
WHERE c.customer = m.customer AND c.period_start = m.period_start AND c.per_day AND c.day = m.old;

DROP FUNCTION tally_resolve_wall(text, timestamp);
DROP FUNCTION tally_go_midnight(text, date);
DROP FUNCTION tally_offset(text, timestamptz);

-- +goose Down
-- Nothing to undo: the build before reads the right keys as it reads any
-- other bucket day.
SELECT 1;
