-- How much of an open gap's usage may still move out of the period that
-- billed it. Why: a late fill re-attributes its quantity from the gap's
-- billed period to its own; fills whose quantities disagree with each
-- other (seq 7 says it used 60, seq 5 then says 50 of a 100 gap) could move
-- more than the gap billed there, leaving that period short or negative.
-- The remaining amount is shared by the sub-gaps a fill splits a gap into,
-- so it is kept per gap and never derived again from the neighbours'
-- totals. NULL (gaps opened before this column) means the amount implied
-- by the neighbours: upper_total - lower_total - coalesce(upper_quantity, 0),
-- at least 0.

-- +goose Up
ALTER TABLE gaps ADD COLUMN unmoved numeric CHECK (unmoved >= 0);

-- +goose Down
ALTER TABLE gaps DROP COLUMN unmoved;
