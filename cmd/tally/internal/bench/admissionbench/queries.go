package admissionbench

// The benchmark's own SQL, in one place: tables of its own beside Tally's
// schema in the benchmark database (a lagged regime's metered usage, a
// central counter). Values are always bind parameters.

const (
	qUsageTable = `CREATE TABLE IF NOT EXISTS bench_admission_usage (
	customer int PRIMARY KEY,
	used bigint NOT NULL)`
	qUsageClear = `TRUNCATE bench_admission_usage`

	// qUsageFlush meters one micro-batch of admitted usage, set-based.
	qUsageFlush = `
INSERT INTO bench_admission_usage AS u (customer, used)
SELECT * FROM unnest(@customers::int[], @deltas::bigint[])
ON CONFLICT (customer) DO UPDATE SET used = u.used + EXCLUDED.used`

	// qUsageExceeded is the decision loop's read: who is at or over the limit.
	qUsageExceeded = `SELECT customer FROM bench_admission_usage WHERE used >= @limit`

	qCounterTable = `CREATE TABLE IF NOT EXISTS bench_admission_counter (
	customer int PRIMARY KEY,
	used bigint NOT NULL,
	lim bigint NOT NULL)`
	qCounterClear = `TRUNCATE bench_admission_counter`
	qCounterFill  = `
INSERT INTO bench_admission_counter (customer, used, lim)
SELECT c, 0, @limit FROM generate_series(0, @customers - 1) AS c`

	// qCounterTake is the central counter: check and add in one statement,
	// under the row's lock; no row back means refused.
	qCounterTake = `
UPDATE bench_admission_counter SET used = used + @cost
WHERE customer = @customer AND used + @cost <= lim
RETURNING used`

	qCounterUsed = `SELECT customer, used FROM bench_admission_counter`
)

// redisTake is the Redis central counter: check and INCRBY in one script,
// atomic on the server. KEYS[1] the customer's counter, ARGV cost and limit;
// -1 means refused.
const redisTake = `
local used = tonumber(redis.call('GET', KEYS[1]) or '0')
local cost = tonumber(ARGV[1])
if used + cost > tonumber(ARGV[2]) then return -1 end
return redis.call('INCRBY', KEYS[1], cost)`

// The hot-key run's central counter: a row per budget key.
const (
	qHotTable = `CREATE TABLE IF NOT EXISTS bench_admission_hot (
	key text PRIMARY KEY,
	used bigint NOT NULL,
	lim bigint NOT NULL)`
	qHotClear = `TRUNCATE bench_admission_hot`
	qHotFill  = `INSERT INTO bench_admission_hot (key, used, lim) SELECT k, 0, @limit FROM unnest(@keys::text[]) AS k`

	// qHotTake checks and adds to every budget of a request in one
	// statement: the CTE locks the rows in key order (no deadlocks) and
	// reads their latest values; every row is updated or none. A row per
	// budget back means admitted.
	qHotTake = `
WITH locked AS (
	SELECT key, used, lim FROM bench_admission_hot WHERE key = ANY(@keys::text[]) ORDER BY key FOR UPDATE)
UPDATE bench_admission_hot c SET used = c.used + @cost
FROM locked l
WHERE c.key = l.key AND NOT EXISTS (SELECT 1 FROM locked x WHERE x.used + @cost > x.lim)
RETURNING c.used`

	qHotUsed = `SELECT key, used FROM bench_admission_hot`
)
