package console_test

import (
	"math"
	"strings"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"

	"github.com/tally-ledger/tally/amount"
	"github.com/tally-ledger/tally/ledger"
)

// The customer page shows a gauge's max, latest level and unit-hours, and
// a unique meter's distinct members, as the REST usage answer has them.
func TestCustomerPageShowsGaugesAndUniques(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	start := f.kinds()
	c := f.client()
	f.signInHTTP(c, f.customerToken("acme"))
	res := f.get(c, "/console/customers/acme")
	if res.status != 200 {
		t.Fatalf("customer page: %d %s", res.status, res.body)
	}
	for _, want := range []string{
		`<tr data-meter="seats"><td>seats</td><td class="n">1,200</td><td class="n">3</td>`,
		`<tr data-meter="mau"><td>mau</td><td class="n">2</td>`,
		// The gauge's chart marks its max; the unique meter's draws a bar for
		// the day with both members.
		`<figure class="chart chart-gauge" data-meter="seats" data-kind="gauge">`,
		`<line class="level level-max" data-level="1200"`,
		`max 1,200 · latest 3`,
		`<figure class="chart chart-unique" data-meter="mau" data-kind="unique">`,
		`2 distinct this period`,
		start.Format("Mon 2 Jan") + `: 2 distinct</title>`,
	} {
		if !strings.Contains(res.body, want) {
			t.Fatalf("the page lacks %s:\n%s", want, res.body)
		}
	}
}

// kinds gives acme (in UTC) a seats gauge at 1,200 for the first hour of
// the period, then 3, and two members of a mau unique meter on its first
// day; it answers the period's start.
func (f *fixture) kinds() time.Time {
	f.t.Helper()
	f.calendar("acme", "UTC")
	ctx := f.ctx()
	start := time.Date(f.now.Year(), f.now.Month(), 1, 0, 0, 0, 0, time.UTC)
	if err := pgx.BeginFunc(ctx, f.pool, func(tx pgx.Tx) error {
		for m, k := range map[string]ledger.MeterKind{"seats": ledger.Gauge, "mau": ledger.Unique} {
			if _, err := ledger.DeclareMeter(ctx, tx, ledger.Meter{Meter: m, Kind: k}, f.now); err != nil {
				return err
			}
		}
		rec := func(meter string, seq int64) ledger.Record {
			return ledger.Record{OperationID: uuid.New(), Stream: ledger.StreamKey{Producer: "p", Epoch: 1, Customer: "acme", Meter: meter},
				Seq: seq, OccurredAt: start}
		}
		g1, g2 := rec("seats", 1), rec("seats", 2)
		g1.Shape, g1.Level, g2.Shape, g2.Level = ledger.Gauge, amount.MustParse("1200"), ledger.Gauge, amount.MustParse("3")
		g2.OccurredAt = start.Add(time.Hour)
		u1, u2 := rec("mau", 1), rec("mau", 2)
		u1.Shape, u1.Member, u2.Shape, u2.Member = ledger.Unique, "u1", ledger.Unique, "u2"
		_, err := f.ledger.Apply(ctx, tx, []ledger.Record{g1, g2, u1, u2})
		return err
	}); err != nil {
		f.t.Fatal(err)
	}
	return start
}

// In a browser the gauge's chart marks its max above its latest level,
// with the numbers of the REST usage answer, and the unique meter's chart
// draws one bar per day so far, the first day's as high as its count.
func TestKindChartsInTheBrowser(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	start := f.kinds()
	ctx := tab(t)
	f.signIn(t, ctx, adminToken)
	f.open(t, ctx, "/console/customers/acme")

	var rest struct {
		Items []struct {
			Meter string `json:"meter"`
			Total string `json:"total"`
			Gauge *struct {
				Max, Latest string
			} `json:"gauge"`
			Series []struct {
				Quantity string `json:"quantity"`
			} `json:"series"`
		} `json:"items"`
	}
	f.rest("/v1/customers/acme/usage?period=current", adminToken, &rest)
	for _, it := range rest.Items {
		sel := `figure.chart[data-meter="` + it.Meter + `"]`
		switch it.Meter {
		case "seats":
			if it.Gauge == nil || it.Gauge.Max != "1200" {
				t.Fatalf("REST seats: %+v", it)
			}
			if l := eval[string](t, ctx, `document.querySelector('`+sel+` text.level-max').textContent`); l != "max 1,200" {
				t.Fatalf("the seats chart's max is marked %q", l)
			}
			maxY := eval[float64](t, ctx, `document.querySelector('`+sel+` line.level-max').getBoundingClientRect().top`)
			latestY := eval[float64](t, ctx, `document.querySelector('`+sel+` line.level-latest').getBoundingClientRect().top`)
			if maxY >= latestY {
				t.Fatalf("the max line (y %.1f) is not above the latest level's (y %.1f)", maxY, latestY)
			}
			// The level line peaks at the max mark (SVG units).
			line := eval[[]float64](t, ctx, `[...document.querySelector('`+sel+` polyline.levelline').points].flatMap(p => [p.x, p.y])`)
			markY := eval[float64](t, ctx, `document.querySelector('`+sel+` line.level-max').y1.baseVal.value`)
			if len(line) < 4 {
				t.Fatalf("the seats chart has no level line: %v", line)
			}
			top := line[1]
			for i := 1; i < len(line); i += 2 {
				top = min(top, line[i])
			}
			if math.Abs(top-markY) > 0.5 {
				t.Fatalf("the level line peaks at y %.1f, the max mark is at y %.1f", top, markY)
			}
		case "mau":
			bars := eval[[]float64](t, ctx, `[...document.querySelectorAll('`+sel+` svg rect.bar')].map(r => r.getBoundingClientRect().height)`)
			days := int(f.now.Sub(start)/(24*time.Hour)) + 1
			if len(bars) != days || len(it.Series) != 1 || it.Series[0].Quantity != "2" || bars[0] <= 0 {
				t.Fatalf("mau: %d bars %v for %d days, REST series %+v", len(bars), bars, days, it.Series)
			}
			for _, h := range bars[1:] {
				if h != 0 {
					t.Fatalf("mau: a day without members has a bar %v", bars)
				}
			}
		default:
			t.Fatalf("REST usage has %s", it.Meter)
		}
	}
	screenshot(t, ctx, "customer-kinds")
}

// A chart's axis is labelled at 0, half and all of its highest value,
// to as many places as tell them apart: a gauge whose level is below one
// (terabytes stored), or a counter's fractional usage, is not labelled
// 0, 0, 0 (nor with a label placed above the plot).
func TestChartAxesOfFractionalValues(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	f.calendar("tiny", "UTC")
	ctx := f.ctx()
	start := time.Date(f.now.Year(), f.now.Month(), 1, 0, 0, 0, 0, time.UTC)
	if err := pgx.BeginFunc(ctx, f.pool, func(tx pgx.Tx) error {
		if _, err := ledger.DeclareMeter(ctx, tx, ledger.Meter{Meter: "disk", Kind: ledger.Gauge}, f.now); err != nil {
			return err
		}
		_, err := f.ledger.Apply(ctx, tx, []ledger.Record{{OperationID: uuid.New(),
			Stream: ledger.StreamKey{Producer: "p", Epoch: 1, Customer: "tiny", Meter: "disk"},
			Seq:    1, OccurredAt: start, Shape: ledger.Gauge, Level: amount.MustParse("0.4")}})
		return err
	}); err != nil {
		t.Fatal(err)
	}
	f.usage("tiny", "gb", start.Add(time.Hour), "0.4")
	c := f.client()
	f.signInHTTP(c, f.customerToken("tiny"))
	res := f.get(c, "/console/customers/tiny")
	if res.status != 200 {
		t.Fatalf("customer page: %d %s", res.status, res.body)
	}
	for _, fig := range []string{`<figure class="chart chart-gauge" data-meter="disk"`, `<figure class="chart" data-meter="gb">`} {
		i := strings.Index(res.body, fig)
		if i < 0 {
			t.Fatalf("the page lacks %s:\n%s", fig, res.body)
		}
		chart := res.body[i:]
		chart = chart[:strings.Index(chart, "</figure>")]
		var labels []string
		for _, part := range strings.Split(chart, `dominant-baseline="middle">`)[1:] {
			labels = append(labels, part[:strings.Index(part, "<")])
		}
		if got := strings.Join(labels, " "); got != "0 0.2 0.4" {
			t.Errorf("%s: axis labels %q, want \"0 0.2 0.4\"", fig, got)
		}
	}
}

// A quota on a gauge or a unique meter limits its period max or its
// distinct members: the customer page draws it as its kind, never as a
// counter's running total beside (or instead of, before any data) the
// kind's own chart.
func TestAQuotaOnAGaugeOrUniqueMeterIsNotDrawnAsACounter(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	f.kinds()
	if err := pgx.BeginFunc(f.ctx(), f.pool, func(tx pgx.Tx) error {
		_, err := ledger.DeclareMeter(f.ctx(), tx, ledger.Meter{Meter: "dau", Kind: ledger.Unique}, f.now)
		return err
	}); err != nil {
		t.Fatal(err)
	}
	f.quota("acme", "seats", "2000")
	f.quota("acme", "dau", "50")
	c := f.client()
	f.signInHTTP(c, f.customerToken("acme"))
	res := f.get(c, "/console/customers/acme")
	if res.status != 200 {
		t.Fatalf("customer page: %d %s", res.status, res.body)
	}
	for _, m := range []string{"seats", "dau"} {
		if bad := `<figure class="chart" data-meter="` + m + `">`; strings.Contains(res.body, bad) {
			t.Errorf("%s, a %s meter with a quota, is drawn as a counter:\n%s", m, map[string]string{"seats": "gauge", "dau": "unique"}[m], res.body)
		}
	}
	if strings.Contains(res.body, "No usage and no quota") {
		t.Errorf("the page says it has no usage and no quota:\n%s", res.body)
	}
	for _, want := range []string{
		`<figure class="chart chart-gauge" data-meter="seats" data-kind="gauge">`,
		`unit-hours · limit 2,000</span>`,
	} {
		if !strings.Contains(res.body, want) {
			t.Errorf("the page lacks %s:\n%s", want, res.body)
		}
	}
}
