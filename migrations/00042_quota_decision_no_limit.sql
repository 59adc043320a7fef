-- +goose Up
-- A key whose rule in force has no lagged period limit any more (a rate
-- contract, or a pool or global rule admitted exactly) gets a decision of
-- state no_limit (docs/design.md §5): it replaces the key's last period
-- decision on the topic, so gateways stop applying an exceeded one.
ALTER TABLE quota_decisions
    DROP CONSTRAINT quota_decisions_state_check,
    ADD CONSTRAINT quota_decisions_state_check CHECK (state IN ('ok', 'warning', 'exceeded', 'no_limit'));

-- +goose Down
DELETE FROM quota_decisions WHERE state = 'no_limit';
ALTER TABLE quota_decisions
    DROP CONSTRAINT quota_decisions_state_check,
    ADD CONSTRAINT quota_decisions_state_check CHECK (state IN ('ok', 'warning', 'exceeded'));
