package migrations_test

import (
	"context"
	"testing"

	"github.com/tally-ledger/tally/migrations"
)

// TestDailyRollupsBackfill: migration 00006 sums existing hourly rollups
// into local days in the zone of the calendar in force at each period's
// start, and loses nothing.
func TestDailyRollupsBackfill(t *testing.T) {
	ctx := context.Background()
	pool := poolAt(t, 5)
	exec := func(sql string) {
		t.Helper()
		if _, err := pool.Exec(ctx, sql); err != nil {
			t.Fatalf("%s: %v", sql, err)
		}
	}
	// ny moved from UTC to New York at its November boundary; utc has no
	// customers row (the default calendar applies).
	exec(`INSERT INTO customers (id, schedule) VALUES ('ny', '[
	  {"effective_from":"0001-01-01T00:00:00Z","calendar":{"cadence":"monthly","anchor_day":1,"anchor_time":"00:00","zone":"UTC"}},
	  {"effective_from":"2026-11-01T04:00:00Z","calendar":{"cadence":"monthly","anchor_day":1,"anchor_time":"00:00","zone":"America/New_York"}}]')`)
	exec(`INSERT INTO rollups (customer, meter, period_start, bucket, quantity) VALUES
	  ('ny', 'calls', '2026-10-01T00:00:00Z', '2026-10-31T23:00:00Z', 1),
	  ('ny', 'calls', '2026-10-01T00:00:00Z', '2026-10-31T22:00:00Z', 2),
	  ('ny', 'calls', '2026-11-01T04:00:00Z', '2026-11-02T03:00:00Z', 4),  -- 22:00 on Nov 1 in New York
	  ('ny', 'calls', '2026-11-01T04:00:00Z', '2026-11-02T05:00:00Z', 8),  -- 00:00 on Nov 2
	  ('utc', 'calls', '2026-11-01T00:00:00Z', '2026-11-02T03:00:00Z', 16.5)`)
	if err := migrations.UpTo(ctx, pool, 6); err != nil {
		t.Fatal(err)
	}
	var got string
	err := pool.QueryRow(ctx, `
SELECT string_agg(format('%s/%s/%s/%s=%s', customer, meter, to_char(period_start AT TIME ZONE 'UTC', 'MM-DD"T"HH24'), day, quantity), ' '
                  ORDER BY customer, period_start, day)
FROM rollups_daily`).Scan(&got)
	if err != nil {
		t.Fatal(err)
	}
	want := "ny/calls/10-01T00/2026-10-31=3 ny/calls/11-01T04/2026-11-01=4 ny/calls/11-01T04/2026-11-02=8 utc/calls/11-01T00/2026-11-02=16.5"
	if got != want {
		t.Fatalf("daily rollups:\n got %s\nwant %s", got, want)
	}
}
