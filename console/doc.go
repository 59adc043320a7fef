// Package console is Tally's web console (docs/design.md §14), served at
// /console/ by `tally serve` and `tally dev`: server-rendered pages from
// embedded html/template files and one embedded stylesheet, no script.
// It reads through the same packages the REST API does (api for tokens,
// usage and replay; ingest, periods, quota, reconcile, admission) and
// never calls the API over HTTP.
//
// Invariants:
//   - Every page but sign-in needs a session. Sign-in exchanges a token
//     for a session cookie (random, server-side, HttpOnly, SameSite=Strict,
//     Secure when served over TLS); the session keeps the token and every
//     request checks it again through the API (a revoked token ends its
//     sessions as soon as the API hears of the revocation).
//   - The admin sees everything; a customer token sees only its customer:
//     another customer's page is the same 404 as an unknown customer's, and
//     admin-only pages answer 403, as in REST. Gateway tokens cannot sign in.
//   - A customer token is never shown the operator's policy and notes
//     (quota mode, on_stale, stale_after, actor, reason, how a period was
//     closed), as in REST.
//   - Every POST carries a CSRF token tied to the session (the sign-in form:
//     to a pre-session cookie) and is refused from another site
//     (Sec-Fetch-Site). Every response sets a Content-Security-Policy that
//     allows no script at all and nothing from another host.
//   - Everything shown is escaped by html/template: customer ids, meters,
//     dead-letter bytes and finding details are text, never markup.
//   - Amounts are exact decimals (shopspring/decimal) shown with thousands
//     separators; floats are used only for the chart's pixel positions.
package console
