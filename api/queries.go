package api

// The API's SQL, in one place. Every statement is fixed text (the usage
// pair is assembled from constants); values are always bind parameters,
// never text assembled from input.

const (
	// A usage answer is one statement, so one snapshot: the header's
	// closed flag and ingest position (as_of) and the usage rows with it
	// are consistent with each other: usage holds everything ingest had
	// applied through as_of. $1 customer, $2 period start, $3 meter or
	// NULL for all, $4 the ingest topic.
	//
	// as_of is the applied_through of the customer's own partition
	// (ingest_customers records which one its key hashes to). A customer
	// ingest has not seen yet gets the oldest applied_through of the
	// topic's partitions: a lower bound whatever partition it will hash
	// to. NULL (unknown, never "fresh") when that partition has not
	// reported one yet, or when any partition has not, or there are none.
	//
	// A usage row is one meter with usage in the period: its buckets and
	// their quantities as arrays in time order, and its total (one row per
	// meter instead of one per bucket halves Postgres's work per request).
	// Sums are exact NUMERIC; trim_scale gives canonical text, which the
	// answer carries as its JSON strings unparsed (the API does no
	// arithmetic on them, so there is nothing to scan them into). With no
	// usage there is one row, the header, with NULL usage columns.
	usageHeader = `
WITH h AS (
  SELECT EXISTS (SELECT 1 FROM period_closes WHERE customer = $1 AND period_start = $2) AS closed,
         CASE WHEN ic.partition IS NULL
              THEN (SELECT CASE WHEN count(*) > 0 AND count(*) = count(applied_through) THEN min(applied_through) END
                    FROM ingest_partitions WHERE topic = $4)
              ELSE p.applied_through END AS as_of,
         ic.partition AS part
  FROM (SELECT) one
  LEFT JOIN ingest_customers ic ON ic.customer = $1 AND ic.topic = $4
  LEFT JOIN ingest_partitions p ON p.topic = ic.topic AND p.partition = ic.partition
)
SELECT h.closed, h.as_of, h.part, u.meter, u.keys, u.qtys, u.total
FROM h LEFT JOIN LATERAL (`

	// The positions the usage cache starts from (usage_watch.go).
	qWatchPositions = `SELECT partition, applied_through FROM ingest_partitions WHERE topic = $1`

	// The listener's marker after a read of the positions.
	qNotify = `SELECT pg_notify($1, $2)`

	qNotifyQueueUsage = `SELECT pg_notification_queue_usage()`

	qCustomerExists = `SELECT EXISTS (SELECT 1 FROM customers WHERE id = $1)`
)

// The usage statements: by local day from the daily rollups (migration
// 00006, at most 31 per meter), by hour from the hourly ones; each by an
// index-only scan (rollups_daily's primary key, rollups_usage).
var (
	qUsageByDay  = usageQuery("rollups_daily", "day")
	qUsageByHour = usageQuery("rollups", "bucket")
)

// usageQuery is usageHeader over one rollup table and its time column.
// Both arguments are the constants above, never input.
func usageQuery(table, key string) string {
	return usageHeader + `
  SELECT meter, array_agg(` + key + ` ORDER BY ` + key + `) AS keys,
         array_agg(trim_scale(quantity)::text ORDER BY ` + key + `) AS qtys, trim_scale(sum(quantity))::text AS total
  FROM ` + table + `
  WHERE customer = $1 AND period_start = $2 AND ($3::text IS NULL OR meter = $3)
  GROUP BY meter) u ON true
ORDER BY u.meter`
}
