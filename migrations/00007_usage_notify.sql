-- Change notifications for the API's caches (channel tally_api_cache).
--  * A usage answer is read from rollups, rollups_daily, period_closes,
--    ingest_customers (which partition's position is the customer's
--    as_of) and ingest_partitions (that position). Triggers on those
--    tables notify, so every writer is covered: ingest, adjustments,
--    replays, closes, and a hand-made fix in psql alike.
--  * A customer token's revocation (or deletion) notifies too, so API
--    processes stop accepting it at once rather than after their token
--    cache's TTL.
--  * Payloads are JSON. {"tokens": [hex SHA-256, ...]}: these tokens were
--    revoked or deleted. {"customers": [...]}: these customers' answers
--    changed (at most 50 ids each, well under NOTIFY's 8000 bytes; a
--    statement touching more sends several). {"topic", "partition",
--    "applied_through", "deleted"}: a partition's ingest position moved,
--    or its row was deleted.
--  * NOTIFY is delivered at commit, in commit order (a transaction's in
--    the order sent), and only to
--    listeners: a process that is not listening pays nothing but the
--    queue. The API forgets a customer's answers when told, and trusts
--    its cache only while its listening connection is up (see
--    api/usage_watch.go).
--  * Row changes are gathered per statement (transition tables), so an
--    ingest micro-batch sends one notification per 50 customers, not one
--    per row.

-- +goose Up
-- +goose StatementBegin
CREATE FUNCTION tally_notify_customers() RETURNS trigger LANGUAGE plpgsql AS $$
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
CREATE FUNCTION tally_notify_position() RETURNS trigger LANGUAGE plpgsql AS $$
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
CREATE FUNCTION tally_notify_tokens() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    PERFORM pg_notify('tally_api_cache', json_build_object('tokens', json_agg(encode(token_hash, 'hex')))::text)
    FROM (SELECT token_hash, (row_number() OVER () - 1) / 50 AS chunk FROM changed) c
    GROUP BY chunk;
    RETURN NULL;
END
$$;
-- +goose StatementEnd

CREATE TRIGGER api_tokens_notify_update AFTER UPDATE ON api_tokens
    REFERENCING NEW TABLE AS changed FOR EACH STATEMENT EXECUTE FUNCTION tally_notify_tokens();
CREATE TRIGGER api_tokens_notify_delete AFTER DELETE ON api_tokens
    REFERENCING OLD TABLE AS changed FOR EACH STATEMENT EXECUTE FUNCTION tally_notify_tokens();

-- One trigger per event: Postgres allows a transition table only on a
-- trigger for a single event.
CREATE TRIGGER rollups_notify_insert AFTER INSERT ON rollups
    REFERENCING NEW TABLE AS changed FOR EACH STATEMENT EXECUTE FUNCTION tally_notify_customers();
CREATE TRIGGER rollups_notify_update AFTER UPDATE ON rollups
    REFERENCING NEW TABLE AS changed FOR EACH STATEMENT EXECUTE FUNCTION tally_notify_customers();
CREATE TRIGGER rollups_notify_delete AFTER DELETE ON rollups
    REFERENCING OLD TABLE AS changed FOR EACH STATEMENT EXECUTE FUNCTION tally_notify_customers();

CREATE TRIGGER rollups_daily_notify_insert AFTER INSERT ON rollups_daily
    REFERENCING NEW TABLE AS changed FOR EACH STATEMENT EXECUTE FUNCTION tally_notify_customers();
CREATE TRIGGER rollups_daily_notify_update AFTER UPDATE ON rollups_daily
    REFERENCING NEW TABLE AS changed FOR EACH STATEMENT EXECUTE FUNCTION tally_notify_customers();
CREATE TRIGGER rollups_daily_notify_delete AFTER DELETE ON rollups_daily
    REFERENCING OLD TABLE AS changed FOR EACH STATEMENT EXECUTE FUNCTION tally_notify_customers();

CREATE TRIGGER period_closes_notify_insert AFTER INSERT ON period_closes
    REFERENCING NEW TABLE AS changed FOR EACH STATEMENT EXECUTE FUNCTION tally_notify_customers();
CREATE TRIGGER period_closes_notify_update AFTER UPDATE ON period_closes
    REFERENCING NEW TABLE AS changed FOR EACH STATEMENT EXECUTE FUNCTION tally_notify_customers();
CREATE TRIGGER period_closes_notify_delete AFTER DELETE ON period_closes
    REFERENCING OLD TABLE AS changed FOR EACH STATEMENT EXECUTE FUNCTION tally_notify_customers();

CREATE TRIGGER ingest_customers_notify_insert AFTER INSERT ON ingest_customers
    REFERENCING NEW TABLE AS changed FOR EACH STATEMENT EXECUTE FUNCTION tally_notify_customers();
CREATE TRIGGER ingest_customers_notify_update AFTER UPDATE ON ingest_customers
    REFERENCING NEW TABLE AS changed FOR EACH STATEMENT EXECUTE FUNCTION tally_notify_customers();
CREATE TRIGGER ingest_customers_notify_delete AFTER DELETE ON ingest_customers
    REFERENCING OLD TABLE AS changed FOR EACH STATEMENT EXECUTE FUNCTION tally_notify_customers();

-- Positions: a few rows, updated once per micro-batch per partition.
-- Deferred to commit, so a transaction's position comes after all its
-- customers: ingest moves the position first (the offset fence) and
-- books usage after, and a listener that heard the position first could
-- advance a cached answer's as_of before forgetting it.
CREATE CONSTRAINT TRIGGER ingest_partitions_notify AFTER INSERT OR DELETE OR UPDATE OF applied_through ON ingest_partitions
    DEFERRABLE INITIALLY DEFERRED FOR EACH ROW EXECUTE FUNCTION tally_notify_position();

-- +goose Down
DROP TRIGGER api_tokens_notify_delete ON api_tokens;
DROP TRIGGER api_tokens_notify_update ON api_tokens;
DROP FUNCTION tally_notify_tokens();
DROP TRIGGER ingest_partitions_notify ON ingest_partitions;
DROP TRIGGER ingest_customers_notify_delete ON ingest_customers;
DROP TRIGGER ingest_customers_notify_update ON ingest_customers;
DROP TRIGGER ingest_customers_notify_insert ON ingest_customers;
DROP TRIGGER period_closes_notify_delete ON period_closes;
DROP TRIGGER period_closes_notify_update ON period_closes;
DROP TRIGGER period_closes_notify_insert ON period_closes;
DROP TRIGGER rollups_daily_notify_delete ON rollups_daily;
DROP TRIGGER rollups_daily_notify_update ON rollups_daily;
DROP TRIGGER rollups_daily_notify_insert ON rollups_daily;
DROP TRIGGER rollups_notify_delete ON rollups;
DROP TRIGGER rollups_notify_update ON rollups;
DROP TRIGGER rollups_notify_insert ON rollups;
DROP FUNCTION tally_notify_position();
DROP FUNCTION tally_notify_customers();
