package console

import (
	"fmt"
	"time"

	"github.com/shopspring/decimal"

	"github.com/tally-ledger/tally/api"
	"github.com/tally-ledger/tally/periods"
)

// Chart geometry, in SVG user units (the SVG scales to its box).
const (
	chartW, chartH         = 720.0, 240.0
	chartLeft, chartRight  = 88.0, 12.0
	chartTop, chartBottom  = 16.0, 28.0
	chartPlotW, chartPlotH = chartW - chartLeft - chartRight, chartH - chartTop - chartBottom
)

// chart is one meter's usage this period, day by day, as a running total
// against its quota: bars are the usage through the end of each day, the
// lines the quota's limit and warning level. Its table says the same in
// exact numbers.
type chart struct {
	Meter        string
	W, H         float64
	Left, Bottom float64 // the plot's left edge and baseline
	Right        float64
	Bars         []bar
	Limit, Warn  *rule
	Ticks        []tick
	Labels       []label // dates under the bars
	Days         []dayRow
	Total        decimal.Decimal
	Summary      string // for screen readers
}

type bar struct {
	X, Y, W, H float64
	Title      string
}

type rule struct {
	Y     float64
	Label string
}

type label struct {
	X     float64
	Label string
}

type tick struct {
	Y     float64
	Label string
}

type dayRow struct {
	Date       string // local date
	Start      string // RFC 3339 UTC, as the REST answer's series start
	Quantity   decimal.Decimal
	Cumulative decimal.Decimal
	Used       bool // usage booked that day
	Future     bool
}

// newChart builds the chart of m (may be empty: a quota's meter without
// usage yet) over the period's local days [start, end) in loc, with the
// quota's limit and warning level when there is a quota (limit.Valid).
func newChart(meter string, m api.MeterUsage, start, end time.Time, loc *time.Location, limit decimal.NullDecimal,
	warnAt decimal.Decimal, now time.Time) chart {
	c := chart{Meter: meter, W: chartW, H: chartH, Left: chartLeft, Bottom: chartTop + chartPlotH, Right: chartW - chartRight, Total: m.Total}
	byStart := map[int64]decimal.Decimal{}
	for _, d := range m.Days {
		byStart[d.Start.Unix()] = d.Quantity
	}
	days := localDays(start, end, loc)
	// top is the highest running total: a credit can bring the total
	// below where it stood earlier in the period, or below zero.
	var run, top decimal.Decimal
	for _, d := range days {
		q, used := byStart[d.Unix()]
		run = run.Add(q)
		top = decimal.Max(top, run)
		c.Days = append(c.Days, dayRow{Date: d.In(loc).Format("Mon 2 Jan"), Start: d.UTC().Format(time.RFC3339Nano),
			Quantity: q, Cumulative: run, Used: used, Future: d.After(now)})
	}
	if limit.Valid && limit.Decimal.GreaterThan(top) {
		top = limit.Decimal
	}
	top = top.Mul(decimal.RequireFromString("1.1"))
	// Floats only from here: pixel positions, not amounts.
	scale := func(v decimal.Decimal) float64 {
		if !top.IsPositive() {
			return 0
		}
		return v.Div(top).InexactFloat64() * chartPlotH
	}
	base := chartTop + chartPlotH
	n := float64(max(len(days), 1))
	slot := chartPlotW / n
	for i, d := range c.Days {
		if i%7 == 0 || i == len(c.Days)-1 && i%7 > 3 {
			c.Labels = append(c.Labels, label{X: chartLeft + float64(i)*slot + slot/2, Label: days[i].In(loc).Format("2 Jan")})
		}
		if d.Future {
			continue
		}
		h := scale(decimal.Max(d.Cumulative, decimal.Zero)) // below zero (credits): no bar; its title says so
		c.Bars = append(c.Bars, bar{X: chartLeft + float64(i)*slot + slot*0.15, Y: base - h, W: slot * 0.7, H: h,
			Title: fmt.Sprintf("%s: %s this day, %s so far", d.Date, num(d.Quantity), num(d.Cumulative))})
	}
	if limit.Valid {
		c.Limit = &rule{Y: base - scale(limit.Decimal), Label: "limit " + num(limit.Decimal)}
		w := limit.Decimal.Mul(warnAt)
		c.Warn = &rule{Y: base - scale(w), Label: "warning " + num(w)}
	}
	for _, f := range []string{"0", "0.5", "1"} {
		v := tickValue(top.Div(decimal.RequireFromString("1.1")), decimal.RequireFromString(f))
		c.Ticks = append(c.Ticks, tick{Y: base - scale(v), Label: num(v)})
	}
	c.Summary = fmt.Sprintf("%s: %s used this period", meter, num(run))
	if limit.Valid {
		c.Summary += " of a limit of " + num(limit.Decimal)
	}
	return c
}

// localDays are the starts of the local calendar days of [start, end) in
// loc: start, then the start of every later local date before end (its
// midnight, or the instant the clocks jump past a midnight they skip), as
// the REST answer's daily series has them.
func localDays(start, end time.Time, loc *time.Location) []time.Time {
	out := []time.Time{start}
	y, m, d := start.In(loc).Date()
	for i := 1; ; i++ {
		t := periods.DayStart(loc, y, m, d+i)
		if !t.Before(end) {
			return out
		}
		if t.After(out[len(out)-1]) {
			out = append(out, t)
		}
	}
}
