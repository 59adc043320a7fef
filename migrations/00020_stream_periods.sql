-- Where a customer's period lies in records, kept per stream and period
-- instead of per record. Why: the index records_period (customer,
-- period_start) cost every record a B-tree entry — one of the four WAL
-- records and about a fifth of the WAL bytes that ingest wrote per record
-- (docs/ingest-breakdown.md) — only so that the reads of one customer's
-- period (statements, the close gate, reconciliation) could find their
-- rows. stream_periods holds, for each stream and period it billed usage
-- in, the range of its seqs there; the ledger widens it once per
-- micro-batch per (stream, period), in the transaction that writes the
-- records, and those reads walk the primary key (stream_id, seq) through
-- it. Invariant: every record lies in the range of its (stream,
-- period_start) row. ledger_period_records is the one definition of "the
-- records of these customers' periods" that every reader calls.
--
-- The backfill reads records once; on a large ledger it runs as long as
-- one full scan of the table (ingest waits for it like for any migration).

-- +goose Up
CREATE TABLE stream_periods (
    customer     text        NOT NULL,
    period_start timestamptz NOT NULL,
    stream_id    bigint      NOT NULL,
    min_seq      bigint      NOT NULL,
    max_seq      bigint      NOT NULL CHECK (max_seq >= min_seq),
    PRIMARY KEY (customer, period_start, stream_id)
);

INSERT INTO stream_periods (customer, period_start, stream_id, min_seq, max_seq)
SELECT min(customer), period_start, stream_id, min(seq), max(seq)
FROM records GROUP BY stream_id, period_start;

-- The records billed in the periods starting at starts of customers (all
-- customers when customers is NULL), through stream_periods. A plain SQL
-- function, so the planner inlines it into each query.
CREATE FUNCTION ledger_period_records(customers text[], starts timestamptz[])
RETURNS SETOF records LANGUAGE sql STABLE AS $$
  SELECT r.*
  FROM stream_periods sp
  JOIN records r ON r.stream_id = sp.stream_id AND r.seq BETWEEN sp.min_seq AND sp.max_seq
                AND r.period_start = sp.period_start
  WHERE (customers IS NULL OR sp.customer = ANY(customers)) AND sp.period_start = ANY(starts)
$$;

DROP INDEX records_period;

-- +goose Down
CREATE INDEX records_period ON records (customer, period_start);
DROP FUNCTION ledger_period_records(text[], timestamptz[]);
DROP TABLE stream_periods;
