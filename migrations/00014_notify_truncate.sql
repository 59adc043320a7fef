-- TRUNCATE fires no INSERT, UPDATE or DELETE trigger, so migration 00007
-- left it unheard: `TRUNCATE api_tokens` removed every token while API
-- processes kept accepting the ones they had cached, and a truncated
-- rollup table kept being served from the usage cache. Each table the
-- API's caches are read from now notifies channel tally_api_cache of a
-- TRUNCATE, with payload {"truncated": "<table>"}: the API then forgets
-- every cached answer and token, and reads the positions afresh.

-- +goose Up
-- +goose StatementBegin
CREATE FUNCTION tally_notify_truncate() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    PERFORM pg_notify('tally_api_cache', json_build_object('truncated', TG_TABLE_NAME)::text);
    RETURN NULL;
END
$$;
-- +goose StatementEnd

CREATE TRIGGER api_tokens_notify_truncate AFTER TRUNCATE ON api_tokens
    FOR EACH STATEMENT EXECUTE FUNCTION tally_notify_truncate();
CREATE TRIGGER rollups_notify_truncate AFTER TRUNCATE ON rollups
    FOR EACH STATEMENT EXECUTE FUNCTION tally_notify_truncate();
CREATE TRIGGER rollups_daily_notify_truncate AFTER TRUNCATE ON rollups_daily
    FOR EACH STATEMENT EXECUTE FUNCTION tally_notify_truncate();
CREATE TRIGGER period_closes_notify_truncate AFTER TRUNCATE ON period_closes
    FOR EACH STATEMENT EXECUTE FUNCTION tally_notify_truncate();
CREATE TRIGGER ingest_customers_notify_truncate AFTER TRUNCATE ON ingest_customers
    FOR EACH STATEMENT EXECUTE FUNCTION tally_notify_truncate();
CREATE TRIGGER ingest_partitions_notify_truncate AFTER TRUNCATE ON ingest_partitions
    FOR EACH STATEMENT EXECUTE FUNCTION tally_notify_truncate();

-- +goose Down
DROP TRIGGER ingest_partitions_notify_truncate ON ingest_partitions;
DROP TRIGGER ingest_customers_notify_truncate ON ingest_customers;
DROP TRIGGER period_closes_notify_truncate ON period_closes;
DROP TRIGGER rollups_daily_notify_truncate ON rollups_daily;
DROP TRIGGER rollups_notify_truncate ON rollups;
DROP TRIGGER api_tokens_notify_truncate ON api_tokens;
DROP FUNCTION tally_notify_truncate();
