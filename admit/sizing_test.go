package admit_test

import (
	"context"
	"testing"
	"time"

	"github.com/shopspring/decimal"

	"github.com/tally-ledger/tally/admit"
)

// admitN admits n units one at a time and fails the test on a refusal.
func admitN(t *testing.T, c *admit.Client, n int) {
	t.Helper()
	for i := range n {
		d, err := c.Admit(context.Background(), "acme", "tokens", 1)
		if err != nil || !d.Admitted {
			t.Fatalf("admit %d: %+v %v", i, d, err)
		}
	}
}

// A top-up asks for a whole grant, not for what is missing from the
// target: with grants of 50, a gateway that spent 30 of its first grant
// holds two grants of 50.
func TestTopUpAsksForAWholeGrant(t *testing.T) {
	ts := startTally(t)
	ts.exactRule("acme", "tokens", "1000")
	ctx := context.Background()
	c := newClient(t, ts, "gw1", t.TempDir(), admit.Config{MinGrant: 50, Lookahead: time.Nanosecond})
	defer c.Close(ctx)
	admitN(t, c, 30)
	eventually(t, "a second grant of 50", func() bool {
		return ts.budget("acme", "tokens").Live.Equal(decimal.NewFromInt(100))
	})
	if err := c.Close(ctx); err != nil {
		t.Fatal(err)
	}
	if b := ts.budget("acme", "tokens"); !b.Consumed.Equal(decimal.NewFromInt(30)) || !b.Live.IsZero() {
		t.Fatalf("admitted 30, budget %+v", b)
	}
}

// A grant smaller than asked says the budget is nearly all granted: the
// gateway then holds only a few ticks of its demand and gives the rest
// back while it keeps admitting, so another gateway can get it.
func TestPartialGrantMakesGatewayHoldLittle(t *testing.T) {
	ts := startTally(t)
	ts.exactRule("acme", "tokens", "500")
	ctx := context.Background()
	c := newClient(t, ts, "gw1", t.TempDir(), admit.Config{MinGrant: 1000})
	defer c.Close(ctx)
	admitN(t, c, 1) // asks 1,000, gets the 500 there are
	eventually(t, "most of the budget given back while admitting", func() bool {
		admitN(t, c, 1)
		return ts.budget("acme", "tokens").Live.LessThanOrEqual(decimal.NewFromInt(100))
	})
	other := newClient(t, ts, "gw2", t.TempDir(), admit.Config{MinGrant: 1})
	defer other.Close(ctx)
	d, err := other.Admit(ctx, "acme", "tokens", 1)
	if err != nil || !d.Admitted {
		t.Fatalf("the other gateway was refused: %+v %v", d, err)
	}
}
