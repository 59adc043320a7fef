package ledgertest_test

import (
	"context"
	"testing"
	"time"

	"github.com/shopspring/decimal"

	"github.com/tally-ledger/tally/internal/ledgertest"
	"github.com/tally-ledger/tally/internal/pgtest"
	"github.com/tally-ledger/tally/ledger"
)

// Each Use is the next record of its customer/meter's own stream, its total
// the running sum; Position sets every partition of the topic and moves it
// again on a second call.
func TestUseAndPosition(t *testing.T) {
	pool := pgtest.New(t)
	l, err := ledger.New(ledger.Config{})
	if err != nil {
		t.Fatal(err)
	}
	s := ledgertest.New(pool, l)
	at := time.Date(2026, 11, 20, 11, 0, 0, 0, time.UTC)
	s.Use(t, "acme", "api_calls", at, decimal.RequireFromString("2.5"))
	s.Use(t, "acme", "api_calls", at, decimal.NewFromInt(3))
	s.Use(t, "globex", "api_calls", at, decimal.NewFromInt(7))
	ctx := context.Background()
	var seq int64
	var total decimal.Decimal
	if err := pool.QueryRow(ctx, `SELECT last_seq, last_total FROM streams WHERE customer = 'acme' AND meter = 'api_calls'`).Scan(&seq, &total); err != nil {
		t.Fatal(err)
	}
	if seq != 2 || !total.Equal(decimal.RequireFromString("5.5")) {
		t.Fatalf("acme's stream: seq %d total %s, want 2 and 5.5", seq, total)
	}

	ledgertest.Position(t, pool, "meters", 3, at)
	ledgertest.Position(t, pool, "meters", 3, at.Add(time.Minute))
	var n int
	var oldest time.Time
	if err := pool.QueryRow(ctx, `SELECT count(*), min(applied_through) FROM ingest_partitions WHERE topic = 'meters'`).Scan(&n, &oldest); err != nil {
		t.Fatal(err)
	}
	if n != 3 || !oldest.Equal(at.Add(time.Minute)) {
		t.Fatalf("positions: %d partitions through %s, want 3 through %s", n, oldest, at.Add(time.Minute))
	}
}

// Whatever the instant, the period of SteadyCalendar(now) that holds now
// began twelve hours or more before it and ends more than eleven after:
// at a month's and a day's last seconds and first, and every seven minutes
// of two days.
func TestSteadyCalendarKeepsNowInOnePeriod(t *testing.T) {
	nows := []time.Time{
		time.Date(2026, 12, 31, 23, 59, 58, 0, time.UTC),
		time.Date(2027, 1, 1, 0, 0, 0, 0, time.UTC),
		time.Date(2026, 11, 30, 23, 59, 59, 999999999, time.UTC),
		time.Date(2026, 12, 1, 0, 0, 0, 1, time.UTC),
		time.Date(2026, 12, 7, 11, 59, 59, 0, time.UTC),
		time.Date(2026, 12, 7, 12, 0, 0, 0, time.UTC),
	}
	for at := time.Date(2026, 12, 30, 0, 3, 17, 0, time.UTC); at.Before(time.Date(2027, 1, 1, 0, 0, 0, 0, time.UTC)); at = at.Add(7 * time.Minute) {
		nows = append(nows, at)
	}
	for _, now := range nows {
		cal := ledgertest.SteadyCalendar(now.In(time.FixedZone("UTC+5", 5*3600)))
		if err := cal.Validate(); err != nil {
			t.Fatalf("at %s: %v", now, err)
		}
		p, err := cal.PeriodAt(now)
		if err != nil {
			t.Fatal(err)
		}
		if now.Sub(p.Start) < 12*time.Hour || p.End.Sub(now) <= 11*time.Hour {
			t.Fatalf("at %s: calendar %+v has period %s to %s", now, cal, p.Start, p.End)
		}
	}
}

// PastMonthEnd returns at once far from a UTC month's end, and near one
// waits until the clock is past it.
func TestPastMonthEnd(t *testing.T) {
	calls := 0
	mid := func() time.Time { calls++; return time.Date(2026, 12, 7, 20, 0, 0, 0, time.UTC) }
	ledgertest.PastMonthEnd(t, mid, time.Minute)
	if calls != 1 {
		t.Fatalf("mid-month: read the clock %d times, want once", calls)
	}
	end := time.Date(2027, 1, 1, 0, 0, 0, 0, time.UTC)
	shift := time.Until(end.Add(-300 * time.Millisecond))
	clock := func() time.Time { return time.Now().Add(shift) }
	ledgertest.PastMonthEnd(t, clock, time.Minute)
	if now := clock(); now.Before(end) {
		t.Fatalf("returned at %s, before the month ended", now)
	}
	// A minute and a second before the end, with a minute's margin: no wait.
	calls = 0
	early := func() time.Time { calls++; return end.Add(-61 * time.Second) }
	ledgertest.PastMonthEnd(t, early, time.Minute)
	if calls != 1 {
		t.Fatalf("61 s before the end: read the clock %d times, want once", calls)
	}
}
