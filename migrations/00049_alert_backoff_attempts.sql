-- A delivery's wait before its next attempt grows with its failed attempts
-- (docs/design.md §15). It counted every attempt, so a delivery that failed
-- for good and was redelivered (POST /v1/alert-events/{id}/redeliver)
-- waited up to an hour after its first new failure, as it had before it
-- failed. backoff_attempts counts the failed attempts since the delivery was
-- last made pending (created or redelivered): the wait starts again at 1 s
-- after a redelivery, while attempts still counts every attempt (shown to
-- operators). Pending deliveries keep the schedule they were on.

-- +goose Up
ALTER TABLE alert_deliveries ADD COLUMN backoff_attempts integer NOT NULL DEFAULT 0;
UPDATE alert_deliveries SET backoff_attempts = attempts WHERE state = 'pending' AND attempts > 0;

-- +goose Down
ALTER TABLE alert_deliveries DROP COLUMN backoff_attempts;
