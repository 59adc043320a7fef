// Package tokens owns the api_tokens table: customer and gateway tokens
// for the REST API, created, listed and revoked here (the CLI's `tally
// tokens`), and verified by Store.Verify (the API, the web console).
//
// Invariants:
//   - A secret is shown once, by Create: only its SHA-256 is stored.
//   - A secret not shaped like one Create gives (Prefix and 43 characters
//     of base64url) is refused without a query; one Postgres did not know
//     is remembered as refused for Config.FailedTTL, so a client repeating
//     a bad token costs no round trip. A token is never created after
//     being refused (its secret is 32 random bytes), and a revoked one
//     stays refused.
//   - A verified token is trusted without asking Postgres for
//     Config.CacheTTL, and beyond that (up to a minute) only while the
//     change listener (internal/notify) has been up since the token was
//     read and is live: a revocation is then heard, and drops the token.
//     A token read while a revocation was heard is not cached.
//   - KnownGateway tells, without a query, whether a gateway token was
//     verified lately (the API spares known gateways its per-address
//     limits): a revocation heard ends that too.
//   - The admin token is not a token of this package: it is the API's
//     configuration.
package tokens
