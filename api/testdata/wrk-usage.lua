-- A wrk script for the usage endpoint of a running `tally serve`: every
-- request asks for a random customer's usage with that customer's own token.
--
--   for c in cust-00000 cust-00010 ...; do
--     echo "$c $(tally tokens create --customer $c 2>/dev/null | tail -1)"
--   done > tokens.txt
--   TOKENS=tokens.txt wrk -t2 -c50 -d15s --latency -s api/testdata/wrk-usage.lua http://127.0.0.1:8080
--
-- For all 10,000 customers of BenchmarkUsage's database, tokens are quicker
-- made in SQL (benchmark use only: the CLI is the way to make real ones):
--
--   psql -h 127.0.0.1 -U root tally_bench_api <<'SQL'
--   DELETE FROM api_tokens;
--   CREATE TEMP TABLE t AS SELECT id AS customer, 'tly_' || substr(md5(random()::text) || md5(random()::text), 1, 43) AS secret FROM customers;
--   INSERT INTO api_tokens (id, customer, description, token_hash, created_at)
--     SELECT gen_random_uuid(), customer, 'wrk', sha256(convert_to(secret, 'UTF8')), now() FROM t;
--   \copy (SELECT customer || ' ' || secret FROM t) TO 'tokens.txt'
--   SQL
--   TALLY_DATABASE_URL='postgres://root@127.0.0.1:5432/tally_bench_api?sslmode=disable' \
--     TALLY_ADMIN_TOKEN=$(openssl rand -hex 32) tally serve --api --api-rate-per-address 0 --api-rate-per-token 0 &
--
-- USAGE_QUERY sets the query string (default: one meter, previous period).
local toks = {}
for line in io.lines(os.getenv("TOKENS") or "tokens.txt") do
  local c, t = line:match("^(%S+) (%S+)$")
  if c then toks[#toks + 1] = {c, t} end
end
local query = os.getenv("USAGE_QUERY") or "?meter=api_calls&period=previous"
math.randomseed(os.time())

request = function()
  local e = toks[math.random(#toks)]
  return wrk.format("GET", "/v1/customers/" .. e[1] .. "/usage" .. query, {["Authorization"] = "Bearer " .. e[2]})
end

done = function(summary, latency, requests)
  io.write(string.format("non-2xx responses: %d\n", summary.errors.status))
end
