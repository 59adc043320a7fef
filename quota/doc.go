// Package quota owns quota rules and the lagged enforcer (docs/design.md §5).
//
// A rule limits a customer's billed usage of one meter per billing period.
// Rules are versioned and insert-only; usage is always the period's rollups
// counted from the period start, so no rule change resets usage or grants a
// fresh allowance, and lowering a limit below usage is exceeded at once.
//
// The enforcer evaluates every current rule against rollup usage and
// publishes a Decision to Kafka (key "customer/meter") on every change and at
// least every Republish (sooner when the one published would otherwise turn
// stale while usage is caught up), and stores the latest one per rule in
// Postgres.
//
// Pools and the global scope have rules too (ScopeRule, docs/design.md §13),
// versioned and insert-only. The enforcer evaluates the lagged ones like a
// customer's: usage is the sum of the members' rollups over the scope's
// month, as_of the oldest of the members' partitions, and the decision is
// keyed "<scope>/<meter>". Exact ones are enforced by grants (admission).
//
// Invariants:
//   - Lag is explicit: AsOf is the instant through which the customer's usage
//     is known complete (the ingest position of its partition, or the
//     minimum over the topic's partitions). A stalled ingest keeps AsOf still,
//     so LagSeconds grows; it never makes usage look lower.
//   - A store error is never zero usage: when the ledger cannot be read, no
//     fresh decision is published and the last one ages (consumers apply
//     on_stale once it is older than stale_after).
//   - One publisher at a time: the enforcer publishes only while it holds the
//     leader lease, and every decision write checks the lease epoch in the
//     same transaction (a deposed leader cannot write). A new leader starts
//     from the stored decisions, so it neither starts empty nor re-flaps.
//   - Overage (usage that became visible while the decision in force was
//     exceeded in enforce mode, or stale) is accumulated per period,
//     customer and meter for reconciliation, under lagged rules only: under
//     an exact rule gateways admit from grants, not from the decision.
package quota
