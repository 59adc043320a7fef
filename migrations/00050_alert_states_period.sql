-- The alert evaluator reads, at every evaluation (at least once a second),
-- the states of the current periods and every triggered state; a rule's
-- status (GET /v1/alerts/{name}, the console) the same of its own rule.
-- Without an index by period they read every state ever stored: a rule
-- over every customer leaves a state per customer and threshold each
-- period, so the reads grew with the months (docs/design.md §15). The
-- triggered states are found through alert_states_triggered.

-- +goose Up
CREATE INDEX alert_states_period ON alert_states (period_start);

-- +goose Down
DROP INDEX alert_states_period;
