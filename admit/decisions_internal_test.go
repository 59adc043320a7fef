package admit

import (
	"testing"
	"time"

	"github.com/tally-ledger/tally/quota"
)

// fromDecision gives the answer quota.Decision.Blocks defines, for every
// mode, state, on_stale and age (the hot path only compares integers).
func TestFromDecisionAgreesWithBlocks(t *testing.T) {
	c := &Client{cfg: Config{OnStale: Deny}}
	now := time.Now()
	for _, mode := range []quota.Mode{quota.Enforce, quota.Shadow} {
		for _, state := range quota.States {
			for _, onStale := range []quota.OnStale{quota.Allow, quota.Deny} {
				for _, age := range []time.Duration{-time.Hour, 0, 30 * time.Second, 2 * time.Minute} {
					d := quota.Decision{Customer: "acme", Meter: "tokens", Mode: mode, State: state, OnStale: onStale,
						StaleAfter: quota.Duration(time.Minute)}
					if age >= 0 {
						at := now.Add(-age)
						d.AsOf = &at
					}
					b := newBudget("acme", "tokens")
					b.kind.Store(kindLagged)
					b.dec.Store(newLagged(d))
					got := c.fromDecision(b)
					// Blocks is evaluated a moment after fromDecision:
					// ages are far from stale_after, so the same instant.
					if got.Admitted == d.Blocks(time.Now()) || got.Stale != d.Stale(time.Now()) || got.How != FromDecision {
						t.Errorf("%s %s on_stale %s age %v: %+v", mode, state, onStale, age, got)
					}
					if got.Shadow != (mode == quota.Shadow && state == quota.Exceeded && !got.Stale) {
						t.Errorf("%s %s age %v: shadow %v", mode, state, age, got.Shadow)
					}
				}
			}
		}
	}
}

// Admit under a lagged rule allocates nothing (the benchmark measures its
// cost; this keeps it allocation-free).
func TestAdmitFromDecisionDoesNotAllocate(t *testing.T) {
	c := &Client{cfg: Config{OnStale: Allow}}
	b := newBudget("acme", "tokens")
	b.kind.Store(kindLagged)
	at := time.Now()
	b.dec.Store(newLagged(quota.Decision{Customer: "acme", Meter: "tokens", Mode: quota.Enforce, State: quota.Exceeded,
		AsOf: &at, StaleAfter: quota.Duration(time.Hour)}))
	c.budgets.store(key{"acme", "tokens"}, b)
	ctx := t.Context()
	var d Decision
	allocs := testing.AllocsPerRun(1000, func() { d, _ = c.Admit(ctx, "acme", "tokens", 1) })
	if allocs != 0 || d.Admitted || d.How != FromDecision {
		t.Fatalf("%v allocations per Admit; last answer %+v", allocs, d)
	}
}
