package console

import (
	"fmt"
	"strings"
	"time"

	"github.com/shopspring/decimal"

	"github.com/tally-ledger/tally/ledger"
)

// kindChart is the chart of a gauge or a unique meter this period
// (docs/design.md §16): a gauge's level line over the period (each span's
// highest level: a bucket day with readings, or a stretch without), its
// max, average and latest level marked across the plot, its unit-hours in
// the caption; a unique meter's distinct members as one bar per day. Its
// numbers are the REST usage answer's, exactly.
type kindChart struct {
	Meter, Kind  string
	W, H         float64
	Left, Bottom float64
	Right        float64
	Marks        []mark // gauge: max, average, latest
	Line         string // gauge: the level line's SVG polyline points
	Bars         []bar  // unique: distinct members per day
	Ticks        []tick
	Labels       []label
	Caption      string
	Summary      string // for screen readers
}

// mark is one level drawn across the plot.
type mark struct {
	Class, Label string
	Y            float64
	Value        decimal.Decimal
	LabelX       float64 // where the label sits, anchored by Anchor
	Anchor       string
}

func newKindChart(meter, kind string) kindChart {
	return kindChart{Meter: meter, Kind: kind, W: chartW, H: chartH, Left: chartLeft, Bottom: chartTop + chartPlotH,
		Right: chartW - chartRight}
}

// gaugeChart draws g's level line over [start, end) and marks its max,
// average and latest level, on one scale.
func gaugeChart(g ledger.GaugeUsage, start, end time.Time) kindChart {
	c := newKindChart(g.Meter, "gauge")
	top := g.Max
	scale := plotScale(top)
	x := func(t time.Time) float64 { return chartLeft + float64(t.Sub(start))/float64(end.Sub(start))*chartPlotW }
	var pts strings.Builder
	for _, l := range g.Levels {
		y := c.Bottom - scale(l.Max)
		fmt.Fprintf(&pts, "%.1f,%.1f %.1f,%.1f ", x(l.Start), y, x(l.End), y)
	}
	c.Line = strings.TrimSpace(pts.String())
	for _, m := range []mark{{Class: "max", Label: "max", Value: g.Max}, {Class: "average", Label: "average", Value: g.Average},
		{Class: "latest", Label: "latest", Value: g.Latest}} {
		m.Y = c.Bottom - scale(m.Value)
		m.Label += " " + num(m.Value)
		m.LabelX, m.Anchor = c.Right, "end"
		if m.Class == "average" { // left, clear of the latest level's label
			m.LabelX, m.Anchor = c.Left+4, "start"
		}
		c.Marks = append(c.Marks, m)
	}
	c.Ticks = ticks(top, c.Bottom, scale)
	for i, d := range localDays(start, end, start.Location()) {
		if i%7 == 0 {
			c.Labels = append(c.Labels, label{X: x(d) + chartPlotW/float64(end.Sub(start)/time.Hour)*12, Label: d.In(start.Location()).Format("2 Jan")})
		}
	}
	c.Caption = fmt.Sprintf("max %s · latest %s · %s unit-hours", num(g.Max), num(g.Latest), num(g.UnitHours))
	c.Summary = fmt.Sprintf("%s: peak level %s this period, latest %s, %s unit-hours", g.Meter, num(g.Max), num(g.Latest),
		num(g.UnitHours))
	return c
}

// uniqueChart draws u's distinct members per local day of [start, end).
func uniqueChart(u ledger.UniqueUsage, start, end time.Time, loc *time.Location, now time.Time) kindChart {
	c := newKindChart(u.Meter, "unique")
	byStart := map[int64]int64{}
	top := decimal.Zero
	for _, d := range u.Days {
		byStart[d.Start.Unix()] = d.Count
		top = decimal.Max(top, decimal.NewFromInt(d.Count))
	}
	scale := plotScale(top)
	days := localDays(start, end, loc)
	slot := chartPlotW / float64(max(len(days), 1))
	for i, d := range days {
		if i%7 == 0 || i == len(days)-1 && i%7 > 3 {
			c.Labels = append(c.Labels, label{X: chartLeft + float64(i)*slot + slot/2, Label: d.In(loc).Format("2 Jan")})
		}
		if d.After(now) {
			continue
		}
		n := byStart[d.Unix()]
		h := scale(decimal.NewFromInt(n))
		c.Bars = append(c.Bars, bar{X: chartLeft + float64(i)*slot + slot*0.15, Y: c.Bottom - h, W: slot * 0.7, H: h,
			Title: fmt.Sprintf("%s: %d distinct", d.In(loc).Format("Mon 2 Jan"), n)})
	}
	c.Ticks = ticks(top, c.Bottom, scale)
	c.Caption = fmt.Sprintf("%d distinct this period", u.Count)
	c.Summary = fmt.Sprintf("%s: %d distinct members this period", u.Meter, u.Count)
	return c
}

// plotScale maps a value to its height in the plot, top sitting 10% below
// the plot's top edge. Floats only here: pixel positions, not amounts.
func plotScale(top decimal.Decimal) func(decimal.Decimal) float64 {
	top = top.Mul(decimal.RequireFromString("1.1"))
	return func(v decimal.Decimal) float64 {
		if !top.IsPositive() {
			return 0
		}
		return v.Div(top).InexactFloat64() * chartPlotH
	}
}

// ticks are the axis labels at 0, half and all of top.
func ticks(top decimal.Decimal, base float64, scale func(decimal.Decimal) float64) []tick {
	var out []tick
	for _, f := range []string{"0", "0.5", "1"} {
		v := tickValue(top, decimal.RequireFromString(f))
		out = append(out, tick{Y: base - scale(v), Label: num(v)})
	}
	return out
}

// tickValue is f of top rounded to two significant digits of top (whole
// numbers from 10 on), so the labels of a top below 10 are told apart and
// a rounded top stays inside the plot's 10% headroom.
func tickValue(top, f decimal.Decimal) decimal.Decimal {
	places := int32(0)
	if top.IsPositive() {
		mag := int32(top.NumDigits()) + top.Exponent() - 1 // floor(log10(top))
		places = max(0, 1-mag)
	}
	return top.Mul(f).Round(places)
}

// kindCharts are the charts of u's gauges and unique meters; a quota's
// limit (of a gauge's period max, of a unique meter's distinct members)
// is named in its meter's caption.
func kindCharts(gauges []ledger.GaugeUsage, uniques []ledger.UniqueUsage, limits map[string]decimal.NullDecimal,
	start, end time.Time, now time.Time) []kindChart {
	var out []kindChart
	for _, g := range gauges {
		out = append(out, withLimit(gaugeChart(g, start, end), limits[g.Meter]))
	}
	for _, u := range uniques {
		out = append(out, withLimit(uniqueChart(u, start, end, start.Location(), now), limits[u.Meter]))
	}
	return out
}

func withLimit(c kindChart, limit decimal.NullDecimal) kindChart {
	if limit.Valid {
		c.Caption += " · limit " + num(limit.Decimal)
		c.Summary += ", limit " + num(limit.Decimal)
	}
	return c
}
