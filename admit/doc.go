// Package admit is the gateway side of quotas: Admit answers from memory,
// from grants leased from Tally for exact rules (so that everything all
// gateways may admit stays within each exact budget's limit), and from the
// latest decision read from tally.quota-decisions for lagged rules. The
// first Admit of a customer and meter asks Tally for a grant; a not-exact
// refusal says whether the rule is lagged or absent (then Admit admits).
//
// Invariants:
//   - Admit from a held grant takes no lock and allocates nothing: a
//     budget's capacity sits in per-shard atomic counters (one cache line
//     each), and Admit takes from one shard by compare-and-swap.
//   - Never more is admitted from grants than was granted: capacity enters
//     the shards only from a grant Tally stored, and leaves a shard only by
//     an admission or by being withdrawn before its grant is released or
//     runs out (valid_until, by the gateway's clock).
//   - A background loop tops grants up before they run dry (whole grants
//     sized from the measured demand, growing at most twofold per grant),
//     renews them with their spent, and releases what demand no longer
//     needs, so a busy gateway elsewhere can get it. A grant smaller than
//     asked or a refusal makes the budget tight for a Lookahead: the
//     gateway then gives back what it holds, and an Admit that finds
//     nothing held has its cost debited (POST /v1/grants/debits: taken
//     from every budget that applies in one call, nothing held, nothing
//     to release; on a rate budget, a grant of its cost alone). Near its
//     end a budget is a central counter.
//   - The holder id and its generation are kept on disk (sealed with a
//     CRC-32C: New refuses a damaged file); every New is a new
//     generation, so a restarted gateway never reuses an earlier grant. A
//     run that lost its Dir, refused stale-generation before it was issued
//     anything, takes Tally's next_generation (kept on disk first); a run
//     refused so after grants were issued keeps its generation: another
//     process uses the holder id.
//   - When Tally cannot be reached, the rule's on_unreachable applies (learnt
//     with each grant; Config.OnUnreachable until a first grant): deny,
//     allow, or local (at most an amount per duration). Every admission made
//     without a grant is a bypass: appended to a journal on disk before
//     Admit returns, and reported (idempotently, by journal file) once Tally
//     answers again, by this generation or a later one.
//   - No Admit waits on Tally longer than Config.MaxWait (250 ms by
//     default) or its ctx. Unreachability and slowness are remembered
//     (reach.go): while Tally is known down, or has asked for a pause
//     (429, 503 Retry-After), Admit answers by on_unreachable without
//     calling it; the background loop and grant requests started without
//     waiting are the probes, after a backoff. A 503 budgets-changing
//     (one grant request's rules or memberships kept changing) pauses
//     nothing: that Admit is answered by on_unreachable, the budget's
//     next Admit asks again.
//   - Every final spend report (a grant's release) of a grant with
//     capacity left is written to Dir and fsynced before it is sent, and
//     removed only once Tally has it (spend.go), so no outage, hang or
//     restart loses spend: delivered before reclaim it frees the unspent
//     part, after it Tally records it as a late report that frees
//     nothing. A grant spent in full is recorded the same whether its
//     report arrives or the grant is reclaimed, so its report is written
//     only if Tally does not take it. Reports are written and sent
//     after the budget's lock is released, and those of a tick (or kept
//     while Tally was away) go in one POST /v1/grants/release.
//   - Close is bounded by Config.CloseTimeout and its ctx; what it could
//     not deliver stays in Dir and is returned as an *UndeliveredError.
//   - A lagged rule is answered as quota.Decision.Blocks says, from the
//     newest decision per key by (leader_epoch, seq), read by one reader per
//     partition from Config.DecisionHistory ago. Admit reads it through one
//     atomic pointer (no lock, no allocation). Stale (now - as_of >
//     stale_after): the rule's on_stale. None read yet: Config.OnStale.
//     A no_limit decision (the rule lost its lagged period limit) admits
//     and is never stale.
//   - A rule's kind is asked again whenever a decision brings a rule
//     version newer than the one last checked (and every RuleRecheck for a
//     lagged rule or none), so a rule turned exact gets grants, and grants
//     held under a rule turned lagged are released.
package admit
