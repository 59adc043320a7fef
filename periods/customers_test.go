package periods_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/tally-ledger/tally/ledger"
	"github.com/tally-ledger/tally/periods"
)

// The notice a calendar change needs is the ledger's clock skew: usage up
// to that far ahead may already be booked under the current calendar.
func TestChangeNoticeIsLedgerClockSkew(t *testing.T) {
	if periods.ChangeNotice != ledger.MaxClockSkew {
		t.Fatalf("ChangeNotice %s, ledger.MaxClockSkew %s", periods.ChangeNotice, ledger.MaxClockSkew)
	}
}

func TestSetCalendar(t *testing.T) {
	ctx := context.Background()
	nov := time.Date(2026, 11, 20, 12, 0, 0, 0, time.UTC)
	w := newWorld(t, nov)
	weekly := periods.Calendar{Cadence: periods.Weekly, AnchorDay: 1, AnchorTime: "00:00", Zone: "UTC"}
	daily := periods.Calendar{Cadence: periods.Daily, AnchorTime: "06:00", Zone: "UTC"}

	if _, err := w.store.Customer(ctx, w.pool, "initech"); !errors.Is(err, periods.ErrUnknownCustomer) {
		t.Fatalf("unknown customer: %v", err)
	}
	if _, _, err := w.store.SetCalendar(ctx, w.pool, "initech", periods.Calendar{Cadence: "yearly"}); err == nil {
		t.Fatal("an invalid calendar was accepted")
	}
	if _, err := w.store.Customer(ctx, w.pool, "initech"); !errors.Is(err, periods.ErrUnknownCustomer) {
		t.Fatalf("an invalid calendar created the customer: %v", err)
	}

	// An unknown customer gets the calendar from the beginning.
	c, created, err := w.store.SetCalendar(ctx, w.pool, "initech", weekly)
	if err != nil || !created || len(c.Schedule) != 1 || c.Schedule[0].Calendar != weekly || !c.CreatedAt.Equal(nov) {
		t.Fatalf("create: %+v created %v, %v", c, created, err)
	}
	if got, err := w.store.Customer(ctx, w.pool, "initech"); err != nil || len(got.Schedule) != 1 || !got.CreatedAt.Equal(nov) {
		t.Fatalf("stored: %+v, %v", got, err)
	}

	// Usage creates a customer with the default calendar; a change then
	// waits for the next boundary, unless that is less than ChangeNotice away.
	dec := time.Date(2026, 12, 1, 0, 0, 0, 0, time.UTC)
	for _, tc := range []struct {
		customer  string
		now       time.Time
		effective time.Time
	}{
		{"acme", nov, dec},
		{"globex", dec.Add(-periods.ChangeNotice - time.Second), dec},
		{"umbrella", dec.Add(-periods.ChangeNotice + time.Second), time.Date(2027, 1, 1, 0, 0, 0, 0, time.UTC)},
	} {
		w.at(nov)
		if o := w.use(tc.customer, "1", nov); o.Kind != ledger.Applied {
			t.Fatalf("usage: %+v", o)
		}
		w.at(tc.now)
		c, created, err := w.store.SetCalendar(ctx, w.pool, tc.customer, daily)
		if err != nil || created {
			t.Fatalf("at %s: created %v, %v", tc.now, created, err)
		}
		if len(c.Schedule) != 2 || c.Schedule[0].Calendar != periods.DefaultCalendar() ||
			!c.Schedule[1].EffectiveFrom.Equal(tc.effective) || c.Schedule[1].Calendar != daily {
			t.Fatalf("at %s: schedule %+v, want daily from %s", tc.now, c.Schedule, tc.effective)
		}
		got, err := w.store.Customer(ctx, w.pool, tc.customer)
		if err != nil || len(got.Schedule) != 2 || !got.Schedule[1].EffectiveFrom.Equal(tc.effective) {
			t.Fatalf("at %s: stored %+v, %v", tc.now, got, err)
		}
	}
	// Setting the calendar in force drops the pending change.
	w.at(nov)
	if c, _, err := w.store.SetCalendar(ctx, w.pool, "acme", periods.DefaultCalendar()); err != nil || len(c.Schedule) != 1 {
		t.Fatalf("cancel: %+v, %v", c.Schedule, err)
	}
}
