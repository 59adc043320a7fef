-- Customer API tokens (SPEC §7). Why it looks like this:
--  * Only the SHA-256 of a token is stored, never the token: a database dump,
--    a backup or a read replica leaks no usable credential. Tokens are 256
--    random bits, so an unsalted fast hash is enough (there is nothing to
--    brute-force) and it lets a request find its token by an index lookup.
--  * A token belongs to one customer and may only read that customer's data.
--    The admin token is configuration (TALLY_ADMIN_TOKEN), not a row.
--  * Revocation sets revoked_at and never deletes the row, so an audit can
--    still tell which token existed, for whom, and when it stopped working.

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

-- +goose Down
DROP TABLE api_tokens;
