-- GET /v1/tokens pages every token oldest first, by (created_at, id). A
-- deployment has a token per customer or more (100,000 customers), and
-- each page read them all before; this index reads a page of them.

-- +goose Up
CREATE INDEX api_tokens_created ON api_tokens (created_at, id);

-- +goose Down
DROP INDEX api_tokens_created;
