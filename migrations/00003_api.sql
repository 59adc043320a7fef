-- Customer API tokens (docs/design.md §7). Why it looks like this:
--  * Only the SHA-256 of a token is stored, never the token: a database dump,
--    a backup or a read replica leaks no usable credential. Tokens are 256
--    random bits, so an unsalted fast hash is enough (there is nothing to
--    brute-force) and it lets a request find its token by an index lookup.
--  * A token belongs to one customer and may only read that customer's data.
--    The admin token is configuration (TALLY_ADMIN_TOKEN), not a row.
--  * Revocation sets revoked_at and never deletes the row, so an audit can
--    still tell which token existed, for whom, and when it stopped working.
--  * rollups_usage serves the usage endpoint (one customer, one period, all
--    or one meter) by an index-only scan: the rows of one customer are
--    spread over the heap in arrival order, so reading them through the
--    primary key costs a page per hour bucket (about 10 ms for a month on
--    10M rows instead of 0.1 ms). INCLUDE (quantity) makes rollup updates
--    non-HOT; ingest updates few rollup rows per micro-batch, so reads win.

-- +goose Up
CREATE TABLE api_tokens (
    id          uuid        PRIMARY KEY,  -- UUIDv7; shown by `tally tokens list`, used to revoke
    customer    text        NOT NULL CHECK (customer ~ '^[A-Za-z0-9._:-]{1,128}$'),
    description text        NOT NULL DEFAULT '',
    token_hash  bytea       NOT NULL UNIQUE CHECK (octet_length(token_hash) = 32),
    created_at  timestamptz NOT NULL,
    revoked_at  timestamptz
);
CREATE INDEX api_tokens_customer ON api_tokens (customer, created_at);

CREATE INDEX rollups_usage ON rollups (customer, period_start, meter, bucket) INCLUDE (quantity);

-- +goose Down
DROP INDEX rollups_usage;
DROP TABLE api_tokens;
