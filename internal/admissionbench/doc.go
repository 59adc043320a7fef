// Package admissionbench is the benchmark behind `tally bench admission`:
// the compromise of exact admission (docs/design.md §12) in numbers, against
// the targets of docs/design.md §10. It is a measuring tool, not an API.
//
// One demand trace (G gateways × C customers, Zipf-skewed across customers,
// bursty in time, every request of cost 1) is replayed in real time, once
// per regime, each regime against budgets of its own:
//
//   - lagged: today's decisions (§5). Gateways admit unless the latest
//     decision says the customer is exceeded. Admitted usage is metered to
//     Postgres in micro-batches (LagFlush); a decision loop reads it every
//     LagInterval (the enforcer's interval) and flips customers at or over
//     the limit. The lag from the admission that reached the limit to the
//     decision is measured.
//   - exact, fixed grant: the real admit SDK against the real REST API and
//     Postgres, each gateway taking grants of FixedGrant units per budget,
//     a new one when less than half of that is left (demand sizing off:
//     Lookahead 1 ns, MinGrant FixedGrant).
//   - exact, sized by demand: the same with the SDK's own sizing.
//   - central counter in Postgres: one UPDATE … RETURNING per request.
//   - central counter in Redis: one Lua check-and-INCRBY per request
//     (skipped, with the reason, when no Redis answers). Redis is a
//     dependency of this benchmark only, never of Tally.
//
// Definitions (per regime; the end of the replay stands in for the
// period's end):
//
//   - admitted ÷ limit: the highest ratio over customers; over limit is
//     Σ max(0, admitted − limit).
//   - stranded: granted but unspent when the replay ends (Σ consumed −
//     admitted over budgets, read from Postgres before the gateways release).
//   - false denial: a request refused while the customer's admissions so
//     far, over all gateways, plus its cost were within the limit — one an
//     exact central counter would have admitted, so the capacity sat unspent
//     in some gateway's grant (or was not yet granted). The §10 target is
//     their share among requests made while the customer's demand so far
//     (requests offered, this one included) was at most 95% of the limit.
//   - central calls: HTTP requests to Tally (grants, renewals, releases,
//     bypass reports), statements or scripts of a central counter, decision
//     evaluations of the lagged loop; per 1,000 admissions.
//   - latency: of the admission call as the gateway sees it; the grant
//     requests' own latency is in the exact rows' detail line.
//
// Several budgets per request (docs/design.md §13) are not simulated: every
// request draws on its customer's budget only. The way in is a
// `--budgets customer,pool,global` option naming the budgets a request
// draws on: the trace stays as it is, each system maps a request to its
// budgets (a pool per group of customers, one global budget), the counters
// check-and-add every budget in one statement or script, the lagged loop
// blocks on any budget over its limit, the exact regimes need the SDK to
// hold a grant per budget, and the per-customer figures become per-budget
// ones. The hot-budget figure (grants/s and p99 grant latency with 50
// holders on one global budget) is then this benchmark with --budgets
// global --gateways 50.
package admissionbench
