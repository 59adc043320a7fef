package admission_test

import (
	"context"
	"testing"
	"time"

	"github.com/tally-ledger/tally/admission"
	"github.com/tally-ledger/tally/quota"
)

// A release that frees nothing (its whole amount spent) moves no budget,
// so it takes no budget row's lock: releases of spent grants do not queue
// on a hot global row behind each other and behind the issues
// (docs/design.md §13). A release that frees capacity still returns it to
// every budget drawn.
func TestFullySpentReleaseTakesNoBudgetLock(t *testing.T) {
	e := newEnv(t)
	ctx := context.Background()
	e.rule("a", "calls", d("100"))
	e.scopeRule(quota.PoolScope("team"), "calls", d("100"))
	e.scopeRule(quota.Global, "calls", d("100"))
	e.putPool("team", "a")
	spent, err := e.issue("gw", "a", d("10"))
	if err != nil {
		t.Fatal(err)
	}
	part, err := e.issue("gw", "a", d("10"))
	if err != nil {
		t.Fatal(err)
	}
	tx, err := e.pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = tx.Rollback(ctx) }()
	for _, q := range []string{`SELECT 1 FROM admission_budgets FOR UPDATE`, `SELECT 1 FROM admission_scope_budgets FOR UPDATE`} {
		if _, err := tx.Exec(ctx, q); err != nil {
			t.Fatal(err)
		}
	}
	// Without the fix this release waits for the rows held above until the
	// context ends (a deadlock guard, not a speed check).
	rctx, cancel := context.WithTimeout(ctx, 20*time.Second)
	defer cancel()
	g, err := e.store.Release(rctx, admission.Report{Grant: spent.ID, Holder: "gw", Generation: 1, Spent: d("10")})
	if err != nil {
		t.Fatalf("a fully spent release waited on the budget rows: %v", err)
	}
	if g.State != "ended" || !g.Spent.Equal(d("10")) {
		t.Fatalf("released grant: %+v", g)
	}
	if err := tx.Rollback(ctx); err != nil {
		t.Fatal(err)
	}
	if _, err := e.store.Release(ctx, admission.Report{Grant: part.ID, Holder: "gw", Generation: 1, Spent: d("4")}); err != nil {
		t.Fatal(err)
	}
	b := e.budget("a", "calls")
	if !b.Consumed.Equal(d("14")) || !b.Live.IsZero() {
		t.Fatalf("customer budget: consumed %s live %s, want 14 and 0", b.Consumed, b.Live)
	}
	for _, scope := range []string{"pool:team", "global"} {
		if c := e.scopeConsumed(scope, "calls"); !c.Equal(d("14")) {
			t.Fatalf("%s consumed %s, want 14", scope, c)
		}
	}
	if _, err := e.store.Release(ctx, admission.Report{Grant: spent.ID, Holder: "gw", Generation: 1, Spent: d("10")}); err == nil {
		t.Fatal("a grant was released twice")
	}
}
