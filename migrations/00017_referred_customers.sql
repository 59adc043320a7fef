-- A customer exists once anything refers to it (docs/design.md §3): its
-- first usage, a quota rule, a pool membership, a customer token or a
-- grant now each create its customers row, with the default calendar from
-- the beginning (periods.RegisterCustomers). Before, only usage and a
-- calendar did, so a customer that was gated but not yet metered read as
-- unknown (404 on its calendar, usage and quotas; `tally reconcile
-- --customer` refused it) although the enforcer and admission already
-- counted it in the default calendar. This creates the customers that
-- existing references name, with that same calendar, so nothing they
-- counted moves; existing customers are left as they are.

-- +goose Up
INSERT INTO customers (id, schedule)
SELECT id, '[{"effective_from":"0001-01-01T00:00:00Z","calendar":{"cadence":"monthly","anchor_day":1,"anchor_time":"00:00","zone":"UTC"}}]'::jsonb
FROM (
    SELECT customer AS id FROM quota_rules
    UNION SELECT customer FROM api_tokens WHERE customer IS NOT NULL
    UNION SELECT customer FROM pool_members
    UNION SELECT customer FROM admission_budgets
    UNION SELECT customer FROM admission_grants
) referred
ORDER BY id
ON CONFLICT (id) DO NOTHING;

-- +goose Down
-- Nothing to undo: a customer created here is a customer like any other
-- (usage or a calendar may have been written for it since).
SELECT 1;
