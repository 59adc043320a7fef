package ledger_test

import (
	"context"
	"fmt"
	"sort"
	"testing"
	"time"

	"github.com/shopspring/decimal"
	"pgregory.net/rapid"

	"github.com/tally-ledger/tally/ledger"
	"github.com/tally-ledger/tally/periods"
)

// gaugeTruth is a reading as the brute force sees it.
type gaugeTruth struct {
	producer string
	epoch    int64
	seq      int64
	level    decimal.Decimal
	at       time.Time
	final    bool
}

// bruteGauge computes a gauge's aggregates over [start, asOf) from the
// readings alone, by the rules of docs/design.md §16 and nothing else: a
// stream's level at x is the effective level of its highest seq read at or
// before x, 0 from the first reading of a newer epoch of its producer on;
// the customer's level is the sum; the level is constant between
// consecutive instants at which any reading or epoch end happens.
func bruteGauge(rs []gaugeTruth, start, asOf time.Time) (mx, latest, us decimal.Decimal) {
	type sk struct {
		p string
		e int64
	}
	ends := map[sk]time.Time{}
	for _, r := range rs {
		for _, o := range rs {
			if o.producer == r.producer && o.epoch < r.epoch {
				k := sk{o.producer, o.epoch}
				if e, ok := ends[k]; !ok || r.at.Before(e) {
					ends[k] = r.at
				}
			}
		}
	}
	levelAt := func(x time.Time) decimal.Decimal {
		best := map[sk]gaugeTruth{}
		for _, r := range rs {
			k := sk{r.producer, r.epoch}
			if e, ok := ends[k]; ok && !x.Before(e) {
				continue
			}
			if r.at.After(x) {
				continue
			}
			if b, ok := best[k]; !ok || r.seq > b.seq {
				best[k] = r
			}
		}
		sum := decimal.Zero
		for _, r := range best {
			if !r.final {
				sum = sum.Add(r.level)
			}
		}
		return sum
	}
	if !asOf.After(start) {
		// As of the period's start: only readings stamped before it, as
		// readings stamped at asOf are not counted below either.
		l := levelAt(start.Add(-time.Microsecond))
		return l, l, decimal.Zero
	}
	cuts := map[int64]bool{start.UnixMicro(): true}
	for _, r := range rs {
		if r.at.After(start) && r.at.Before(asOf) {
			cuts[r.at.UnixMicro()] = true
		}
	}
	for _, e := range ends {
		if e.After(start) && e.Before(asOf) {
			cuts[e.UnixMicro()] = true
		}
	}
	ts := make([]int64, 0, len(cuts))
	for c := range cuts {
		ts = append(ts, c)
	}
	sort.Slice(ts, func(i, j int) bool { return ts[i] < ts[j] })
	for i, c := range ts {
		l := levelAt(time.UnixMicro(c))
		next := asOf.UnixMicro()
		if i+1 < len(ts) {
			next = ts[i+1]
		}
		if i == 0 || l.GreaterThan(mx) {
			mx = l
		}
		us = us.Add(l.Mul(decimal.New(next-c, -6)))
		latest = l
	}
	return mx, latest, us
}

// TestPropertyGaugeAggregates generates gauge streams (several producers
// and epochs, equal timestamps, finals, levels spanning period boundaries
// in several zones and cadences) and delivers their readings in random
// micro-batches (reordered, duplicated, some held back and delivered
// last). After every schedule, in every period, each aggregate the ledger
// answers from its buckets equals the brute force over the readings; a
// period closed midway keeps the aggregates read at its close, and the
// prior-period adjustments billed for it afterwards are exactly what its
// level-seconds changed by; delivering the whole schedule again changes
// nothing.
//
// More schedules: go test ./ledger -run PropertyGauge -rapid.checks=2000
func TestPropertyGaugeAggregates(t *testing.T) {
	f := newFixture(t)
	if err := f.declare("seats", ledger.Gauge); err != nil {
		t.Fatal(err)
	}
	iteration := 0
	rapid.Check(t, func(rt *rapid.T) {
		iteration++
		checkGaugeSchedule(rt, f, fmt.Sprintf("g%d", iteration))
	})
	for what, sql := range map[string]string{
		"late readings":       `SELECT count(*) FROM gauge_readings WHERE late_fill`,
		"recomputed buckets":  `SELECT count(*) FROM gauge_days WHERE last_at IS NOT NULL`,
		"ended epochs":        `SELECT count(*) FROM gauge_streams WHERE ends_at IS NOT NULL`,
		"finals":              `SELECT count(*) FROM gauge_readings WHERE final`,
		"closed-period moves": `SELECT count(*) FROM gauge_adjustments`,
	} {
		if n := f.scalar(sql); n == "0" {
			t.Errorf("the schedules produced no %s", what)
		}
	}
}

func checkGaugeSchedule(rt *rapid.T, f *fixture, ns string) {
	ctx := context.Background()
	customer := ns + "-c"
	zone := rapid.SampledFrom([]string{"UTC", "America/New_York", "Asia/Kolkata", "America/St_Johns"}).Draw(rt, "zone")
	cadence := rapid.SampledFrom([]string{"monthly", "daily"}).Draw(rt, "cadence")
	anchor := map[string]string{"monthly": "1", "daily": "0"}[cadence]
	if _, err := f.pool.Exec(ctx, `INSERT INTO customers (id, schedule) VALUES ($1, $2)`, customer,
		`[{"effective_from":"0001-01-01T00:00:00Z","calendar":{"cadence":"`+cadence+`","anchor_day":`+anchor+`,"anchor_time":"00:00","zone":"`+zone+`"}}]`); err != nil {
		rt.Fatal(err)
	}
	base := time.Date(2026, 10, 30, 20, 0, 0, 0, time.UTC)

	var truth []gaugeTruth
	var recs []ledger.Record
	nStreams := rapid.IntRange(1, 4).Draw(rt, "streams")
	seen := map[string]bool{}
	for i := 0; i < nStreams; i++ {
		b := recBuilder{producer: ns + "-p" + rapid.SampledFrom([]string{"a", "b"}).Draw(rt, "producer"),
			epoch: rapid.Int64Range(1, 3).Draw(rt, "epoch"), customer: customer, meter: "seats"}
		if k := fmt.Sprint(b); seen[k] {
			continue
		} else {
			seen[k] = true
		}
		at := base.Add(time.Duration(rapid.Int64Range(0, 48*3600).Draw(rt, "start")) * time.Second)
		n := rapid.IntRange(1, 12).Draw(rt, "readings")
		for seq := int64(1); seq <= int64(n); seq++ {
			// Equal timestamps sometimes; microsecond offsets sometimes.
			at = at.Add(time.Duration(rapid.SampledFrom([]int64{0, 1, 90e6, 3600e6, 7 * 3600e6, 20 * 3600e6}).Draw(rt, "step")) * time.Microsecond)
			level := decimal.New(rapid.Int64Range(0, 5000).Draw(rt, "level"), -int32(rapid.IntRange(0, 2).Draw(rt, "scale")))
			final := seq == int64(n) && rapid.Bool().Draw(rt, "final")
			r := b.level(seq, level.String(), at)
			r.Final = final
			recs = append(recs, r)
			truth = append(truth, gaugeTruth{b.producer, b.epoch, seq, level, at, final})
		}
	}

	// Now is a little after the last reading (within the same local day,
	// sometimes, so the current bucket is cut at now).
	f.now = base
	for _, r := range truth {
		if r.at.After(f.now) {
			f.now = r.at
		}
	}
	f.now = f.now.Add(time.Duration(rapid.Int64Range(1, 40*3600).Draw(rt, "nowAfter")) * time.Second)

	// Deliver: a random order, some duplicated, some held back until last.
	order := rapid.Permutation(recs).Draw(rt, "order")
	var first, held []ledger.Record
	for _, r := range order {
		if rapid.IntRange(0, 5).Draw(rt, "hold") == 0 {
			held = append(held, r)
		} else {
			first = append(first, r)
		}
		if rapid.IntRange(0, 6).Draw(rt, "dup") == 0 {
			first = append(first, r)
		}
	}
	// Close a period midway (the one holding base+1d), reading its
	// aggregates at close: they are its frozen statement.
	closeAt := rapid.IntRange(0, len(first)).Draw(rt, "closeAt")
	closeIt := rapid.Bool().Draw(rt, "close")
	sch, err := periods.Store{}.Schedule(ctx, f.pool, customer)
	if err != nil {
		rt.Fatal(err)
	}
	closed, err := sch.PeriodAt(base.Add(24 * time.Hour))
	if err != nil {
		rt.Fatal(err)
	}
	if closeIt && f.now.Before(closed.End.Add(time.Second)) {
		f.now = closed.End.Add(time.Second)
	}
	var frozen ledger.GaugeUsage
	deliver := func(rs []ledger.Record) {
		for len(rs) > 0 {
			n := min(len(rs), rapid.IntRange(1, 6).Draw(rt, "batch"))
			out := f.apply(rs[:n]...)
			for i, o := range out {
				if o.Kind != ledger.Applied && o.Kind != ledger.LateFill && o.Kind != ledger.Duplicate {
					rt.Fatalf("reading %+v: %s %s %s", rs[i], o.Kind, o.Reason, o.Detail)
				}
			}
			rs = rs[n:]
		}
	}
	deliver(first[:closeAt])
	if closeIt {
		f.closeForced(customer, closed.Name, f.now)
		frozen, err = ledger.ReadGauge(ctx, f.pool, customer, "seats", closed, f.now)
		if err != nil {
			rt.Fatal(err)
		}
	}
	deliver(first[closeAt:])
	deliver(held)

	check := func() {
		p, err := sch.PeriodAt(base.Add(-24 * time.Hour))
		if err != nil {
			rt.Fatal(err)
		}
		for !p.Start.After(f.now) {
			asOf := p.End
			if f.now.Before(asOf) {
				asOf = f.now
			}
			got, err := ledger.ReadGauge(ctx, f.pool, customer, "seats", p, f.now)
			if err != nil {
				rt.Fatal(err)
			}
			mx, latest, us := bruteGauge(truth, p.Start, asOf)
			// Reconciliation's recomputation from the stored readings agrees.
			stored, err := ledger.GaugeReadings(ctx, f.pool, customer, "seats")
			if err != nil {
				rt.Fatal(err)
			}
			if rc := ledger.RecomputeGauge(stored, p.Start, asOf); !rc.Max.Equal(mx) || !rc.Latest.Equal(latest) || !rc.UnitSeconds.Equal(us) {
				rt.Fatalf("period %s: reconciliation recomputes max %s latest %s unit_seconds %s; brute force %s %s %s",
					p.Name, rc.Max, rc.Latest, rc.UnitSeconds, mx, latest, us)
			}
			// And from only the readings the period needs, as it reads them.
			needed, err := ledger.GaugeReadingsFor(ctx, f.pool, customer, "seats", p.Start, asOf)
			if err != nil {
				rt.Fatal(err)
			}
			if rc := ledger.RecomputeGauge(needed, p.Start, asOf); !rc.Max.Equal(mx) || !rc.Latest.Equal(latest) || !rc.UnitSeconds.Equal(us) {
				rt.Fatalf("period %s: from the %d of %d readings it needs, reconciliation recomputes max %s latest %s unit_seconds %s; brute force %s %s %s",
					p.Name, len(needed), len(stored), rc.Max, rc.Latest, rc.UnitSeconds, mx, latest, us)
			}
			// And as reconciliation computes it: the changes of level in
			// time order from Postgres, nothing held.
			rc, err := ledger.RecomputeGaugeFor(ctx, f.pool, customer, "seats", p.Start, asOf)
			if err != nil {
				rt.Fatal(err)
			}
			if !rc.Max.Equal(mx) || !rc.Latest.Equal(latest) || !rc.UnitSeconds.Equal(us) {
				rt.Fatalf("period %s: from the changes of level, reconciliation recomputes max %s latest %s unit_seconds %s; brute force %s %s %s",
					p.Name, rc.Max, rc.Latest, rc.UnitSeconds, mx, latest, us)
			}
			if !got.Max.Equal(mx) || !got.Latest.Equal(latest) || !got.UnitSeconds.Equal(us) {
				rt.Fatalf("period %s (%s, %s): ledger max %s latest %s unit_seconds %s; brute force max %s latest %s unit_seconds %s",
					p.Name, zone, cadence, got.Max, got.Latest, got.UnitSeconds, mx, latest, us)
			}
			// The level over time: contiguous spans from the period's
			// start to asOf, each with the brute-force highest and last
			// level of its own interval.
			pos := p.Start
			for _, l := range got.Levels {
				if !l.Start.Equal(pos) || !l.End.After(l.Start) {
					rt.Fatalf("period %s: level span [%s, %s) after %s", p.Name, l.Start, l.End, pos)
				}
				if bm, bl, _ := bruteGauge(truth, l.Start, l.End); !l.Max.Equal(bm) || !l.Latest.Equal(bl) {
					rt.Fatalf("period %s: span [%s, %s) max %s latest %s; brute force %s %s", p.Name, l.Start, l.End, l.Max, l.Latest, bm, bl)
				}
				pos = l.End
			}
			if len(got.Levels) == 0 && (!mx.IsZero() || !latest.IsZero()) {
				rt.Fatalf("period %s: no level spans, but max %s latest %s", p.Name, mx, latest)
			}
			if len(got.Levels) > 0 && !pos.Equal(asOf) {
				rt.Fatalf("period %s: level spans end at %s, not at %s", p.Name, pos, asOf)
			}
			if closeIt && p.Start.Equal(closed.Start) {
				var moved decimal.Decimal
				if err := f.pool.QueryRow(ctx, `SELECT coalesce(sum(unit_seconds), 0) FROM gauge_adjustments WHERE customer = $1 AND prior_period = $2`,
					customer, closed.Start).Scan(&moved); err != nil {
					rt.Fatal(err)
				}
				if !frozen.UnitSeconds.Add(moved).Equal(us) {
					rt.Fatalf("closed period %s: frozen unit_seconds %s + adjustments %s != %s", p.Name, frozen.UnitSeconds, moved, us)
				}
			}
			if p, err = sch.Next(p); err != nil {
				rt.Fatal(err)
			}
		}
	}
	check()
	checkAhead(rt, f, customer, sch, truth)
	deliver(order) // the whole schedule again: duplicates change nothing
	check()
}

// checkAhead reads a gauge as of an instant with readings stamped after
// it (a producer whose clock runs ahead of the reader's leaves such
// readings, up to ledger.MaxClockSkew ahead), so the bucket holding that
// instant is cut there; the answer kept and asked again later (as the
// usage cache does) is cut there too. Every aggregate and level span
// equals the brute force over the readings through the instant asked.
func checkAhead(rt *rapid.T, f *fixture, customer string, sch periods.Schedule, truth []gaugeTruth) {
	ctx := context.Background()
	ref := truth[rapid.IntRange(0, len(truth)-1).Draw(rt, "aheadOf")].at
	at := ref.Add(time.Duration(rapid.SampledFrom([]int64{-3600e6, -90e6, -1, 0, 1, 90e6}).Draw(rt, "aheadOffset")) * time.Microsecond)
	p, err := sch.PeriodAt(at)
	if err != nil {
		rt.Fatal(err)
	}
	k, err := ledger.ReadKinds(ctx, f.pool, customer, "seats", p, at)
	if err != nil {
		rt.Fatal(err)
	}
	for _, later := range []time.Duration{0, time.Microsecond, time.Duration(rapid.Int64Range(1, 6*3600).Draw(rt, "askedLater")) * time.Second} {
		now := at.Add(later)
		asOf := p.End
		if now.Before(asOf) {
			asOf = now
		}
		mx, latest, us := bruteGauge(truth, p.Start, asOf)
		got := ledger.GaugeUsage{Levels: []ledger.GaugeLevel{}}
		for _, g := range k.Gauges(now) {
			if g.Meter == "seats" {
				got = g
			}
		}
		if !got.Max.Equal(mx) || !got.Latest.Equal(latest) || !got.UnitSeconds.Equal(us) {
			rt.Fatalf("read as of %s, asked at %s (period %s): max %s latest %s unit_seconds %s; brute force %s %s %s",
				at, now, p.Name, got.Max, got.Latest, got.UnitSeconds, mx, latest, us)
		}
		pos := p.Start
		for _, l := range got.Levels {
			if !l.Start.Equal(pos) || !l.End.After(l.Start) {
				rt.Fatalf("read as of %s, asked at %s: level span [%s, %s) after %s", at, now, l.Start, l.End, pos)
			}
			if bm, bl, _ := bruteGauge(truth, l.Start, l.End); !l.Max.Equal(bm) || !l.Latest.Equal(bl) {
				rt.Fatalf("read as of %s, asked at %s: span [%s, %s) max %s latest %s; brute force %s %s", at, now, l.Start, l.End, l.Max, l.Latest, bm, bl)
			}
			pos = l.End
		}
		if len(got.Levels) > 0 && !pos.Equal(asOf) {
			rt.Fatalf("read as of %s, asked at %s: level spans end at %s, not at %s", at, now, pos, asOf)
		}
	}
}
