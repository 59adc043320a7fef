// Package admission owns exact admission: grants leased to gateways from a
// budget per (customer, meter, billing period) of a quota rule whose
// admission is exact.
//
// A grant {id, customer, meter, period, rule_version, holder, generation,
// amount, spent, issued_at, valid_until, ended_at, end_reason} is a stored
// permission for its holder (a gateway) to admit up to amount locally.
//
// Invariants:
//   - consumed = Σ amount of grants not released + Σ spent of released
//     grants, kept as a counter on the budget row. A grant is issued only if
//     consumed + amount ≤ limit (or a smaller grant of at least min_amount,
//     when the request allows one); the check, the insert and the counter
//     move in one transaction under a lock on the budget row, and a grant is
//     answered only after that transaction committed. So Σ of what all
//     holders may admit never exceeds the limit in force when each grant was
//     issued.
//   - spent is monotonic and never above amount. Renew and release are
//     fenced: only the grant's holder, in the grant's generation, and only
//     while that generation is the holder's newest; an older generation is
//     refused everything, so a restarted holder never inherits, or receives
//     again as fresh, what it held before.
//   - A grant ends when released (its final spent frees amount - spent at
//     once) or at valid_until + max_skew (reclaim_at), never earlier: a
//     silent holder may still be admitting. A grant that ends without a
//     final report counts as fully spent (its unspent part is stranded), so
//     expiry never changes consumed and no clock can hand capacity out
//     twice. Expiry is read from the clock (reclaim_at <= now), never
//     written: a stored grant keeps ended_at NULL until it is released.
//   - A rule change never hands out a fresh allowance: the limit applies to
//     consumed, which no rule change touches. Lowering the limit below
//     consumed stops new grants while live ones run out; raising it frees
//     capacity at once. Grants belong to one period (valid_until never
//     passes its end); a new period needs new grants.
//   - Admissions a holder made without a grant (Tally unreachable) are
//     bypasses, stored per holder, budget and period, idempotent by the
//     holder's report id. They are not drawn from the budget.
//
// Times come from Config.Now (the API's clock), never from Postgres, so
// tests control expiry exactly; locks order holder row, budget row, grant
// row, everywhere.
package admission
