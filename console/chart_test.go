package console_test

import (
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/shopspring/decimal"

	"github.com/tally-ledger/tally/ledger"
)

// A credit can take a counter's running total below zero, or below where
// it stood earlier in the period: every bar of the chart still lies
// within the plot (no negative height, none above its top), and the
// axis reaches the highest running total, not the last.
func TestChartOfACreditStaysInThePlot(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	f.calendar("refunded", "UTC")
	ctx := f.ctx()
	start := time.Date(f.now.Year(), f.now.Month(), 1, 0, 0, 0, 0, time.UTC)
	// 40 on the 1st, a credit of 60 on the 2nd (-20 so far), 30 on the
	// 3rd (10 so far).
	f.usage("refunded", "calls", start.Add(time.Hour), "40")
	if err := pgx.BeginFunc(ctx, f.pool, func(tx pgx.Tx) error {
		_, err := f.ledger.Adjust(ctx, tx, ledger.Adjustment{OperationID: uuid.New(), Customer: "refunded", Meter: "calls",
			Quantity: decimal.NewFromInt(-60), OccurredAt: start.Add(25 * time.Hour), Reason: "refund", Actor: "test"})
		return err
	}); err != nil {
		t.Fatal(err)
	}
	f.usage("refunded", "calls", start.Add(49*time.Hour), "30")
	c := f.client()
	f.signInHTTP(c, f.customerToken("refunded"))
	res := f.get(c, "/console/customers/refunded")
	if res.status != 200 {
		t.Fatalf("customer page: %d %s", res.status, res.body)
	}
	i := strings.Index(res.body, `<figure class="chart" data-meter="calls">`)
	if i < 0 {
		t.Fatalf("no chart of calls:\n%s", res.body)
	}
	fig := res.body[i:]
	fig = fig[:strings.Index(fig, "</figure>")]
	bars := regexp.MustCompile(`<rect class="bar" x="[^"]*" y="([^"]*)" width="[^"]*" height="([^"]*)">`).FindAllStringSubmatch(fig, -1)
	if len(bars) < 3 {
		t.Fatalf("%d bars: %s", len(bars), fig)
	}
	var heights []float64
	for _, b := range bars {
		y, _ := strconv.ParseFloat(b[1], 64)
		h, _ := strconv.ParseFloat(b[2], 64)
		if h < 0 || y < 0 {
			t.Errorf("a bar at y %v of height %v: outside the plot\n%s", y, h, fig)
		}
		heights = append(heights, h)
	}
	if !(heights[0] > heights[2] && heights[2] > 0 && heights[1] == 0) {
		t.Errorf("bars of 40, -20 and 10 so far drawn %v high, want the first the highest, the second none\n%s", heights[:3], fig)
	}
}
