package api

// The API's SQL, in one place. Every statement is a constant; values are
// always bind parameters, never text assembled from input.

const (
	// Authentication: a customer token by the SHA-256 of its secret.
	qTokenByHash = `SELECT id, customer FROM api_tokens WHERE token_hash = $1 AND revoked_at IS NULL`

	qInsertToken = `
INSERT INTO api_tokens (id, customer, description, token_hash, created_at)
VALUES ($1, $2, $3, $4, $5)`

	qRevokeToken = `
UPDATE api_tokens SET revoked_at = coalesce(revoked_at, $2)
WHERE id = $1
RETURNING customer, revoked_at`

	qListTokens = `
SELECT id, customer, description, created_at, revoked_at
FROM api_tokens
WHERE ($1::text IS NULL OR customer = $1)
ORDER BY created_at, id`

	qSelectSchedule = `SELECT schedule, created_at FROM customers WHERE id = $1`

	qSelectScheduleForUpdate = `SELECT schedule, created_at FROM customers WHERE id = $1 FOR UPDATE`

	// A customer created by PUT: its calendar applies from the beginning.
	qInsertCustomer = `
INSERT INTO customers (id, schedule, created_at, updated_at)
VALUES ($1, $2, $3, $3)
ON CONFLICT (id) DO NOTHING
RETURNING created_at`

	qUpdateSchedule = `UPDATE customers SET schedule = $2, updated_at = $3 WHERE id = $1`

	qPeriodClosed = `SELECT EXISTS (SELECT 1 FROM period_closes WHERE customer = $1 AND period_start = $2)`

	// Billed usage of one period per meter: a total row (key NULL) first,
	// then one row per series entry. By hour the key is the rollup bucket;
	// by day it is width_bucket's index into $4, the local midnights of the
	// period computed in Go (so day boundaries follow Go's zone rules, not
	// the server's); an hour bucket that starts before the period (an anchor
	// time such as 00:30) has index 0 and belongs to day 1. Sums are exact
	// NUMERIC; trim_scale gives canonical text.
	// Both read the rollups_usage index only.
	qUsageByHour = `
SELECT meter, bucket, trim_scale(sum(quantity))::text
FROM rollups
WHERE customer = $1 AND period_start = $2 AND ($3::text IS NULL OR meter = $3)
GROUP BY GROUPING SETS ((meter, bucket), (meter))
ORDER BY meter, bucket NULLS FIRST`

	qUsageByDay = `
SELECT meter, greatest(width_bucket(bucket, $4::timestamptz[]), 1), trim_scale(sum(quantity))::text
FROM rollups
WHERE customer = $1 AND period_start = $2 AND ($3::text IS NULL OR meter = $3)
GROUP BY GROUPING SETS ((meter, 2), (meter))
ORDER BY meter, 2 NULLS FIRST`

	// The ingest position of customer $1 on topic $2: usage is complete
	// through its partition's applied_through. A customer ingest has not
	// seen yet gets the oldest applied_through of the topic's partitions. NULL
	// (unknown, never "fresh") when that partition has not reported one yet,
	// or when any partition has not, or when there are no partitions at all.
	qIngestAsOf = `
SELECT CASE WHEN ic.partition IS NOT NULL THEN p.applied_through ELSE t.as_of END
FROM (SELECT CASE WHEN count(*) > 0 AND count(*) = count(applied_through) THEN min(applied_through) END AS as_of
      FROM ingest_partitions WHERE topic = $2) t
LEFT JOIN ingest_customers ic ON ic.customer = $1 AND ic.topic = $2
LEFT JOIN ingest_partitions p ON p.topic = ic.topic AND p.partition = ic.partition`

	qCustomerExists = `SELECT EXISTS (SELECT 1 FROM customers WHERE id = $1)`
)
