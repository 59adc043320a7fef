-- +goose Up
-- A webhook's secret may be rotated with an overlap
-- (POST /v1/webhooks/{name}/rotate-secret {"keep_previous_for": "24h"}):
-- until previous_until, deliveries carry a signature by the previous
-- secret beside the new one's, so a receiver can switch secrets without
-- refusing a delivery. Both are NULL when there is no overlap.
ALTER TABLE alert_webhooks
    ADD COLUMN previous_secret text,
    ADD COLUMN previous_until  timestamptz,
    ADD CONSTRAINT alert_webhooks_previous CHECK ((previous_secret IS NULL) = (previous_until IS NULL));

-- +goose Down
ALTER TABLE alert_webhooks
    DROP CONSTRAINT alert_webhooks_previous,
    DROP COLUMN previous_until,
    DROP COLUMN previous_secret;
