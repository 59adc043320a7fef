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
--    left as it is and counted in a WARNING.
--  * A period starting at such a midnight or after it, before the next
--    day's first instant (Havana, daily at 23:00 or monthly at 23:30), had
--    its first local day and the next kept in one bucket, keyed by the
--    period's start: new readings of the next day would start a bucket
--    overlapping it. Such a bucket is split at the next day's first
--    instant: its gauge buckets recomputed from gauge_points, its unique
--    readings of the next day re-keyed, each member day keeping one
--    counted reading (the first written), and the two days' counts
--    recounted; the period's count stays. A gauge bucket whose first
--    reading fell before the split was left ending where it starts (the
--    end of the bucket's first row stayed): its two buckets get the right
--    bounds from the split and the period's end.
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
       coalesce(nullif(z.anchor_time, ''), '00:00')::time AS anchor_time, z.cadence
FROM (SELECT DISTINCT customer, period_start FROM gauge_days
      UNION SELECT DISTINCT customer, period_start FROM unique_counts) p
LEFT JOIN customers c ON c.id = p.customer
LEFT JOIN LATERAL (
    SELECT e.v -> 'calendar' ->> 'zone' AS zone, e.v -> 'calendar' ->> 'anchor_time' AS anchor_time,
           e.v -> 'calendar' ->> 'cadence' AS cadence
    FROM jsonb_array_elements(c.schedule) WITH ORDINALITY AS e(v, i)
    WHERE e.i = 1 OR (e.v ->> 'effective_from')::timestamptz <= p.period_start
    ORDER BY e.i DESC
    LIMIT 1) z ON true;

-- A period starting at or after time.Date's midnight of the next local
-- date but before that date's first instant (Havana, daily at 23:00 or
-- 23:30 on the 7th): the build before keyed that date's readings by the
-- period's start too, one bucket over both local days. Such a bucket is
-- split at the next date's first instant (split) first, so that the
-- re-keying below finds only the bounds of single days. next_end is
-- where the next day's bucket ends: the stored end when it lies past the
-- split (min(next midnight, period end), as the build before cut it), or,
-- for a bucket the build before left ending where it starts (its first
-- reading fell before the split: the end of the first row written
-- stayed), the next date's end cut at a daily period's end.
CREATE TEMPORARY TABLE day_splits ON COMMIT DROP AS
SELECT z.customer, z.period_start, x.split,
       least(tally_resolve_wall(z.zone, (x.d + 1)::timestamp),
             CASE WHEN z.cadence = 'daily' THEN tally_resolve_wall(z.zone, x.d + z.anchor_time) END) AS next_end
FROM day_zones z
CROSS JOIN LATERAL (SELECT (z.period_start AT TIME ZONE z.zone)::date + 1 AS d) d
CROSS JOIN LATERAL (SELECT d.d, tally_resolve_wall(z.zone, d.d::timestamp) AS split) x
WHERE tally_go_midnight(z.zone, d.d) <= z.period_start AND z.period_start < x.split;

-- Gauge buckets to recompute from their change points (below).
CREATE TEMPORARY TABLE day_gauges (customer text, meter text, day_start timestamptz) ON COMMIT DROP;

-- Gauges: the stretched bucket's change points before the split stay in
-- it, those after go to a bucket of the next day; as the ledger writes
-- them, a bucket without change points has no row (the level carried in
-- holds through it).
CREATE TEMPORARY TABLE day_stretched ON COMMIT DROP AS
SELECT g.customer, g.meter, g.day_start, x.split,
       CASE WHEN g.day_end > x.split THEN g.day_end ELSE x.next_end END AS next_end,
       EXISTS (SELECT 1 FROM gauge_points p WHERE p.customer = g.customer AND p.meter = g.meter
               AND p.at >= g.day_start AND p.at < x.split) AS before_split,
       EXISTS (SELECT 1 FROM gauge_points p WHERE p.customer = g.customer AND p.meter = g.meter
               AND p.at >= x.split AND p.at < CASE WHEN g.day_end > x.split THEN g.day_end ELSE x.next_end END) AS after_split
FROM gauge_days g JOIN day_splits x USING (customer, period_start)
WHERE g.day_start = g.period_start AND g.day_end <> x.split;
INSERT INTO gauge_days (customer, meter, day_start, day_end, period_start, level_in, unit_seconds, level_out)
SELECT s.customer, s.meter, s.split, s.next_end, s.day_start, 0, 0, 0 FROM day_stretched s WHERE s.after_split
ON CONFLICT (customer, meter, day_start) DO NOTHING;
INSERT INTO day_gauges SELECT customer, meter, split FROM day_stretched WHERE after_split;
DELETE FROM gauge_days g USING day_stretched s
WHERE g.customer = s.customer AND g.meter = s.meter AND g.day_start = s.day_start AND s.after_split AND NOT s.before_split;
UPDATE gauge_days g SET day_end = s.split FROM day_stretched s
WHERE g.customer = s.customer AND g.meter = s.meter AND g.day_start = s.day_start AND (s.before_split OR NOT s.after_split);
INSERT INTO day_gauges SELECT customer, meter, day_start FROM day_stretched WHERE before_split OR NOT after_split;

-- Unique meters: the readings of the stretched day from the split on
-- (through the seq ranges of the period's streams) go to the next day.
CREATE TEMPORARY TABLE day_split_meters ON COMMIT DROP AS
WITH moved AS (
    UPDATE unique_readings r SET day = x.split
    FROM day_splits x
    JOIN stream_periods sp ON sp.customer = x.customer AND sp.period_start = x.period_start
    WHERE r.stream_id = sp.stream_id AND r.seq BETWEEN sp.min_seq AND sp.max_seq
      AND r.period_start = x.period_start AND r.day = x.period_start AND r.occurred_at >= x.split
    RETURNING r.customer, r.meter, r.period_start, x.split)
SELECT DISTINCT * FROM moved;

-- Each member day of the two keeps one counted reading: the one counted
-- before (the first written of the stretched day is the first of its own
-- day), or else, as the ledger marks the first reading written for a
-- member and day, the first by ingested_at (a micro-batch's readings
-- share it: then by stream and seq, the order a stream's readings come
-- in). A reading newly counted goes into the member index when its
-- period's counted readings are there (unique_counts.indexed).
UPDATE unique_readings r SET counted = true, indexed = c.indexed
FROM (
    SELECT DISTINCT ON (r.customer, r.meter, r.member, r.day) r.stream_id, r.seq, r.customer, r.meter, r.period_start,
           bool_or(r.counted) OVER (PARTITION BY r.customer, r.meter, r.member, r.day) AS held
    FROM day_split_meters m
    JOIN stream_periods sp ON sp.customer = m.customer AND sp.period_start = m.period_start
    JOIN unique_readings r ON r.stream_id = sp.stream_id AND r.seq BETWEEN sp.min_seq AND sp.max_seq
    WHERE r.meter = m.meter AND r.period_start = m.period_start AND r.day IN (m.period_start, m.split)
    ORDER BY r.customer, r.meter, r.member, r.day, r.ingested_at, r.stream_id, r.seq) f
JOIN unique_counts c ON c.customer = f.customer AND c.meter = f.meter AND c.period_start = f.period_start
                    AND NOT c.per_day AND c.day = f.period_start
WHERE NOT f.held AND r.stream_id = f.stream_id AND r.seq = f.seq;

-- The two days' counts: their counted readings. The period's own count
-- stays: a member counts once in the period whatever its days.
DELETE FROM unique_counts c USING day_split_meters m
WHERE c.customer = m.customer AND c.meter = m.meter AND c.period_start = m.period_start AND c.per_day
  AND c.day IN (m.period_start, m.split);
INSERT INTO unique_counts (customer, meter, period_start, per_day, day, members, indexed)
SELECT m.customer, m.meter, m.period_start, true, r.day, count(*), bool_or(c.indexed)
FROM day_split_meters m
JOIN stream_periods sp ON sp.customer = m.customer AND sp.period_start = m.period_start
JOIN unique_readings r ON r.stream_id = sp.stream_id AND r.seq BETWEEN sp.min_seq AND sp.max_seq
JOIN unique_counts c ON c.customer = m.customer AND c.meter = m.meter AND c.period_start = m.period_start
                    AND NOT c.per_day AND c.day = m.period_start
WHERE r.meter = m.meter AND r.period_start = m.period_start AND r.day IN (m.period_start, m.split) AND r.counted
GROUP BY m.customer, m.meter, m.period_start, r.day;

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
