package admit_test

import (
	"context"
	"testing"

	"github.com/tally-ledger/tally/admit"
)

// A refusal is remembered for the cost it refused, not for every cost:
// an Admit larger than what the budget has left is refused, and a
// smaller one right after, which the budget can still hold, is admitted
// (it was refused from memory for up to 8 ticks, a false denial).
func TestARefusalIsRememberedForItsCostOnly(t *testing.T) {
	ts := startTally(t)
	ts.exactRule("acme", "tokens", "100")
	ctx := context.Background()
	c := newClient(t, ts, "gw1", t.TempDir(), admit.Config{})
	defer c.Close(ctx)
	if d, err := c.Admit(ctx, "acme", "tokens", 60); err != nil || !d.Admitted {
		t.Fatalf("60 of 100: %+v %v", d, err)
	}
	if d, err := c.Admit(ctx, "acme", "tokens", 50); err != nil || d.Admitted || d.How != admit.Exhausted {
		t.Fatalf("50 more: %+v %v", d, err)
	}
	if d, err := c.Admit(ctx, "acme", "tokens", 50); err != nil || d.Admitted {
		t.Fatalf("50 more again: %+v %v", d, err)
	}
	for _, cost := range []int64{10, 30} {
		if d, err := c.Admit(ctx, "acme", "tokens", cost); err != nil || !d.Admitted {
			t.Fatalf("%d, which the 40 left hold, after a refusal of 50: %+v %v", cost, d, err)
		}
	}
	if d, err := c.Admit(ctx, "acme", "tokens", 1); err != nil || d.Admitted {
		t.Fatalf("1 more than the limit: %+v %v", d, err)
	}
}
