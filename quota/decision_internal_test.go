package quota

import (
	"testing"
	"time"

	"github.com/shopspring/decimal"

	"github.com/tally-ledger/tally/periods"
)

func TestProjectRoundsUpExactly(t *testing.T) {
	t.Parallel()
	d := decimal.RequireFromString
	for _, c := range []struct {
		name string
		used string
		r    *rate
		lag  int64
		want string
	}{
		{"no rate", "10", nil, 5000, "10"},
		{"no lag", "10", &rate{d("100"), 1000}, 0, "10"},
		{"exact", "10", &rate{d("100"), 1000}, 2500, "260"},
		{"thirds round up at the 9th digit", "0", &rate{d("1"), 3000}, 1000, "0.333333334"},
		{"falling usage projects nothing", "10", &rate{d("-5"), 1000}, 1000, "10"},
		{"fractional quantities", "1.5", &rate{d("0.000000001"), 7}, 1, "1.500000001"},
	} {
		if got := project(d(c.used), c.r, c.lag); !got.Equal(d(c.want)) {
			t.Errorf("%s: project = %s, want %s", c.name, got, c.want)
		}
	}
}

func TestDecideStates(t *testing.T) {
	t.Parallel()
	now := time.Date(2026, 12, 2, 12, 0, 0, 0, time.UTC)
	p, _ := periods.DefaultCalendar().PeriodAt(now)
	r := Rule{Customer: "acme", Meter: "m", Version: 3, Limit: decimal.NewNullDecimal(decimal.NewFromInt(100)), WarnAt: DefaultWarnAt,
		Mode: Enforce, OnStale: Deny, StaleAfter: DurationText(time.Minute)}
	asOf := now.Add(-90 * time.Second)
	for _, c := range []struct {
		used  int64
		state State
	}{{0, OK}, {79, OK}, {80, Warning}, {99, Warning}, {100, Exceeded}, {250, Exceeded}} {
		dd := decide(r, p, decimal.NewFromInt(c.used), &asOf, nil, now)
		if dd.State != c.state {
			t.Errorf("used %d: %s, want %s", c.used, dd.State, c.state)
		}
		if dd.Remaining.IsNegative() || dd.Period != "2026-12-01" || *dd.LagSeconds != 90000 || !dd.Stale(now) {
			t.Errorf("used %d: %+v", c.used, dd)
		}
	}
	// as_of ahead of the decider's clock: lag is zero, never negative.
	ahead := now.Add(time.Second)
	if dd := decide(r, p, decimal.Zero, &ahead, nil, now); *dd.LagSeconds != 0 {
		t.Errorf("lag %v for as_of ahead of now", dd.LagSeconds)
	}
	// Unknown as_of: no lag, stale.
	if dd := decide(r, p, decimal.Zero, nil, nil, now); dd.LagSeconds != nil || !dd.Stale(now) {
		t.Errorf("unknown as_of: %+v", dd)
	}
}
