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
//   - exact, sized by demand: the same with the SDK's own sizing (and,
//     on a tight budget, its debits: each request's cost taken centrally).
//   - central counter in Postgres: one UPDATE … RETURNING per request.
//   - central counter in Postgres via HTTP: the same statement behind an
//     HTTP service of its own (a bearer token, a JSON body, a pool of
//     APIPoolSize connections), as gateways without database credentials
//     reach it: beside the row above, what the hop costs.
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
//   - central calls: HTTP requests to Tally (grants, debits, renewals,
//     releases, bypass reports), statements or scripts of a central counter, decision
//     evaluations of the lagged loop; per 1,000 admissions.
//   - latency: of the admission call as the gateway sees it; the grant
//     requests' and debits' own latency is in the exact rows' detail line,
//     with the mean of the API's handler beside the gateways' mean.
//   - first requests of a customer at a gateway (a line of their own,
//     of the trace): under grants each waits for a grant request, since a
//     gateway holds nothing for a customer it has not seen. When they are
//     more than 1% of the requests, the exact rows' p99 cannot be below
//     the grant request's latency at the quantile the line names.
//
// Several budgets per request (docs/design.md §13) are not simulated in the
// replay: every request draws on its customer's budget only. The hot key is
// measured apart, by RunHot (`tally bench admission --budgets
// customer,pool,global`, any subset): Holders concurrent holders, one
// customer each, every customer in one pool, take grants of 1 drawing on the
// budgets named (an exact rule each, its limit out of reach) in a closed
// loop for Duration per row:
//
//   - through the REST API: POST /v1/grants with a gateway token, then
//     POST /v1/grants/{id}/release with the unit spent;
//   - through the admission store in process: Issue, then Release;
//   - the store's Issue alone, the grants left live;
//   - baseline: a central Postgres counter, one statement per request that
//     locks the request's budget rows in key order, checks every one and
//     adds to all, a connection per holder.
//
// Grants/s, and p50/p99 of the grant request alone (the release after it
// not included). After each exact row the budgets are read back (REST for
// customers and the pool, the store for global): the customers' consumed
// add up to the grants, so do the pool's and global's, nothing is live that
// was released, no budget is over its limit. With global among the budgets
// a refusal phase follows: the global limit is set to what global consumed,
// every holder asks once through the API, each must be refused with global
// named as the binding budget, and no customer's, pool's or global budget
// may have moved.
package admissionbench
