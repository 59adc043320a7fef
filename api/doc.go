// Package api is Tally's REST API (docs/design.md §7): routing (chi), authentication,
// problem+json errors and the OpenAPI document (openapi.json, served at
// /openapi.json and tested against the real routes).
//
// Invariants:
//   - Every /v1 request is authenticated. The admin token may do everything;
//     a customer token may only read its own customer: another customer's
//     data answers 404 exactly as an unknown customer does, so a token never
//     learns which other customers exist, and any write answers 403.
//   - A customer token sees its data, never the operator's policy and
//     notes: no quota mode, on_stale, stale_after, actor or reason, and not
//     how a period was closed (forced, reason, actor, reconciliation).
//   - Nothing a caller sends grows the process without bound or waits in a
//     queue: metric labels come from fixed sets, rate limits (per address,
//     per customer token) answer 429 and a full MaxInFlight answers 503,
//     both with Retry-After; a token not shaped like one costs no query, and
//     an unknown one is remembered (package tokens verifies them). The
//     API's Postgres pool is its own.
//   - Usage is read from rollups, never from raw records, and is never
//     fresher than the ingest position says (as_of is a lower bound).
//   - Input is validated before any query; every statement is a constant in
//     queries.go with bind parameters.
//   - A period is closed only through periods.Store with reconcile.Gate, in
//     one transaction: without a clean run whose totals still hold, only a
//     forced close with a recorded reason gets through.
//   - Ingest, dead letters and reconciliations are admin-only: they name
//     customers.
//   - A change notification is a hint, never data: it makes the caches
//     forget, and positions are read from ingest_partitions. The caches are
//     used only while their listener is heard to keep up (internal/notify).
//   - Every error leaves through one function (writeError), which maps typed
//     errors to application/problem+json (RFC 9457).
//   - The web console (package console) goes through the same token check,
//     usage answer, replay and guard in process (inprocess.go), never
//     around them.
package api
