-- Gauge readings are found through their streams, no longer by an index of
-- customer, meter and time. Why:
--  * That index cost every reading a third B-tree entry (about 90 bytes of
--    WAL and one WAL record per reading, as much as the operation id's
--    key), and only reconciliation and the close gate read it: every
--    reading of a customer's gauge, or the count of a customer's readings
--    before a period's end, never a range of time alone.
--  * Those reads now go through gauge_streams (one row per stream, with
--    its customer and meter, indexed here) and the readings' primary key
--    (stream_id, seq): the same rows, found a stream at a time.
--  * gauge_streams is written once per stream and micro-batch, and its
--    updates never change customer or meter.

-- +goose Up
CREATE INDEX gauge_streams_customer ON gauge_streams (customer, meter);
DROP INDEX gauge_readings_customer;

-- +goose Down
CREATE INDEX gauge_readings_customer ON gauge_readings (customer, meter, occurred_at);
DROP INDEX gauge_streams_customer;
