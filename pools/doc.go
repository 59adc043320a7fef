// Package pools owns pools: named groups of customers (a plan, a tenant
// group) whose members share a pool budget (docs/design.md §13).
//
// Invariants:
//   - Membership is history, never rewritten: each stay of a customer in a
//     pool is a row (joined_at, left_at); a change closes or opens stays at
//     its effective time, which is never in the future and never before the
//     pool's latest change, so the history stays ordered and "who was a
//     member at t" has one answer.
//   - A customer may belong to several pools; at most one open stay per pool.
//   - This package only keeps membership. What joining means for budgets
//     (a member brings its period's consumption into the pool's count; no
//     change ever hands out a fresh allowance) is the admission package's.
package pools
