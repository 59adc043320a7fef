// Package ledger is Tally's ledger (docs/design.md §3): streams of running totals,
// the idempotent apply algorithm, rollups, and their Postgres store.
//
// Invariants, each checked by property tests and by reconciliation:
//   - Per stream, the billed amounts of its records sum to its last_total:
//     every unit is billed once, however records are duplicated, reordered
//     or lost (a gap's usage is inside the delta of the record after it).
//   - Per (customer, meter, period, hour), the rollup equals the sum of the
//     records' billed amounts and the entries' amounts in that bucket; per
//     local day of the period's zone (see Day), the daily rollup equals the
//     sum of that day's hourly rollups (reconciliation checks the days of
//     each meter and period in total).
//   - Per (stream, period), stream_periods holds the range of the seqs of
//     the stream's records billed in that period, widened in the
//     transaction that writes them: the reads of a customer's period
//     (statements, reconciliation, the close gate) find records through it
//     and the primary key, so records carry no per-period index.
//   - Nothing is updated or deleted except derivable state (stream state,
//     open gaps, rollups, stream periods); corrections are new entries.
//   - Apply runs inside the caller's transaction: its effect commits or
//     rolls back with whatever else the caller did (e.g. a Kafka offset).
//
// Concurrency: Apply locks the rows of the streams it touches (in key order,
// so two Applies cannot deadlock) and takes a shared advisory lock per
// customer bucket; closing a period takes the same bucket lock exclusively,
// so usage is either in the period before its statement freezes or sees the
// period closed and becomes a prior-period adjustment in the first later
// period that is not closed. Usage is never booked into a closed period,
// whatever the clocks say: the close records are read under those locks.
//
// Re-attribution never moves more out of a period than the gap billed
// there: each gap keeps its unmoved amount, shared by the sub-gaps a late
// fill splits it into.
package ledger
