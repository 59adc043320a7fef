// Package alerts owns alert rules, webhooks, the alerts' states and their
// events and deliveries (docs/design.md §15; tables alert_rules,
// alert_webhooks, alert_states, alert_events, alert_deliveries).
//
// An alert rule watches a subject's usage of one meter (a customer, a
// pool, the global scope, or every customer on its own) against
// thresholds, absolute or a percentage of the quota limit in force. The
// Evaluator reads usage, as_of and that limit from package quota (the
// enforcer's own definitions, called, never copied) and keeps, per (rule,
// subject, threshold, period), a state ok or triggered. The Dispatcher
// delivers each transition's event to Kafka and to webhooks.
//
// Invariants:
//   - One evaluator: it evaluates only while the quota enforcer of its
//     process leads, and every write checks the enforcer's lease in the
//     same transaction (quota.CheckFence), so a deposed leader writes
//     nothing.
//   - Outbox: a transition, its event and its deliveries commit in one
//     transaction. The event id is derived from rule, subject, threshold,
//     period and transition number: a repeated evaluation (a new leader)
//     derives the same id, and the insert does nothing.
//   - No two triggered in a row: a triggered event is written only from
//     ok, a resolved one only from triggered, for the same (rule, subject,
//     threshold, period). A period that has ended is never evaluated
//     again: its triggered states are resolved with reason period_ended.
//   - In order: the transitions of one evaluation are written per rule,
//     subject and period, resolutions first, highest threshold first,
//     then triggers, lowest first; events are delivered in that order.
//   - At least once, in order: a delivery is a row; only the oldest
//     pending delivery of each (endpoint, rule, subject) is attempted, and
//     it is marked delivered only after the receiver's 2xx (or Kafka's
//     ack). A crash between the two repeats the delivery with the same id.
//   - A slow receiver slows nobody else: deliveries run in goroutines of
//     their own with their own HTTP client, timeouts and a bounded number
//     in flight; the evaluator never waits for them.
package alerts
