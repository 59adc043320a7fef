-- The rule version in force, defined once (docs/design.md §12). Why:
--  * "The version in force at an instant" is the version with the latest
--    effective_at not after that instant, ties broken by the higher
--    version. It was written into several queries in two orderings (one by
--    version alone), so admission issued grants under a version written
--    later but effective earlier, while the enforcer, REST and the console
--    showed another. These two functions are that definition, for customer
--    rules and for pool and global rules; every query that needs the
--    version in force (quota, admission, reconciliation) calls them, and
--    quota.RuleAt is a call of quota_rule_in_force.
--  * LANGUAGE sql, STABLE, one SELECT: Postgres inlines them into the
--    calling query, so a LATERAL call costs what the subquery it replaces
--    cost (the primary key's prefix (customer, meter) or (scope, meter)).

-- +goose Up
-- +goose StatementBegin
CREATE FUNCTION quota_rule_in_force(p_customer text, p_meter text, p_at timestamptz)
RETURNS SETOF quota_rules LANGUAGE sql STABLE AS $$
    SELECT * FROM quota_rules
    WHERE customer = p_customer AND meter = p_meter AND effective_at <= p_at
    ORDER BY effective_at DESC, version DESC
    LIMIT 1
$$;
-- +goose StatementEnd

-- +goose StatementBegin
CREATE FUNCTION quota_scope_rule_in_force(p_scope text, p_meter text, p_at timestamptz)
RETURNS SETOF quota_scope_rules LANGUAGE sql STABLE AS $$
    SELECT * FROM quota_scope_rules
    WHERE scope = p_scope AND meter = p_meter AND effective_at <= p_at
    ORDER BY effective_at DESC, version DESC
    LIMIT 1
$$;
-- +goose StatementEnd

-- +goose Down
DROP FUNCTION quota_scope_rule_in_force(text, text, timestamptz);
DROP FUNCTION quota_rule_in_force(text, text, timestamptz);
