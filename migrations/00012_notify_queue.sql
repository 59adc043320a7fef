-- Two gaps in migration 00007's change notifications (channel
-- tally_api_cache):
--  * TRUNCATE fires no INSERT, UPDATE or DELETE trigger, so it went
--    unheard: `TRUNCATE api_tokens` removed every token while API
--    processes kept accepting the ones they had cached, and a truncated
--    rollup table kept being served from the usage cache. Each table the
--    API's caches are read from now notifies of a TRUNCATE, with payload
--    {"truncated": "<table>"}: the API then forgets every cached answer
--    and token, and reads the positions afresh.
--  * Postgres keeps each notification until every listening connection
--    has read it, in one queue of 8 GB for the whole server. A listener
--    that stops reading while connected (a hung process, a psql session
--    left idle in a transaction after LISTEN) makes the queue grow, and
--    once it is full every commit that notifies fails: ingest, whose
--    commits notify, would stop billing. So the triggers notify only
--    while the queue is less than half full (tally.notify_queue_limit,
--    0.5 unless set). API processes stop using their caches (which need
--    the notifications) when it is a quarter full, long before: at the
--    ingest benchmark's rate with a distinct customer per record, the
--    queue grows by 0.7 MB/s, so a quarter of it takes about 50 minutes.
--    Checking the queue costs a shared lock and a subtraction per
--    notifying statement.

-- +goose Up
-- +goose StatementBegin
CREATE OR REPLACE FUNCTION tally_notify_customers() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    IF pg_notification_queue_usage() >= coalesce(nullif(current_setting('tally.notify_queue_limit', true), '')::float8, 0.5) THEN
        RETURN NULL; -- the queue is filling: see the top of this file
    END IF;
    -- Sorted, so the same customers give the same payloads: Postgres
    -- sends identical payloads of one transaction once, and an ingest
    -- micro-batch writes the same customers to rollups and rollups_daily.
    PERFORM pg_notify('tally_api_cache', json_build_object('customers', json_agg(customer ORDER BY customer))::text)
    FROM (SELECT customer, (row_number() OVER (ORDER BY customer) - 1) / 50 AS chunk
          FROM (SELECT DISTINCT customer FROM changed) d) c
    GROUP BY chunk ORDER BY chunk;
    RETURN NULL;
END
$$;
-- +goose StatementEnd

-- +goose StatementBegin
CREATE OR REPLACE FUNCTION tally_notify_position() RETURNS trigger LANGUAGE plpgsql AS $$
DECLARE
    r ingest_partitions := CASE WHEN TG_OP = 'DELETE' THEN OLD ELSE NEW END;
BEGIN
    IF pg_notification_queue_usage() >= coalesce(nullif(current_setting('tally.notify_queue_limit', true), '')::float8, 0.5) THEN
        RETURN NULL; -- the queue is filling: see the top of this file
    END IF;
    PERFORM pg_notify('tally_api_cache', json_build_object('topic', r.topic, 'partition', r.partition,
        'applied_through', r.applied_through, 'deleted', TG_OP = 'DELETE')::text);
    RETURN NULL;
END
$$;
-- +goose StatementEnd

-- +goose StatementBegin
CREATE OR REPLACE FUNCTION tally_notify_tokens() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    IF pg_notification_queue_usage() >= coalesce(nullif(current_setting('tally.notify_queue_limit', true), '')::float8, 0.5) THEN
        RETURN NULL; -- the queue is filling: see the top of this file
    END IF;
    PERFORM pg_notify('tally_api_cache', json_build_object('tokens', json_agg(encode(token_hash, 'hex')))::text)
    FROM (SELECT token_hash, (row_number() OVER () - 1) / 50 AS chunk FROM changed) c
    GROUP BY chunk;
    RETURN NULL;
END
$$;
-- +goose StatementEnd

-- +goose StatementBegin
CREATE FUNCTION tally_notify_truncate() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    IF pg_notification_queue_usage() >= coalesce(nullif(current_setting('tally.notify_queue_limit', true), '')::float8, 0.5) THEN
        RETURN NULL; -- the queue is filling: see the top of this file
    END IF;
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

-- As migration 00007 defined them.
-- +goose StatementBegin
CREATE OR REPLACE FUNCTION tally_notify_customers() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    -- Sorted, so the same customers give the same payloads: Postgres
    -- sends identical payloads of one transaction once, and an ingest
    -- micro-batch writes the same customers to rollups and rollups_daily.
    PERFORM pg_notify('tally_api_cache', json_build_object('customers', json_agg(customer ORDER BY customer))::text)
    FROM (SELECT customer, (row_number() OVER (ORDER BY customer) - 1) / 50 AS chunk
          FROM (SELECT DISTINCT customer FROM changed) d) c
    GROUP BY chunk ORDER BY chunk;
    RETURN NULL;
END
$$;
-- +goose StatementEnd

-- +goose StatementBegin
CREATE OR REPLACE FUNCTION tally_notify_position() RETURNS trigger LANGUAGE plpgsql AS $$
DECLARE
    r ingest_partitions := CASE WHEN TG_OP = 'DELETE' THEN OLD ELSE NEW END;
BEGIN
    PERFORM pg_notify('tally_api_cache', json_build_object('topic', r.topic, 'partition', r.partition,
        'applied_through', r.applied_through, 'deleted', TG_OP = 'DELETE')::text);
    RETURN NULL;
END
$$;
-- +goose StatementEnd

-- +goose StatementBegin
CREATE OR REPLACE FUNCTION tally_notify_tokens() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    PERFORM pg_notify('tally_api_cache', json_build_object('tokens', json_agg(encode(token_hash, 'hex')))::text)
    FROM (SELECT token_hash, (row_number() OVER () - 1) / 50 AS chunk FROM changed) c
    GROUP BY chunk;
    RETURN NULL;
END
$$;
-- +goose StatementEnd

