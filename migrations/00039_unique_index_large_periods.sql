-- A period of a unique meter keeps its members in the member index
-- (unique_readings_counted) only once it holds many readings
-- (ledger.Config.UniqueIndexAfter, 100,000 by default). Why:
--  * The index entry of a new member day was the largest part of what a
--    unique reading cost beyond a counter's record: about 1.5 µs of
--    Postgres a reading, a third B-tree entry where a record has two
--    (docs/performance.md, "Gauges and unique counts").
--  * The index serves a Ledger that does not remember a period's members
--    (after a restart, a rebalance or another writer): it reads the
--    period's counted readings in one range of it, or looks the batch's
--    members up one by one when the period is too large to remember. A
--    period of fewer readings than the bound is read whole through the
--    seq ranges of its streams in stream_periods and the readings'
--    primary key instead, as reconciliation reads it: no more rows than
--    the bound, once per process and period.
--  * unique_readings.indexed says whether a counted reading is in the
--    index; unique_counts.indexed whether the period's counted readings
--    are (on every row of the period; the period row is the one read).
--    The micro-batch that takes a period past the bound marks the
--    period's counted readings indexed, once, under the period's
--    member lock.
--  * Existing rows are indexed (the default): every period written before
--    this migration keeps its index entries, and processes of the build
--    before, whose writes take the defaults, stay correct; their look-ups
--    no longer match the index's predicate and scan, so upgrade every
--    ingest member together.

-- +goose Up
ALTER TABLE unique_readings ADD COLUMN indexed boolean NOT NULL DEFAULT true;
ALTER TABLE unique_counts ADD COLUMN indexed boolean NOT NULL DEFAULT true;
CREATE INDEX unique_readings_counted_new ON unique_readings
    (hashtextextended(customer || '/' || meter, 0), period_start, hashtextextended(member, 0)) WHERE counted AND indexed;
DROP INDEX unique_readings_counted;
ALTER INDEX unique_readings_counted_new RENAME TO unique_readings_counted;

-- +goose Down
CREATE INDEX unique_readings_counted_old ON unique_readings
    (hashtextextended(customer || '/' || meter, 0), period_start, hashtextextended(member, 0)) WHERE counted;
DROP INDEX unique_readings_counted;
ALTER INDEX unique_readings_counted_old RENAME TO unique_readings_counted;
ALTER TABLE unique_counts DROP COLUMN indexed;
ALTER TABLE unique_readings DROP COLUMN indexed;
