-- The ledger of docs/design.md §3. Why it looks like this:
--  * Idempotency lives in the schema: records are unique by operation_id and
--    by (stream, seq); adjustments by operation_id. Apply decides outcomes
--    under row locks on the streams, and these constraints are the last line
--    of defence if that logic is ever wrong.
--  * Every quantity is NUMERIC (exact). Limits (38 digits, 9 after the point)
--    are enforced on input by package amount; sums may grow past them.
--  * History is append-only: corrections are new rows, never updates. The only
--    rows that change are stream state, open gaps and rollups, all of which
--    are derivable from records and entries and checked by reconciliation.

-- +goose Up
CREATE TABLE customers (
    id         text PRIMARY KEY,
    -- The billing calendar history (periods.Schedule as JSON): versions,
    -- each effective from a period boundary. Never rewritten, only appended.
    schedule   jsonb NOT NULL,
    created_at timestamptz NOT NULL DEFAULT now(),
    updated_at timestamptz NOT NULL DEFAULT now()
);

-- One row per (producer, epoch, customer, meter): the stream's state.
CREATE TABLE streams (
    id         bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    producer   text   NOT NULL,
    epoch      bigint NOT NULL CHECK (epoch > 0),
    customer   text   NOT NULL,
    meter      text   NOT NULL,
    last_seq   bigint  NOT NULL DEFAULT 0,
    last_total numeric NOT NULL DEFAULT 0,
    final_seq  bigint,  -- seq of the record that said "final", if any
    created_at timestamptz NOT NULL DEFAULT now(),
    updated_at timestamptz NOT NULL DEFAULT now(),
    UNIQUE (producer, customer, meter, epoch)
);

-- Accepted usage records (outcomes applied and late_fill). A record row is
-- also the ledger entry for the amount it billed (billed = total - previous
-- last_total for applied, 0 for late fills).
CREATE TABLE records (
    stream_id    bigint      NOT NULL,
    seq          bigint      NOT NULL CHECK (seq > 0),
    operation_id uuid        NOT NULL,
    customer     text        NOT NULL,
    meter        text        NOT NULL,
    total        numeric     NOT NULL CHECK (total >= 0),
    quantity     numeric     CHECK (quantity >= 0),      -- as sent; NULL when not sent
    occurred_at  timestamptz NOT NULL,
    final        boolean     NOT NULL DEFAULT false,
    late_fill    boolean     NOT NULL,
    billed       numeric     NOT NULL,
    period_start timestamptz NOT NULL,  -- the period the billed amount went to
    bucket       timestamptz NOT NULL,  -- the rollup hour the billed amount went to
    prior_period timestamptz,           -- set when the usage's own period was closed
    ingested_at  timestamptz NOT NULL,
    PRIMARY KEY (stream_id, seq),
    UNIQUE (operation_id)
);
CREATE INDEX records_period ON records (customer, period_start);
-- Prior-period adjustments are rare; statements and reconciliation find
-- them without reading the period's other records.
CREATE INDEX records_prior ON records (customer, period_start) WHERE prior_period IS NOT NULL;

-- Entries that are not usage records: manual adjustments, and the pairs of
-- entries that move a late fill's quantity between periods (re-attribution).
CREATE TABLE entries (
    id           uuid PRIMARY KEY,
    kind         text NOT NULL CHECK (kind IN ('adjustment', 'reattribution')),
    operation_id uuid NOT NULL,  -- adjustment: its own id; reattribution: the late fill's
    customer     text NOT NULL,
    meter        text NOT NULL,
    amount       numeric NOT NULL,
    period_start timestamptz NOT NULL,
    bucket       timestamptz NOT NULL,
    prior_period timestamptz,
    occurred_at  timestamptz NOT NULL,
    reason       text,
    actor        text,
    request_hash bytea,  -- adjustment: hash of the request, so a retry is recognised
    stream_id    bigint,
    seq          bigint,
    created_at   timestamptz NOT NULL
);
CREATE UNIQUE INDEX entries_adjustment_id ON entries (operation_id) WHERE kind = 'adjustment';
CREATE INDEX entries_period ON entries (customer, period_start);

-- Billed usage per (customer, meter, period, hour), maintained in the same
-- transaction as records and entries so queries never scan raw rows.
CREATE TABLE rollups (
    customer     text        NOT NULL,
    meter        text        NOT NULL,
    period_start timestamptz NOT NULL,
    bucket       timestamptz NOT NULL,
    quantity     numeric     NOT NULL,
    PRIMARY KEY (customer, meter, period_start, bucket)
);

-- Open gaps: seqs from_seq..to_seq of a stream not yet seen. Their usage is
-- already billed (inside the delta of the record after the gap) in
-- billed_period. lower_total is the total at from_seq-1, upper_total and
-- upper_quantity those of the record at to_seq+1; the gap's amount is
-- upper_total - upper_quantity - lower_total when upper_quantity is known.
CREATE TABLE gaps (
    stream_id      bigint      NOT NULL,
    from_seq       bigint      NOT NULL,
    to_seq         bigint      NOT NULL CHECK (to_seq >= from_seq),
    customer       text        NOT NULL,
    meter          text        NOT NULL,
    lower_total    numeric     NOT NULL,
    upper_total    numeric     NOT NULL,
    upper_quantity numeric,
    billed_period  timestamptz NOT NULL,
    billed_bucket  timestamptz NOT NULL,
    opened_at      timestamptz NOT NULL,
    PRIMARY KEY (stream_id, from_seq)
);

-- Records that lost: first write wins, the loser's payload is kept here.
CREATE TABLE conflicts (
    id                    uuid PRIMARY KEY,
    reason                text   NOT NULL,
    operation_id          uuid   NOT NULL,
    stream_id             bigint NOT NULL,
    seq                   bigint NOT NULL,
    customer              text   NOT NULL,
    meter                 text   NOT NULL,
    existing_operation_id uuid,
    payload               jsonb  NOT NULL,
    payload_hash          bytea  NOT NULL,  -- the same losing record twice is one conflict
    detected_at           timestamptz NOT NULL,
    UNIQUE (operation_id, stream_id, seq, payload_hash)
);

-- Things the ledger noticed while applying (quantity mismatches,
-- re-attributions it could not make). Reconciliation reports them.
CREATE TABLE findings (
    id           uuid PRIMARY KEY,
    kind         text NOT NULL,
    customer     text NOT NULL,
    meter        text NOT NULL,
    stream_id    bigint,
    seq          bigint,
    period_start timestamptz,
    amount       numeric,
    detail       text NOT NULL,
    created_at   timestamptz NOT NULL
);
CREATE INDEX findings_customer ON findings (customer, period_start);

-- Closed periods and their frozen statements (package periods). A row here
-- is the close record: the period's state is derived from the clock and
-- this row only. Applying usage and closing a period serialise on the
-- customer lock described in ledger/doc.go.
CREATE TABLE period_closes (
    customer          text        NOT NULL,
    period_start      timestamptz NOT NULL,
    period_end        timestamptz NOT NULL,
    closed_at         timestamptz NOT NULL,
    statement         jsonb       NOT NULL,  -- immutable once written
    forced            boolean     NOT NULL DEFAULT false,
    reason            text,                  -- why it was forced
    actor             text,
    reconciliation_id uuid,                  -- the clean run it rests on
    PRIMARY KEY (customer, period_start),
    CHECK (forced = (reconciliation_id IS NULL)),
    CHECK (NOT forced OR (reason <> '' AND actor <> ''))
);

-- +goose Down
DROP TABLE period_closes, findings, conflicts, gaps, rollups, entries, records, streams, customers;
