-- A wrk script for the usage endpoint of a running `tally serve`: every
-- request asks for a random customer's usage with that customer's own token.
--
--   for c in cust-00000 cust-00010 ...; do
--     echo "$c $(tally tokens create --customer $c 2>/dev/null | tail -1)"
--   done > tokens.txt
--   TOKENS=tokens.txt wrk -t2 -c50 -d15s --latency -s api/testdata/wrk-usage.lua http://127.0.0.1:8080
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
