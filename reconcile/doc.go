// Package reconcile checks an accounting period before it is billed
// (SPEC §6) and is the gate for closing it.
//
// A run resolves the period in each customer's own calendar, then runs
// every check in one read-only REPEATABLE READ transaction (one snapshot),
// set-based over all its customers at once: rollups against records and
// entries, stream totals and open gaps, conflicts and dead letters, late
// usage, abandoned streams, ingest conservation counters, and, with --deep,
// an independent recomputation from Kafka's messages.
//
// Findings are discrepancies (something may be billed wrong: a close needs
// a clean run or a forced close with a reason) or notices (explanations of
// numbers that are billed right, such as gaps whose usage arrived inside a
// later total). A run and all its findings are stored.
//
// A clean run is a ticket to close only while it is true: the close checks,
// under the customer lock that keeps new usage out, that the period's
// billed totals still equal the totals the run saw.
//
// Runs for the same period never overlap (a Postgres advisory lock), and
// re-running is always safe: a run only reads the ledger.
package reconcile
