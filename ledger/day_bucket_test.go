package ledger_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/tally-ledger/tally/ledger"
	"github.com/tally-ledger/tally/periods"
)

// TestDayBucketsWhereClocksSkipMidnight: in America/Havana the clocks go
// from 23:59:59 CST on 7 March 2026 to 01:00 CDT on the 8th, so the 8th
// starts at 05:00Z. A gauge's bucket days and a unique meter's member days
// are the local days: a reading at 23:30 CST on the 7th (04:30Z) is the
// 7th's, one at 01:10 CDT on the 8th (05:10Z) the 8th's, and the 7th ends
// where the 8th starts.
func TestDayBucketsWhereClocksSkipMidnight(t *testing.T) {
	f := newFixture(t)
	f.now = time.Date(2026, 3, 10, 0, 0, 0, 0, time.UTC)
	f.exec(`INSERT INTO customers (id, schedule) VALUES ('hav', '[{"effective_from":"0001-01-01T00:00:00Z","calendar":{"cadence":"monthly","anchor_day":1,"anchor_time":"00:00","zone":"America/Havana"}}]')`)
	for m, k := range map[string]ledger.MeterKind{"seats": ledger.Gauge, "mau": ledger.Unique} {
		if err := f.declare(m, k); err != nil {
			t.Fatal(err)
		}
	}
	lateOn7th := time.Date(2026, 3, 8, 4, 30, 0, 0, time.UTC)  // 23:30 CST on the 7th
	earlyOn8th := time.Date(2026, 3, 8, 5, 10, 0, 0, time.UTC) // 01:10 CDT on the 8th
	g := recBuilder{"p", 1, "hav", "seats"}
	u := recBuilder{"p", 1, "hav", "mau"}
	if got := kinds(f.apply(g.level(1, "2", time.Date(2026, 3, 7, 12, 0, 0, 0, time.UTC)), g.level(2, "7", lateOn7th),
		g.level(3, "3", earlyOn8th), u.member(1, "ann", lateOn7th), u.member(2, "bob", earlyOn8th))); got != "applied applied applied applied applied" {
		t.Fatalf("outcomes %s", got)
	}

	// The gauge: one level span per bucket day with readings.
	gu := f.gauge("hav", "seats", "2026-03-01")
	var spans string
	for _, l := range gu.Levels {
		spans += fmt.Sprintf("[%s %s max %s latest %s] ", l.Start.UTC().Format(time.RFC3339), l.End.UTC().Format(time.RFC3339), l.Max, l.Latest)
	}
	want := "[2026-03-01T05:00:00Z 2026-03-07T05:00:00Z max 0 latest 0] " +
		"[2026-03-07T05:00:00Z 2026-03-08T05:00:00Z max 7 latest 7] " +
		"[2026-03-08T05:00:00Z 2026-03-09T04:00:00Z max 7 latest 3] " +
		"[2026-03-09T04:00:00Z 2026-03-10T00:00:00Z max 3 latest 3] "
	if spans != want {
		t.Errorf("gauge level spans\n got %s\nwant %s", spans, want)
	}
	// 2 × 16h30m + 7 × 40m + 3 × 42h50m (to now): 118800 + 16800 + 462600.
	if gu.UnitSeconds.String() != "598200" {
		t.Errorf("gauge unit_seconds %s", gu.UnitSeconds)
	}

	// The unique meter: ann on the 7th, bob on the 8th.
	p, err := periods.Store{}.Schedule(context.Background(), f.pool, "hav")
	if err != nil {
		t.Fatal(err)
	}
	mar, err := p.Resolve("2026-03-01", f.now)
	if err != nil {
		t.Fatal(err)
	}
	us, err := ledger.ReadUniques(context.Background(), f.pool, "hav", "mau", mar)
	if err != nil {
		t.Fatal(err)
	}
	if len(us) != 1 {
		t.Fatalf("uniques %+v", us)
	}
	var days string
	for _, d := range us[0].Days {
		days += fmt.Sprintf("%s=%d ", d.Start.UTC().Format(time.RFC3339), d.Count)
	}
	if want := "2026-03-07T05:00:00Z=1 2026-03-08T05:00:00Z=1 "; us[0].Count != 2 || days != want {
		t.Errorf("unique count %d, days\n got %s\nwant %s", us[0].Count, days, want)
	}
	// The stored day of each reading is its local day's first instant.
	if got := f.scalar(`SELECT string_agg(member || '@' || to_char(day AT TIME ZONE 'UTC', 'MM-DD"T"HH24:MI'), ' ' ORDER BY member) FROM unique_readings`); got != "ann@03-07T05:00 bob@03-08T05:00" {
		t.Errorf("stored member days %s", got)
	}
}
