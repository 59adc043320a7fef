-- The counted readings of unique meters (the first of each member and
-- day, migration 00035) are indexed by a hash of their customer and meter,
-- then period, then the member's hash, where they were by the member's
-- hash and period. Why:
--  * A Ledger remembers the members it counted in a period
--    (ledger/unique_cache.go); a Ledger that starts remembering a period
--    already under way (after a restart, or when a customer's partition
--    moves to it) reads the period's counted readings, which this index
--    keeps together: one range scan, at most a row per member and day.
--  * A member is still found by one descent of the index, its customer,
--    meter, period and hash all being known; the key is a bigint wider.
--    Inserts cost the same: measured with COPY of 200,000 readings into
--    either index on the same server (docs/performance.md).
--  * As before, every read compares the text itself on the rows the index
--    finds, so a collision of either hash costs a row read, never a count.

-- +goose Up
CREATE INDEX unique_readings_counted ON unique_readings
    (hashtextextended(customer || '/' || meter, 0), period_start, member_key) WHERE counted;
DROP INDEX unique_readings_members;

-- +goose Down
CREATE INDEX unique_readings_members ON unique_readings (member_key, period_start) WHERE counted;
DROP INDEX unique_readings_counted;
