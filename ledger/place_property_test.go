package ledger_test

import (
	"context"
	"encoding/json"
	"fmt"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/shopspring/decimal"
	"pgregory.net/rapid"

	"github.com/tally-ledger/tally/ledger"
	"github.com/tally-ledger/tally/periods"
)

// TestPropertyEveryRecordBilledWhereItsOwnLookupSays applies streams whose
// records occurred minutes apart, forwards and backwards in time, around
// the instants where a customer's billing place is easiest to get wrong:
// a zone's daylight-saving change (Lord Howe Island's moves its clock by
// half an hour), a zone whose offset is not whole hours (St John's,
// Kathmandu), a period boundary, and a calendar that changes zone there.
// A micro-batch bills a stream's records that occurred in the same hour
// without looking their place up again (apply.go's billing runs); every
// record must still lie in the period and hourly bucket that looking its
// own occurrence up gives (periods.Schedule.PeriodAt, ledger.Bucket), and
// every hourly rollup must hold exactly its records' amounts.
func TestPropertyEveryRecordBilledWhereItsOwnLookupSays(t *testing.T) {
	f := newFixture(t)
	f.now = time.Date(2026, 12, 6, 0, 0, 0, 0, time.UTC)
	ctx := context.Background()
	zones := []string{"Australia/Lord_Howe", "America/St_Johns", "Asia/Kathmandu", "America/New_York", "UTC"}
	// Instants to start from: each zone's first offset change after
	// 2026-09-15, and the end of October in each zone.
	var starts []time.Time
	for _, z := range zones {
		loc, err := time.LoadLocation(z)
		if err != nil {
			t.Fatal(err)
		}
		if _, end := time.Date(2026, 9, 15, 0, 0, 0, 0, loc).ZoneBounds(); !end.IsZero() {
			starts = append(starts, end)
		}
		starts = append(starts, time.Date(2026, 11, 1, 0, 0, 0, 0, loc))
	}
	iteration := 0
	rapid.Check(t, func(rt *rapid.T) {
		iteration++
		ns := fmt.Sprintf("place%d", iteration)
		customer := ns + "-c"
		cal := func(label string) periods.Calendar {
			return periods.Calendar{Cadence: "monthly", AnchorDay: 1,
				AnchorTime: rapid.SampledFrom([]string{"00:00", "00:30", "02:15"}).Draw(rt, label+"-anchor"),
				Zone:       rapid.SampledFrom(zones).Draw(rt, label+"-zone")}
		}
		sched := periods.NewSchedule(cal("first"))
		if rapid.Bool().Draw(rt, "change") { // a new calendar from the end of October's period
			var err error
			if sched, _, err = sched.Change(time.Date(2026, 10, 20, 0, 0, 0, 0, time.UTC), cal("second")); err != nil {
				rt.Fatal(err)
			}
		}
		js, err := json.Marshal(sched)
		if err != nil {
			rt.Fatal(err)
		}
		f.exec(`INSERT INTO customers (id, schedule) VALUES ($1, $2)`, customer, string(js))

		var recs []ledger.Record
		for i := range rapid.IntRange(1, 2).Draw(rt, "streams") {
			b := recBuilder{producer: ns + "-p", epoch: 1, customer: customer, meter: fmt.Sprintf("m%d", i)}
			at := rapid.SampledFrom(starts).Draw(rt, "start").Add(time.Duration(rapid.IntRange(-150, 150).Draw(rt, "offset")) * time.Minute)
			total := decimal.Zero
			for seq := range int64(rapid.IntRange(1, 60).Draw(rt, "records")) {
				total = total.Add(decimal.New(rapid.Int64Range(0, 5000).Draw(rt, "q"), -2))
				recs = append(recs, b.rec(seq+1, total.String(), at))
				at = at.Add(time.Duration(rapid.IntRange(-40, 70).Draw(rt, "step")) * time.Minute)
			}
		}
		for len(recs) > 0 { // in order, in micro-batches
			n := min(rapid.IntRange(1, 40).Draw(rt, "batch"), len(recs))
			f.apply(recs[:n]...)
			recs = recs[n:]
		}

		rows, err := f.pool.Query(ctx, `SELECT meter, occurred_at, period_start, bucket, billed FROM records WHERE customer = $1`, customer)
		if err != nil {
			rt.Fatal(err)
		}
		type place struct {
			meter          string
			period, bucket time.Time
		}
		want := map[place]decimal.Decimal{}
		var meter string
		var occurred, period, bucket time.Time
		var billed decimal.Decimal
		_, err = pgx.ForEachRow(rows, []any{&meter, &occurred, &period, &bucket, &billed}, func() error {
			p, err := sched.PeriodAt(occurred)
			if err != nil {
				return err
			}
			b, err := ledger.Bucket(sched, occurred)
			if err != nil {
				return err
			}
			if !period.Equal(p.Start) || !bucket.Equal(b) {
				return fmt.Errorf("%s record that occurred at %s: billed in period %s, bucket %s; its own lookup says %s, %s",
					meter, occurred.UTC(), period.UTC(), bucket.UTC(), p.Start.UTC(), b.UTC())
			}
			k := place{meter, p.Start.UTC(), b.UTC()}
			want[k] = want[k].Add(billed)
			return nil
		})
		if err != nil {
			rt.Fatal(err)
		}
		rows, err = f.pool.Query(ctx, `SELECT meter, period_start, bucket, quantity FROM rollups WHERE customer = $1`, customer)
		if err != nil {
			rt.Fatal(err)
		}
		got := map[place]decimal.Decimal{}
		_, err = pgx.ForEachRow(rows, []any{&meter, &period, &bucket, &billed}, func() error {
			got[place{meter, period.UTC(), bucket.UTC()}] = billed
			return nil
		})
		if err != nil {
			rt.Fatal(err)
		}
		for k, q := range want {
			if !got[k].Equal(q) {
				rt.Fatalf("rollup %s %s %s holds %s; its records billed %s", k.meter, k.period, k.bucket, got[k], q)
			}
		}
		for k, q := range got {
			if _, ok := want[k]; !ok && !q.IsZero() {
				rt.Fatalf("rollup %s %s %s holds %s; no record is billed there", k.meter, k.period, k.bucket, q)
			}
		}
	})
}
