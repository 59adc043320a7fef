// Package admission owns exact admission: grants leased to gateways from
// budgets per (scope, meter, period) of quota rules whose admission is
// exact. A scope is a customer ("customer:<id>", in its billing calendar),
// a pool ("pool:<name>") or "global" (both monthly, UTC): docs/design.md §13.
//
// A grant {id, customer, meter, period, rule_version, holder, generation,
// amount, spent, issued_at, valid_until, ended_at, end_reason} is a stored
// permission for its holder (a gateway) to admit up to amount locally.
//
// Invariants:
//
//   - consumed = Σ amount of grants not released + Σ spent of released
//     grants, kept as a counter on the budget row. A grant is issued only if
//     consumed + amount ≤ limit (or a smaller grant of at least min_amount,
//     when the request allows one); the check, the insert and the counter
//     move in one transaction under a lock on the budget row, and a grant is
//     answered only after that transaction committed. So Σ of what all
//     holders may admit never exceeds the limit in force when each grant was
//     issued.
//
//   - spent is monotonic and never above amount. Renew and release are
//     fenced: only the grant's holder, in the grant's generation, and only
//     while that generation is the holder's newest; an older generation is
//     refused everything, so a restarted holder never inherits, or receives
//     again as fresh, what it held before.
//
//   - A grant ends when released (its final spent frees amount - spent at
//     once) or at valid_until + max_skew (reclaim_at), never earlier: a
//     silent holder may still be admitting. A grant that ends without a
//     final report counts as fully spent (its unspent part is stranded), so
//     expiry never changes consumed and no clock can hand capacity out
//     twice. Expiry is read from the clock (reclaim_at <= now), never
//     written: a stored grant keeps ended_at NULL until it is released.
//     A final report that arrives after reclaim_at, from the grant's own
//     holder and generation (even an older one), is recorded as its spent
//     and frees nothing: it corrects the record, never the budget.
//
//   - A rule change never hands out a fresh allowance: the limit applies to
//     consumed, which no rule change touches. Lowering the limit below
//     consumed stops new grants while live ones run out; raising it frees
//     capacity at once. Grants belong to one period (valid_until never
//     passes its end); a new period needs new grants.
//
//   - Admissions a holder made without a grant (Tally unreachable) are
//     bypasses, stored per holder, budget and period, idempotent by the
//     holder's report id. They are not drawn from the budget.
//
//   - A grant draws the same amount from every exact budget that applies to
//     its customer and meter (or the subset the request names), all or
//     nothing: taken from all in one transaction, or from none. Release
//     frees amount - spent in each; expiry counts it fully spent in each.
//
//   - Locks are taken in one order everywhere: the meters' advisory locks
//     (locks.ExactScope, sorted; issuing only), holder rows (sorted),
//     customer budget rows (sorted), pool and global budget rows sorted by
//     (scope, meter, period), grant rows. So no two transactions deadlock.
//
//   - Concurrent Issue calls share transactions (the combiner): each
//     request is decided in arrival order against the running totals of
//     its batch. Which budgets a request draws from is planned without
//     locks and checked under them (rules in force, memberships, periods);
//     a stale plan is made again, never used to decide.
//
//   - Concurrent Renew and Release calls (and ReleaseAll's reports) share
//     transactions the same way, in a combiner of their own
//     (report_batch.go): one round trip locks in the order above for the
//     whole batch, each report is fenced and decided on its own in arrival
//     order, one round trip writes, frees each budget's sum once and
//     commits; every caller is answered after the commit.
//
//   - The rule version in force is quota's one definition (the SQL
//     functions quota_rule_in_force and quota_scope_rule_in_force): the
//     latest effective_at not after the instant, ties by the higher version.
//
//   - Every budget counts in its own period (a customer's calendar; monthly
//     UTC for pools and global), never a member's. A budget row records the
//     rule version it was brought to; before anything is decided on a row
//     whose version in force is another (new, changed, turned exact
//     mid-period or again), it is brought to at least what its period
//     already consumed (its members' grants of the period and metered usage
//     they and bypasses do not explain), and the live grants so counted are
//     recorded as drawn from it. So no rule change, mode switch, join or
//     rejoin hands out a fresh allowance. Bringing a pool or global row
//     locks its meter exclusively, after every grant in flight on it.
//
// Times come from Config.Now (the API's clock), never from Postgres, so
// tests control expiry exactly.
package admission
