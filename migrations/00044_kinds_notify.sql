-- A gauge's or unique meter's usage answer is read from gauge_days,
-- gauge_points (a bucket with readings stamped ahead of the read),
-- gauge_adjustments (prior-period unit-seconds) and unique_counts
-- (docs/design.md §16). Migration 00032 notified channel tally_api_cache
-- only of INSERT and UPDATE of gauge_days and unique_counts, the writes the
-- ledger makes; a hand-made fix in psql (a DELETE, a TRUNCATE, an
-- adjustment inserted or corrected) changed answers the API processes kept
-- serving from their caches until UsageCacheTTL. Every write to those
-- tables now notifies, as migrations 00007 and 00012 do for the counters'
-- tables: the customers a row change names, {"truncated": ...} for a
-- TRUNCATE. gauge_points and gauge_adjustments are written by the ledger
-- in the transaction that writes the customer's gauge_days, with the same
-- customers, so their notifications are identical payloads of one
-- transaction, which Postgres sends once.

-- +goose Up
CREATE TRIGGER gauge_days_notify_delete AFTER DELETE ON gauge_days
    REFERENCING OLD TABLE AS changed FOR EACH STATEMENT EXECUTE FUNCTION tally_notify_customers();
CREATE TRIGGER gauge_days_notify_truncate AFTER TRUNCATE ON gauge_days
    FOR EACH STATEMENT EXECUTE FUNCTION tally_notify_truncate();

CREATE TRIGGER unique_counts_notify_delete AFTER DELETE ON unique_counts
    REFERENCING OLD TABLE AS changed FOR EACH STATEMENT EXECUTE FUNCTION tally_notify_customers();
CREATE TRIGGER unique_counts_notify_truncate AFTER TRUNCATE ON unique_counts
    FOR EACH STATEMENT EXECUTE FUNCTION tally_notify_truncate();

CREATE TRIGGER gauge_adjustments_notify_insert AFTER INSERT ON gauge_adjustments
    REFERENCING NEW TABLE AS changed FOR EACH STATEMENT EXECUTE FUNCTION tally_notify_customers();
CREATE TRIGGER gauge_adjustments_notify_update AFTER UPDATE ON gauge_adjustments
    REFERENCING NEW TABLE AS changed FOR EACH STATEMENT EXECUTE FUNCTION tally_notify_customers();
CREATE TRIGGER gauge_adjustments_notify_delete AFTER DELETE ON gauge_adjustments
    REFERENCING OLD TABLE AS changed FOR EACH STATEMENT EXECUTE FUNCTION tally_notify_customers();
CREATE TRIGGER gauge_adjustments_notify_truncate AFTER TRUNCATE ON gauge_adjustments
    FOR EACH STATEMENT EXECUTE FUNCTION tally_notify_truncate();

CREATE TRIGGER gauge_points_notify_insert AFTER INSERT ON gauge_points
    REFERENCING NEW TABLE AS changed FOR EACH STATEMENT EXECUTE FUNCTION tally_notify_customers();
CREATE TRIGGER gauge_points_notify_update AFTER UPDATE ON gauge_points
    REFERENCING NEW TABLE AS changed FOR EACH STATEMENT EXECUTE FUNCTION tally_notify_customers();
CREATE TRIGGER gauge_points_notify_delete AFTER DELETE ON gauge_points
    REFERENCING OLD TABLE AS changed FOR EACH STATEMENT EXECUTE FUNCTION tally_notify_customers();
CREATE TRIGGER gauge_points_notify_truncate AFTER TRUNCATE ON gauge_points
    FOR EACH STATEMENT EXECUTE FUNCTION tally_notify_truncate();

-- +goose Down
DROP TRIGGER gauge_points_notify_truncate ON gauge_points;
DROP TRIGGER gauge_points_notify_delete ON gauge_points;
DROP TRIGGER gauge_points_notify_update ON gauge_points;
DROP TRIGGER gauge_points_notify_insert ON gauge_points;
DROP TRIGGER gauge_adjustments_notify_truncate ON gauge_adjustments;
DROP TRIGGER gauge_adjustments_notify_delete ON gauge_adjustments;
DROP TRIGGER gauge_adjustments_notify_update ON gauge_adjustments;
DROP TRIGGER gauge_adjustments_notify_insert ON gauge_adjustments;
DROP TRIGGER unique_counts_notify_truncate ON unique_counts;
DROP TRIGGER unique_counts_notify_delete ON unique_counts;
DROP TRIGGER gauge_days_notify_truncate ON gauge_days;
DROP TRIGGER gauge_days_notify_delete ON gauge_days;
