package tokens

// The package's SQL, in one place; values are always bind parameters.
const (
	// A live token by the SHA-256 of its secret.
	qTokenByHash = `SELECT id, coalesce(customer, ''), coalesce(gateway, '') FROM api_tokens WHERE token_hash = $1 AND revoked_at IS NULL`

	qInsertToken = `
INSERT INTO api_tokens (id, customer, description, token_hash, created_at, gateway)
VALUES ($1, nullif($2, ''), $3, $4, $5, nullif($6, ''))`

	qRevokeToken = `
UPDATE api_tokens SET revoked_at = coalesce(revoked_at, $2)
WHERE id = $1
RETURNING coalesce(customer, ''), description, created_at, revoked_at, coalesce(gateway, '')`

	qListTokens = `
SELECT id, coalesce(customer, ''), description, created_at, revoked_at, coalesce(gateway, '')
FROM api_tokens
WHERE ($1::text IS NULL OR customer = $1)
ORDER BY created_at, id`

	// qPageTokens is a page of qListTokens after ($1, $2) in its order
	// ('-infinity' for the first), by api_tokens_created; qPageTokensOf one
	// customer's ($4), by api_tokens_customer. Two statements, not one with
	// "$4 IS NULL OR …": as the generic plan Postgres settles on for a
	// prepared statement, that read every token before the page.
	qPageTokensFrom = `
SELECT id, coalesce(customer, ''), description, created_at, revoked_at, coalesce(gateway, '')
FROM api_tokens
WHERE `
	qPageTokensAfter = `(created_at, id) > ($1, $2::uuid)
ORDER BY created_at, id
LIMIT $3`
	qPageTokens   = qPageTokensFrom + qPageTokensAfter
	qPageTokensOf = qPageTokensFrom + `customer = $4 AND ` + qPageTokensAfter
)
