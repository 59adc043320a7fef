-- Exact admission: leased grants. Why it looks like this:
--  * A quota rule says how it is enforced: admission 'lagged' (decisions
--    published after the fact, the default, unchanged) or 'exact' (gateways
--    admit only from grants issued here). on_unreachable is what a gateway
--    does when it cannot reach Tally: 'deny', 'local' (at most local_amount
--    per local_every per holder) or 'allow'. New columns with defaults: every
--    existing rule stays lagged, exactly as before.
--  * admission_budgets is one row per (customer, meter, period) of an exact
--    rule. Issuing locks this row (FOR UPDATE), so every check of
--    consumed + amount <= limit and its insert are serialised per budget.
--    consumed is kept as a counter, never recomputed from a clock: it is
--    the sum of the amount of every grant not released plus the spent of
--    every released grant. A grant that runs out without a final report
--    therefore stays counted at its full amount (fully spent), and expiry
--    never changes consumed, so no clock can hand capacity out twice.
--    "limit" is the limit of the rule version last applied, stored so a
--    listing shows what bound the last issue; the rule stays the authority.
--  * admission_holders keeps the highest generation each holder (a gateway)
--    has shown. An older generation is refused everything: a restarted
--    holder never inherits, or re-receives as fresh, what it held before.
--  * admission_grants are never deleted: they are the audit trail that
--    reconciliation reads (stranded = amount - spent of ended grants).
--    reclaim_at = valid_until + max_skew, fixed when the grant is issued or
--    renewed, so a configuration change never shortens a live grant.
--  * api_tokens gain gateway tokens: a token for one gateway (holder id),
--    which may manage only that holder's grants and bypasses. A token is for
--    exactly one customer or one gateway.
--  * admission_bypasses records admissions made without a grant (Tally was
--    unreachable), reported later by the holder, idempotent by report id.

-- +goose Up
ALTER TABLE quota_rules
    ADD COLUMN admission      text    NOT NULL DEFAULT 'lagged' CHECK (admission IN ('lagged', 'exact')),
    ADD COLUMN on_unreachable text    NOT NULL DEFAULT 'deny' CHECK (on_unreachable IN ('deny', 'local', 'allow')),
    ADD COLUMN local_amount   numeric CHECK (local_amount >= 0),
    ADD COLUMN local_every    interval CHECK (local_every > interval '0'),
    ADD CONSTRAINT quota_rules_local_policy CHECK (
        (on_unreachable = 'local') = (local_amount IS NOT NULL AND local_every IS NOT NULL));

ALTER TABLE api_tokens
    ALTER COLUMN customer DROP NOT NULL,
    ADD COLUMN gateway text CHECK (gateway ~ '^[A-Za-z0-9._:-]{1,128}$'),
    ADD CONSTRAINT api_tokens_one_principal CHECK ((customer IS NULL) <> (gateway IS NULL));

CREATE TABLE admission_budgets (
    customer     text        NOT NULL,
    meter        text        NOT NULL,
    period_start timestamptz NOT NULL,
    period_end   timestamptz NOT NULL CHECK (period_end > period_start),
    period       text        NOT NULL,  -- the period's name
    "limit"      numeric     NOT NULL CHECK ("limit" >= 0),
    rule_version bigint      NOT NULL,
    consumed     numeric     NOT NULL DEFAULT 0 CHECK (consumed >= 0),
    updated_at   timestamptz NOT NULL,
    PRIMARY KEY (customer, meter, period_start)
);

CREATE TABLE admission_holders (
    holder     text        PRIMARY KEY CHECK (holder ~ '^[A-Za-z0-9._:-]{1,128}$'),
    generation bigint      NOT NULL CHECK (generation > 0),
    seen_at    timestamptz NOT NULL
);

CREATE TABLE admission_grants (
    id           uuid        PRIMARY KEY,
    customer     text        NOT NULL,
    meter        text        NOT NULL,
    period_start timestamptz NOT NULL,
    rule_version bigint      NOT NULL,
    holder       text        NOT NULL REFERENCES admission_holders (holder),
    generation   bigint      NOT NULL,
    amount       numeric     NOT NULL CHECK (amount > 0),
    spent        numeric     NOT NULL DEFAULT 0 CHECK (spent >= 0 AND spent <= amount),
    issued_at    timestamptz NOT NULL,
    valid_until  timestamptz NOT NULL CHECK (valid_until >= issued_at),
    reclaim_at   timestamptz NOT NULL CHECK (reclaim_at >= valid_until),
    ended_at     timestamptz,
    end_reason   text CHECK (end_reason IN ('released', 'expired')),
    CHECK ((ended_at IS NULL) = (end_reason IS NULL)),
    FOREIGN KEY (customer, meter, period_start) REFERENCES admission_budgets (customer, meter, period_start)
);
CREATE INDEX admission_grants_budget ON admission_grants (customer, meter, period_start) WHERE ended_at IS NULL;
CREATE INDEX admission_grants_customer ON admission_grants (customer, issued_at);

CREATE TABLE admission_bypasses (
    holder       text        NOT NULL,
    report_id    text        NOT NULL,
    customer     text        NOT NULL,
    meter        text        NOT NULL,
    period_start timestamptz NOT NULL,
    period       text        NOT NULL,
    rule_version bigint      NOT NULL,
    generation   bigint      NOT NULL,
    amount       numeric     NOT NULL CHECK (amount > 0),
    admissions   bigint      NOT NULL CHECK (admissions > 0),
    first_at     timestamptz NOT NULL,
    last_at      timestamptz NOT NULL CHECK (last_at >= first_at),
    reported_at  timestamptz NOT NULL,
    PRIMARY KEY (holder, report_id, customer, meter, period_start)
);
CREATE INDEX admission_bypasses_budget ON admission_bypasses (customer, meter, period_start);

-- +goose Down
DROP TABLE admission_bypasses, admission_grants, admission_holders, admission_budgets;
DELETE FROM api_tokens WHERE gateway IS NOT NULL;
ALTER TABLE api_tokens
    DROP CONSTRAINT api_tokens_one_principal,
    DROP COLUMN gateway,
    ALTER COLUMN customer SET NOT NULL;
ALTER TABLE quota_rules
    DROP CONSTRAINT quota_rules_local_policy,
    DROP COLUMN local_every, DROP COLUMN local_amount, DROP COLUMN on_unreachable, DROP COLUMN admission;
