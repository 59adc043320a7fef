-- Where each stream was last found adding up. Reconciliation checks that a
-- stream's billed deltas add up to its last total (docs/design.md §6); it
-- summed every record of the stream at every run and close, so a nightly
-- run read each customer's whole history. A record is never changed, and
-- one arriving at or below the stream's last seq is a late fill, billed
-- nothing: once the records up to seq add up to billed, they always will.
-- A run that finds a stream adding up stores its last seq and total here,
-- and the next run and close sum only the records after that seq. A deep
-- run (--deep) still sums every record.

-- +goose Up
CREATE TABLE stream_checks (
    stream_id  bigint      PRIMARY KEY REFERENCES streams (id),
    seq        bigint      NOT NULL CHECK (seq >= 0),
    billed     numeric     NOT NULL,
    checked_at timestamptz NOT NULL
);

-- +goose Down
DROP TABLE stream_checks;
