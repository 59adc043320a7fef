-- A run lists at most a bound of findings of each kind (docs/design.md §6):
-- a ledger broken in a systematic way makes a finding per stream, gap or
-- record, millions of them, which a run held in memory, stored and
-- reported whole. The rest are counted in one summary finding per kind and
-- severity; omitted is how many findings it stands for (NULL on a finding
-- listed itself), so a stored run still counts every finding.

-- +goose Up
ALTER TABLE reconciliation_findings ADD COLUMN omitted bigint CHECK (omitted > 0);

-- +goose Down
ALTER TABLE reconciliation_findings DROP COLUMN omitted;
