package ledger_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	"pgregory.net/rapid"

	"github.com/tally-ledger/tally/ledger"
	"github.com/tally-ledger/tally/periods"
)

// TestPropertyUniqueCounts delivers random member sightings (several
// producers and epochs, members seen again in the same and other periods,
// in zones with half-hour offsets and daily or monthly periods) in random
// micro-batches with duplicates and reorders. After every schedule, every
// period's and every bucket day's count equals the distinct members of the
// distinct sightings that occurred in it, and re-delivering the whole
// schedule changes nothing.
func TestPropertyUniqueCounts(t *testing.T) {
	f := newFixture(t)
	if err := f.declare("mau", ledger.Unique); err != nil {
		t.Fatal(err)
	}
	iteration := 0
	rapid.Check(t, func(rt *rapid.T) {
		iteration++
		checkUniqueSchedule(rt, f, fmt.Sprintf("u%d", iteration))
	})
}

func checkUniqueSchedule(rt *rapid.T, f *fixture, ns string) {
	ctx := context.Background()
	customer := ns + "-c"
	zone := rapid.SampledFrom([]string{"UTC", "Asia/Kolkata", "America/St_Johns"}).Draw(rt, "zone")
	cadence := rapid.SampledFrom([]string{"monthly", "daily"}).Draw(rt, "cadence")
	anchor := map[string]string{"monthly": "1", "daily": "0"}[cadence]
	if _, err := f.pool.Exec(ctx, `INSERT INTO customers (id, schedule) VALUES ($1, $2)`, customer,
		`[{"effective_from":"0001-01-01T00:00:00Z","calendar":{"cadence":"`+cadence+`","anchor_day":`+anchor+`,"anchor_time":"00:00","zone":"`+zone+`"}}]`); err != nil {
		rt.Fatal(err)
	}
	base := time.Date(2026, 10, 30, 18, 0, 0, 0, time.UTC)
	f.now = base.Add(5 * 24 * time.Hour)
	var recs []ledger.Record
	type sighting struct {
		member string
		at     time.Time
	}
	var truth []sighting
	for _, p := range []string{"a", "b"} {
		for epoch := int64(1); epoch <= rapid.Int64Range(1, 2).Draw(rt, "epochs"); epoch++ {
			b := recBuilder{producer: ns + "-p" + p, epoch: epoch, customer: customer, meter: "mau"}
			n := rapid.IntRange(0, 15).Draw(rt, "sightings")
			for seq := int64(1); seq <= int64(n); seq++ {
				m := fmt.Sprintf("user-%d", rapid.IntRange(1, 6).Draw(rt, "member"))
				at := base.Add(time.Duration(rapid.Int64Range(0, 4*24*3600).Draw(rt, "at")) * time.Second)
				recs = append(recs, b.member(seq, m, at))
				truth = append(truth, sighting{m, at})
			}
		}
	}
	if len(recs) == 0 {
		return
	}
	order := rapid.Permutation(recs).Draw(rt, "order")
	var sched []ledger.Record
	for _, r := range order {
		sched = append(sched, r)
		if rapid.IntRange(0, 4).Draw(rt, "dup") == 0 {
			sched = append(sched, r)
		}
	}
	deliver := func() {
		for rs := sched; len(rs) > 0; {
			n := min(len(rs), rapid.IntRange(1, 7).Draw(rt, "batch"))
			for i, o := range f.applyUniques(rs[:n]) {
				if o.Kind != ledger.Applied && o.Kind != ledger.LateFill && o.Kind != ledger.Duplicate {
					rt.Fatalf("sighting %+v: %s %s", rs[i], o.Kind, o.Detail)
				}
			}
			rs = rs[n:]
		}
	}
	deliver()
	sch, err := periods.Store{}.Schedule(ctx, f.pool, customer)
	if err != nil {
		rt.Fatal(err)
	}
	check := func() {
		p, err := sch.PeriodAt(base)
		if err != nil {
			rt.Fatal(err)
		}
		for !p.Start.After(f.now) {
			us, err := ledger.ReadUniques(ctx, f.pool, customer, "mau", p)
			if err != nil {
				rt.Fatal(err)
			}
			want := map[string]bool{}
			wantDays := map[int64]map[string]bool{}
			for _, s := range truth {
				if !p.Contains(s.at) {
					continue
				}
				want[s.member] = true
				day, _, _, err := ledger.DayBucket(sch, s.at)
				if err != nil {
					rt.Fatal(err)
				}
				if wantDays[day.UnixMicro()] == nil {
					wantDays[day.UnixMicro()] = map[string]bool{}
				}
				wantDays[day.UnixMicro()][s.member] = true
			}
			var got ledger.UniqueUsage
			if len(us) == 1 {
				got = us[0]
			}
			if got.Count != int64(len(want)) || len(got.Days) != len(wantDays) {
				rt.Fatalf("period %s: %d members over %d days, want %d over %d", p.Name, got.Count, len(got.Days), len(want), len(wantDays))
			}
			for _, d := range got.Days {
				if int64(len(wantDays[d.Start.UnixMicro()])) != d.Count {
					rt.Fatalf("period %s day %s: %d members, want %d", p.Name, d.Start, d.Count, len(wantDays[d.Start.UnixMicro()]))
				}
			}
			if p, err = sch.Next(p); err != nil {
				rt.Fatal(err)
			}
		}
	}
	check()
	deliver() // everything again: all duplicates
	check()
}
