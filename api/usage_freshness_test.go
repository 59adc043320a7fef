package api_test

import (
	"testing"
	"time"

	"github.com/tally-ledger/tally/api"
)

// TestFreshnessPerCustomer: as_of is the applied_through of the customer's
// own partition, the topic's oldest for a customer ingest has not seen,
// read with the usage (no cache: a newer position shows at once).
func TestFreshnessPerCustomer(t *testing.T) {
	t.Parallel()
	f := newFixtureWith(t, func(c *api.Config) {
		c.Topic = "usage.v1"
	})
	for _, c := range []string{"acme", "globex", "initech", "hooli"} {
		f.usage(c, "api_calls", date("2026-11-20T10:00:00Z"), "1")
	}
	f.exec(`INSERT INTO ingest_partitions (topic, partition, next_offset, applied_through) VALUES
		('usage.v1', 0, 10, '2026-11-20T11:59:58Z'),
		('usage.v1', 1, 10, '2026-11-20T11:59:50.5Z'),
		('usage.v1', 2, 0, NULL),
		('tally.meter-batches', 0, 10, '2026-11-20T10:00:00Z')`)
	f.exec(`INSERT INTO ingest_customers (customer, topic, partition, first_seen) VALUES
		('acme', 'usage.v1', 0, now()), ('globex', 'usage.v1', 1, now()), ('initech', 'usage.v1', 2, now()),
		('hooli', 'tally.meter-batches', 0, now())`)
	asOf := func(customer string) (any, any) {
		t.Helper()
		m := f.do("GET", "/v1/customers/"+customer+"/usage", adminToken, nil).json(t)
		return m["as_of"], m["lag_seconds"]
	}
	for _, tc := range []struct {
		customer string
		asOf     any
		lag      any
	}{
		{"acme", "2026-11-20T11:59:58Z", 2.0},     // its own partition
		{"globex", "2026-11-20T11:59:50.5Z", 9.5}, // its own, the older one
		{"initech", nil, nil},                     // its partition has not reported: unknown
		{"hooli", nil, nil},                       // seen on another topic only: the topic's oldest, unknown while partition 2 is
	} {
		if a, l := asOf(tc.customer); a != tc.asOf || l != tc.lag {
			t.Errorf("%s: as_of %v lag %v, want %v %v", tc.customer, a, l, tc.asOf, tc.lag)
		}
	}

	f.exec(`UPDATE ingest_partitions SET applied_through = '2026-11-20T11:59:59Z' WHERE topic = 'usage.v1' AND partition = 0`)
	if a, l := asOf("acme"); a != "2026-11-20T11:59:59Z" || l != 1.0 {
		t.Errorf("after the partition moved: as_of %v lag %v", a, l)
	}
	f.exec(`UPDATE ingest_partitions SET applied_through = '2026-11-20T11:59:55Z' WHERE topic = 'usage.v1' AND partition = 2`)
	f.setNow(date("2026-11-20T12:00:00Z").Add(2 * time.Second))
	if a, l := asOf("hooli"); a != "2026-11-20T11:59:50.5Z" || l != 11.5 {
		t.Errorf("hooli: as_of %v lag %v, want the topic's oldest", a, l)
	}
	if a, l := asOf("initech"); a != "2026-11-20T11:59:55Z" || l != 7.0 {
		t.Errorf("initech: as_of %v lag %v", a, l)
	}
}
