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

	// qPageTokens is a page of qListTokens after ($2, $3) in its order: by
	// api_tokens_created, or api_tokens_customer for one customer.
	qPageTokens = `
SELECT id, coalesce(customer, ''), description, created_at, revoked_at, coalesce(gateway, '')
FROM api_tokens
WHERE ($1::text IS NULL OR customer = $1)
  AND ($2::timestamptz IS NULL OR (created_at, id) > ($2, $3::uuid))
ORDER BY created_at, id
LIMIT $4`
)
