package api_test

import (
	"strings"
	"testing"
	"time"

	"github.com/tally-ledger/tally/api"
)

// TestUsageCache: an answer is reused for at most UsageCacheTTL with the
// as_of it was read with (never claiming more than it holds), and a write
// through the API forgets the customer's answers at once.
func TestUsageCache(t *testing.T) {
	t.Parallel()
	const ttl = time.Second
	f := newFixtureWith(t, func(c *api.Config) { c.UsageCacheTTL = ttl })
	seedAcme(f)
	f.exec(`INSERT INTO ingest_partitions (topic, partition, next_offset, applied_through) VALUES
		('tally.meter-batches', 0, 10, '2026-11-20T11:59:50Z')`)
	get := func() map[string]any {
		t.Helper()
		return f.do("GET", "/v1/customers/acme/usage?meter=api_calls", adminToken, nil).json(t)
	}
	first := get()
	if first["total"] != "18.5" || first["as_of"] != "2026-11-20T11:59:50Z" || first["lag_seconds"] != 10.0 {
		t.Fatalf("first: %v", first)
	}

	// Usage and a newer position land behind the API's back: the cached
	// answer keeps its old as_of, and its lag grows with the clock.
	read := time.Now()
	f.usage("acme", "api_calls", date("2026-11-20T11:00:00Z"), "1")
	f.exec(`UPDATE ingest_partitions SET applied_through = '2026-11-20T11:59:59Z'`)
	f.setNow(date("2026-11-20T12:00:03Z"))
	cached := get()
	if time.Since(read) < ttl/2 { // entries live between ttl/2 and ttl
		t.Logf("checking the cached answer")
		if cached["total"] != "18.5" || cached["as_of"] != "2026-11-20T11:59:50Z" || cached["lag_seconds"] != 13.0 {
			t.Fatalf("cached: %v", cached)
		}
	}

	// An adjustment through the API: the next answer is read afresh.
	r := f.do("POST", "/v1/adjustments", adminToken, map[string]any{
		"operation_id": "0193e0a1-7c00-7d4e-9a51-3c2f9b7e4a11", "customer": "acme", "meter": "api_calls",
		"quantity": "-0.5", "reason": "goodwill", "actor": "ops"})
	if r.status != 201 {
		t.Fatalf("adjustment: %d %s", r.status, r.body)
	}
	fresh := get()
	if fresh["total"] != "19" || fresh["as_of"] != "2026-11-20T11:59:59Z" || fresh["lag_seconds"] != 4.0 {
		t.Fatalf("after the adjustment: %v", fresh)
	}

	// Another write behind its back shows once the TTL has passed.
	f.usage("acme", "api_calls", date("2026-11-20T11:30:00Z"), "2")
	time.Sleep(ttl + 50*time.Millisecond)
	if later := get(); later["total"] != "21" {
		t.Fatalf("after the TTL: %v", later)
	}
	if m := f.do("GET", "/metrics", adminToken, nil); !strings.Contains(string(m.body), `tally_api_usage_cache_total{result="hit"}`) {
		t.Fatalf("metrics lack the cache counter:\n%s", m.body)
	}
}
