-- Rate rules through grants (docs/design.md §17). Why:
--  * A contract of "100 requests a second, bursts of 200" was enforced by a
--    token bucket in every gateway, so G gateways admitted G times the
--    burst. A quota rule (customer, pool or global) may now be a rate
--    instead of a period limit: rate_amount per rate_per, at most
--    rate_burst at once, admitted exactly through grants. Its "limit" is
--    NULL: everything that evaluates a period limit (the lagged enforcer,
--    alerts' percent thresholds, period budgets) skips it as it skips a
--    rule with no limit.
--  * max_skew (optional, rate rules only): the rule's own reclaim margin
--    after valid_until, from 100 ms, where gateways' clocks are kept in
--    sync; issuing uses the smaller of it and the deployment's.
--  * admission_rate_buckets is one token bucket per (scope, meter), on
--    Postgres's clock. It has no period: it lives across rule versions and
--    mode switches, so a new version carries the bucket over and never
--    starts full. admission_rate_refill is the one definition of its
--    refill: piecewise over the rule versions that took effect since the
--    bucket was last refilled (a new rate applies from its effective_at; a
--    lower burst clamps the tokens when it takes effect).
--  * admission_rate_draws records the buckets a grant took tokens from, and
--    the latest instant the grant may be valid until (renew never extends
--    a rate grant past it: a grant is spent within ttl of its take).

-- +goose Up
ALTER TABLE quota_rules ALTER COLUMN "limit" DROP NOT NULL;
ALTER TABLE quota_rules
    ADD COLUMN rate_amount numeric CHECK (rate_amount > 0),
    ADD COLUMN rate_per    interval CHECK (rate_per >= interval '1 millisecond' AND rate_per <= interval '1 day'),
    ADD COLUMN rate_burst  numeric CHECK (rate_burst > 0),
    ADD COLUMN max_skew    interval CHECK (max_skew >= interval '100 milliseconds'),
    ADD CONSTRAINT quota_rules_limit_or_rate CHECK (
        ("limit" IS NULL) = (rate_amount IS NOT NULL)
        AND (rate_amount IS NULL) = (rate_per IS NULL) AND (rate_amount IS NULL) = (rate_burst IS NULL)
        AND (rate_amount IS NULL OR admission = 'exact')
        AND (max_skew IS NULL OR rate_amount IS NOT NULL));

ALTER TABLE quota_scope_rules ALTER COLUMN "limit" DROP NOT NULL;
ALTER TABLE quota_scope_rules
    ADD COLUMN rate_amount numeric CHECK (rate_amount > 0),
    ADD COLUMN rate_per    interval CHECK (rate_per >= interval '1 millisecond' AND rate_per <= interval '1 day'),
    ADD COLUMN rate_burst  numeric CHECK (rate_burst > 0),
    ADD COLUMN max_skew    interval CHECK (max_skew >= interval '100 milliseconds'),
    ADD CONSTRAINT quota_scope_rules_limit_or_rate CHECK (
        ("limit" IS NULL) = (rate_amount IS NOT NULL)
        AND (rate_amount IS NULL) = (rate_per IS NULL) AND (rate_amount IS NULL) = (rate_burst IS NULL)
        AND (rate_amount IS NULL OR admission = 'exact')
        AND (max_skew IS NULL OR rate_amount IS NOT NULL));

CREATE TABLE admission_rate_buckets (
    scope      text        NOT NULL,  -- customer:<id>, pool:<name> or global
    meter      text        NOT NULL,
    tokens     numeric     NOT NULL CHECK (tokens >= 0),
    refilled_at timestamptz NOT NULL,
    taken      numeric     NOT NULL DEFAULT 0,  -- Σ tokens ever taken (console, reconciliation)
    returned   numeric     NOT NULL DEFAULT 0,  -- Σ tokens ever given back by releases
    refused    bigint      NOT NULL DEFAULT 0,  -- requests this bucket refused
    PRIMARY KEY (scope, meter)
);

CREATE TABLE admission_rate_draws (
    grant_id  uuid        NOT NULL REFERENCES admission_grants (id),
    scope     text        NOT NULL,
    meter     text        NOT NULL,
    taken_at  timestamptz NOT NULL,  -- Postgres's clock when the tokens were taken
    until     timestamptz NOT NULL,  -- the grant is never valid past this (renew included)
    PRIMARY KEY (grant_id, scope, meter),
    FOREIGN KEY (scope, meter) REFERENCES admission_rate_buckets (scope, meter)
);
CREATE INDEX admission_rate_draws_bucket ON admission_rate_draws (scope, meter);

-- +goose StatementBegin
-- admission_rate_rule_in_force is the rate of the rule in force for a
-- budget scope and meter at p_at (no row: no exact rate rule in force).
CREATE FUNCTION admission_rate_rule_in_force(p_scope text, p_meter text, p_at timestamptz,
                                             OUT amount numeric, OUT per_us numeric, OUT burst numeric,
                                             OUT max_skew interval, OUT version bigint)
RETURNS SETOF record LANGUAGE sql STABLE AS $$
    SELECT r.rate_amount, extract(epoch FROM r.rate_per) * 1000000, r.rate_burst, r.max_skew, r.version
    FROM quota_rule_in_force(substr(p_scope, 10), p_meter, p_at) r
    WHERE p_scope LIKE 'customer:%' AND r.rate_amount IS NOT NULL AND r.admission = 'exact'
    UNION ALL
    SELECT r.rate_amount, extract(epoch FROM r.rate_per) * 1000000, r.rate_burst, r.max_skew, r.version
    FROM quota_scope_rule_in_force(p_scope, p_meter, p_at) r
    WHERE p_scope NOT LIKE 'customer:%' AND r.rate_amount IS NOT NULL AND r.admission = 'exact'
$$;
-- +goose StatementEnd

-- +goose StatementBegin
-- admission_rate_next_change is the earliest effective_at of a version of
-- the budget's rule after p_after and not after p_until (NULL: none).
CREATE FUNCTION admission_rate_next_change(p_scope text, p_meter text, p_after timestamptz, p_until timestamptz)
RETURNS timestamptz LANGUAGE sql STABLE AS $$
    SELECT CASE WHEN p_scope LIKE 'customer:%'
        THEN (SELECT min(effective_at) FROM quota_rules
              WHERE customer = substr(p_scope, 10) AND meter = p_meter AND effective_at > p_after AND effective_at <= p_until)
        ELSE (SELECT min(effective_at) FROM quota_scope_rules
              WHERE scope = p_scope AND meter = p_meter AND effective_at > p_after AND effective_at <= p_until)
    END
$$;
-- +goose StatementEnd

-- +goose StatementBegin
-- admission_rate_tokens_at is what a bucket holding p_tok at p_from holds
-- at p_now: over each stretch between rule changes, under the rule in
-- force in it, tokens = min(burst, tokens + amount × elapsed / per), the
-- burst clamping first (a lower burst takes tokens away when it takes
-- effect; a higher one adds none). The refill is rounded down to 10^-9,
-- so a bucket never holds more than the exact refill. Under no rate rule
-- the bucket neither fills nor empties. It writes nothing (reads: the
-- console, budgets); admission_rate_refill stores it.
CREATE FUNCTION admission_rate_tokens_at(p_scope text, p_meter text, p_tok numeric, p_from timestamptz, p_now timestamptz)
RETURNS numeric LANGUAGE plpgsql STABLE AS $$
DECLARE
    tok numeric := p_tok;
    cur timestamptz := p_from;
    nxt timestamptz;
    r   record;
BEGIN
    IF p_now <= cur THEN
        RETURN tok;
    END IF;
    LOOP
        nxt := coalesce(admission_rate_next_change(p_scope, p_meter, cur, p_now), p_now);
        SELECT * INTO r FROM admission_rate_rule_in_force(p_scope, p_meter, cur);
        IF FOUND THEN
            tok := least(r.burst, tok + div(r.amount * (extract(epoch FROM nxt - cur) * 1000000) * 1000000000, r.per_us) / 1000000000);
        END IF;
        cur := nxt;
        EXIT WHEN cur >= p_now;
        -- A version taking effect at cur: a lower burst clamps at once.
        SELECT * INTO r FROM admission_rate_rule_in_force(p_scope, p_meter, cur);
        IF FOUND THEN
            tok := least(r.burst, tok);
        END IF;
    END LOOP;
    SELECT * INTO r FROM admission_rate_rule_in_force(p_scope, p_meter, p_now);
    IF FOUND THEN
        tok := least(r.burst, tok);
    END IF;
    RETURN tok;
END;
$$;
-- +goose StatementEnd

-- +goose StatementBegin
-- admission_rate_refill locks a bucket, brings it to p_now
-- (admission_rate_tokens_at) and returns its tokens. p_now before the last
-- refill (a transaction that began before another refilled it) changes
-- nothing.
CREATE FUNCTION admission_rate_refill(p_scope text, p_meter text, p_now timestamptz)
RETURNS numeric LANGUAGE plpgsql AS $$
DECLARE
    tok numeric;
    cur timestamptz;
BEGIN
    SELECT b.tokens, b.refilled_at INTO tok, cur FROM admission_rate_buckets b
    WHERE b.scope = p_scope AND b.meter = p_meter FOR UPDATE;
    IF NOT FOUND THEN
        RETURN NULL;
    END IF;
    IF p_now <= cur THEN
        RETURN tok;
    END IF;
    tok := admission_rate_tokens_at(p_scope, p_meter, tok, cur, p_now);
    UPDATE admission_rate_buckets SET tokens = tok, refilled_at = p_now WHERE scope = p_scope AND meter = p_meter;
    RETURN tok;
END;
$$;
-- +goose StatementEnd

-- +goose StatementBegin
-- admission_rate_give puts p_delta unspent tokens back into a bucket,
-- refilled to p_now first, never above the burst in force (or, under no
-- rate rule, above the tokens it held plus nothing: the bucket is frozen).
CREATE FUNCTION admission_rate_give(p_scope text, p_meter text, p_delta numeric, p_now timestamptz)
RETURNS numeric LANGUAGE plpgsql AS $$
DECLARE
    tok numeric;
    r   record;
BEGIN
    tok := admission_rate_refill(p_scope, p_meter, p_now);
    IF tok IS NULL THEN
        RETURN NULL;
    END IF;
    SELECT * INTO r FROM admission_rate_rule_in_force(p_scope, p_meter, greatest(p_now,
        (SELECT refilled_at FROM admission_rate_buckets WHERE scope = p_scope AND meter = p_meter)));
    IF FOUND THEN
        UPDATE admission_rate_buckets
        SET tokens = least(r.burst, tok + p_delta), returned = returned + (least(r.burst, tok + p_delta) - tok)
        WHERE scope = p_scope AND meter = p_meter;
        RETURN least(r.burst, tok + p_delta);
    END IF;
    RETURN tok;
END;
$$;
-- +goose StatementEnd

-- +goose Down
DROP FUNCTION admission_rate_give(text, text, numeric, timestamptz);
DROP FUNCTION admission_rate_refill(text, text, timestamptz);
DROP FUNCTION admission_rate_tokens_at(text, text, numeric, timestamptz, timestamptz);
DROP FUNCTION admission_rate_next_change(text, text, timestamptz, timestamptz);
DROP FUNCTION admission_rate_rule_in_force(text, text, timestamptz);
DROP TABLE admission_rate_draws;
DROP TABLE admission_rate_buckets;
ALTER TABLE quota_scope_rules DROP CONSTRAINT quota_scope_rules_limit_or_rate,
    DROP COLUMN max_skew, DROP COLUMN rate_burst, DROP COLUMN rate_per, DROP COLUMN rate_amount;
ALTER TABLE quota_rules DROP CONSTRAINT quota_rules_limit_or_rate,
    DROP COLUMN max_skew, DROP COLUMN rate_burst, DROP COLUMN rate_per, DROP COLUMN rate_amount;
