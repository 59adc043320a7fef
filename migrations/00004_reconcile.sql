-- Reconciliation runs and their findings (docs/design.md §6). A run is stored whole
-- (status, per-meter totals, every finding) so that finance can read it
-- later over REST and a period close can rest on it: the close records the
-- run's id, and a clean run only counts while the period's totals still
-- equal the totals it saw.

-- +goose Up
CREATE TABLE reconciliation_runs (
    id          uuid PRIMARY KEY,              -- UUIDv7: sorts by start
    period      text NOT NULL,                 -- as asked: a start date
    customer    text,                          -- NULL: every customer with that period
    deep        boolean NOT NULL DEFAULT false,
    status      text NOT NULL CHECK (status IN ('running', 'clean', 'discrepancies', 'failed')),
    started_at  timestamptz NOT NULL,
    finished_at timestamptz,
    entries_scanned bigint NOT NULL DEFAULT 0,
    checks      jsonb NOT NULL DEFAULT '[]',   -- each check: name, status (ok, findings, skipped), detail
    totals      jsonb NOT NULL DEFAULT '[]',   -- per customer and meter: billed, usage, adjustments, gaps
    error       text
);
CREATE INDEX reconciliation_runs_period ON reconciliation_runs (period, started_at DESC);

CREATE TABLE reconciliation_findings (
    run_id       uuid NOT NULL REFERENCES reconciliation_runs (id),
    n            integer NOT NULL,             -- order within the run
    kind         text NOT NULL,
    severity     text NOT NULL CHECK (severity IN ('discrepancy', 'notice')),
    customer     text,
    meter        text,
    stream       text,                         -- producer/epoch, when a stream is at fault
    period_start timestamptz,
    amount       numeric,
    detail       text NOT NULL,
    PRIMARY KEY (run_id, n)
);
CREATE INDEX reconciliation_findings_customer ON reconciliation_findings (customer, period_start);

-- The per-customer verdicts of a run, which is what a period close rests on.
CREATE TABLE reconciliation_verdicts (
    run_id       uuid NOT NULL REFERENCES reconciliation_runs (id),
    customer     text NOT NULL,
    period_start timestamptz NOT NULL,
    clean        boolean NOT NULL,
    totals       jsonb NOT NULL,               -- meter -> billed, as the run saw it
    PRIMARY KEY (run_id, customer)
);
CREATE INDEX reconciliation_verdicts_period ON reconciliation_verdicts (customer, period_start);

-- +goose Down
DROP TABLE reconciliation_verdicts, reconciliation_findings, reconciliation_runs;
