-- The member index of unique meters (migration 00035) finds a batch's
-- members by one key: a hash of customer, meter and member seeded with the
-- period's start, in a hash index. Why:
--  * The B-tree by (member key, period) was looked up with two arrays (the
--    members' hashes and the batch's periods): about 2.4 µs of Postgres CPU
--    per member, three pages per descent, the dearest statement of a unique
--    micro-batch after its COPY (docs/performance.md, "Gauges and unique
--    counts"). With the period in the hash, a member's look-up is one key,
--    and a hash index answers it from its bucket page: about 0.4 µs, and
--    inserting into it costs about two thirds of the B-tree's.
--  * The key still only finds rows: every look-up compares the customer,
--    meter, member and period of the rows it finds, so a collision costs a
--    row read, never a count. hashtextextended is the hash Postgres's hash
--    partitioning stores, kept the same across versions for that reason;
--    the seed is the period's start in Unix seconds.
--  * The column is recomputed for every reading (the table is rewritten):
--    on a ledger of 400,000 unique readings about as long as 00035 took.

-- +goose Up
DROP INDEX unique_readings_members;
ALTER TABLE unique_readings DROP COLUMN member_key,
    ADD COLUMN member_key bigint NOT NULL GENERATED ALWAYS AS (
        hashtextextended(customer || '/' || meter || '/' || member,
                         extract(epoch FROM period_start - timestamptz 'epoch')::bigint)) STORED;
CREATE INDEX unique_readings_members ON unique_readings USING hash (member_key) WHERE counted;

-- +goose Down
DROP INDEX unique_readings_members;
ALTER TABLE unique_readings DROP COLUMN member_key,
    ADD COLUMN member_key bigint NOT NULL GENERATED ALWAYS AS (hashtextextended(customer || '/' || meter || '/' || member, 0)) STORED;
CREATE INDEX unique_readings_members ON unique_readings (member_key, period_start) WHERE counted;
