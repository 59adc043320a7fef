// Package reconcile checks an accounting period before it is billed and is
// the gate for closing it.
//
// A run resolves the period in each customer's own calendar, then runs
// every check in one read-only REPEATABLE READ transaction (one snapshot),
// set-based over all its customers at once: rollups against records and
// entries, stream totals and open gaps, conflicts (of the period they
// occurred in and of the one they were detected in), dead letters and
// offset jumps, late usage, abandoned streams, ingest conservation
// counters, and, with --deep, an independent recomputation of each
// period's usage per meter from Kafka's messages.
//
// Findings are discrepancies (something may be billed wrong: a close needs
// a clean run or a forced close with a reason) or notices (explanations of
// numbers that are billed right, such as gaps whose usage arrived inside a
// later total). A run and all its findings are stored.
//
// Invariants:
//   - A clean run is a ticket to close only while it is true: each verdict
//     stores a fingerprint of what the run checked for the customer's period
//     (ledger rows and their sum per meter, open gaps, conflicts, ledger
//     findings, late usage, pending dead letters and offset jumps), and the
//     close recomputes it under the customer lock that keeps new usage out,
//     together with the customer's stream totals, and refuses on any change.
//   - Every unreplayed dead letter is reported by the runs of every period
//     that had started when it was refused: its customer's, or, when its key
//     is no known customer, every customer's (the run is dirty). An offset
//     jump (messages deleted unread) is reported the same way as anyone's.
//     Either blocks closes until replayed or accepted (Accept: who and why).
//   - --deep never reports ok for what it could not read: customers whose
//     messages retention may have deleted are reported as not checked.
//   - Runs of the same period never overlap (a Postgres advisory lock per
//     resolved period, so "previous" and its date are one), and re-running
//     is always safe: a run only reads the ledger.
package reconcile
