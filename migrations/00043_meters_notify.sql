-- +goose Up
-- A usage answer of one meter speaks its declared kind (docs/design.md
-- §16): a declared gauge or unique meter without data answers at zero in
-- its kind's shape, read from meters. A declaration therefore changes
-- cached answers of every customer, and every API process must hear of it,
-- not only the one that served the PUT: any write to meters notifies
-- channel tally_api_cache as a truncation does ({"truncated": "meters"}),
-- and API processes forget every cached answer. Declarations are rare.
CREATE TRIGGER meters_notify_change AFTER INSERT OR UPDATE OR DELETE ON meters
    FOR EACH STATEMENT EXECUTE FUNCTION tally_notify_truncate();
CREATE TRIGGER meters_notify_truncate AFTER TRUNCATE ON meters
    FOR EACH STATEMENT EXECUTE FUNCTION tally_notify_truncate();

-- +goose Down
DROP TRIGGER meters_notify_truncate ON meters;
DROP TRIGGER meters_notify_change ON meters;
