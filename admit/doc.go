// Package admit is the gateway side of exact admission: Admit answers from
// memory, from grants leased from Tally, so that everything all gateways
// may admit stays within each exact budget's limit.
//
// Invariants:
//   - Admit from a held grant takes no lock and allocates nothing: a
//     budget's capacity sits in per-shard atomic counters (one cache line
//     each), and Admit takes from one shard by compare-and-swap.
//   - Never more is admitted from grants than was granted: capacity enters
//     the shards only from a grant Tally stored, and leaves a shard only by
//     an admission or by being withdrawn before its grant is released or
//     runs out (valid_until, by the gateway's clock).
//   - A background loop tops grants up before they run dry (sized from the
//     measured demand), renews them with their spent, and releases what
//     demand no longer needs, so a busy gateway elsewhere can get it.
//   - The holder id and its generation are kept on disk; every New is a new
//     generation, so a restarted gateway never reuses an earlier grant.
//   - When Tally cannot be reached, the rule's on_unreachable applies (learnt
//     with each grant; Config.OnUnreachable until a first grant): deny,
//     allow, or local (at most an amount per duration). Every admission made
//     without a grant is a bypass: appended to a journal on disk before
//     Admit returns, and reported (idempotently, by journal file) once Tally
//     answers again, by this generation or a later one.
package admit
