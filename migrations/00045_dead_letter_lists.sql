-- GET /v1/dead-letters (and the console's list) pages by id, optionally
-- of one customer (the message key) and of the pending ones only. A large
-- deployment keeps a million dead letters, nearly all replayed or of
-- other customers: without these indexes a page of one customer's, or of
-- the pending ones, walked the primary key past every other row (20,005
-- rows read for a page of 2 among 20,000).

-- +goose Up
CREATE INDEX dead_letters_key ON dead_letters (key, id);
CREATE INDEX dead_letters_pending_id ON dead_letters (id) WHERE replayed_at IS NULL;
CREATE INDEX dead_letters_key_pending ON dead_letters (key, id) WHERE replayed_at IS NULL;

-- +goose Down
DROP INDEX dead_letters_key_pending;
DROP INDEX dead_letters_pending_id;
DROP INDEX dead_letters_key;
