-- No single message may halt a partition.
--  * A Kafka tombstone has a null value and a message may have a null key.
--    Dead letters keep exactly what arrived, so raw may be NULL (a null
--    value) as well as empty (an empty value); before this, the NOT NULL
--    constraint made a tombstone's dead letter fail its micro-batch, which
--    was then retried forever and stopped the whole partition.
--  * A partition whose micro-batch keeps failing (Postgres down, or a
--    message the database refuses while it is being isolated) records since
--    when and why on its row, outside the failing transaction, so the API
--    (a separate process) can show it in /v1/ingest/status and /readyz.
--    Both are cleared by the next commit. Neither column is watched by the
--    position-change notification trigger (it fires on applied_through).

-- +goose Up
ALTER TABLE dead_letters ALTER COLUMN raw DROP NOT NULL;
ALTER TABLE ingest_partitions
    ADD COLUMN retrying_since timestamptz,
    ADD COLUMN last_error     text;

-- +goose Down
ALTER TABLE ingest_partitions DROP COLUMN last_error, DROP COLUMN retrying_since;
UPDATE dead_letters SET raw = ''::bytea WHERE raw IS NULL; -- keeps the row; loses only null vs empty
ALTER TABLE dead_letters ALTER COLUMN raw SET NOT NULL;
