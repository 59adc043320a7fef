-- What a clean reconciliation run saw, so that a close can tell whether
-- anything it checked changed since, and the admin record that accepts a
-- loss nobody can replay.
--  * reconciliation_verdicts.fingerprint: per customer and period, what
--    the run checked (per meter, how many ledger rows and their sum; the
--    open gaps, conflicts, ledger findings and late usage of the period;
--    the unreplayed dead letters and offset jumps it reported). The close
--    recomputes it under the customer lock and refuses when it differs:
--    comparing billed totals alone let a conflict, a dead letter or a gap
--    that arrived after the run through. Older verdicts have none, so they
--    no longer gate a close: reconcile again.
--  * reconciliation_acceptances: a dead letter no replay can fix, or an
--    offset jump (Kafka deleted messages before they were read), blocks
--    every close it could touch until it is replayed or accepted here by a
--    named person with a reason. Accepting changes nothing that is billed.

-- +goose Up
ALTER TABLE reconciliation_verdicts ADD COLUMN fingerprint jsonb;

CREATE TABLE reconciliation_acceptances (
    kind        text        NOT NULL CHECK (kind IN ('dead_letter', 'offset_jump')),
    id          uuid        NOT NULL,  -- dead_letters.id or ingest_offset_jumps.id
    actor       text        NOT NULL CHECK (actor <> ''),
    reason      text        NOT NULL CHECK (reason <> ''),
    accepted_at timestamptz NOT NULL,
    PRIMARY KEY (kind, id)
);

-- +goose Down
DROP TABLE reconciliation_acceptances;
ALTER TABLE reconciliation_verdicts DROP COLUMN fingerprint;
