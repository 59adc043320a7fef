package admission_test

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"testing"

	"github.com/shopspring/decimal"

	"github.com/tally-ledger/tally/admission"
	"github.com/tally-ledger/tally/quota"
)

// Concurrent releases of grants that draw on shared budgets (a customer's,
// a pool's and the global one) leave every budget exact: consumed is Σ
// spent of the released grants, each freed amount - spent moved once in
// every budget drawn, even when the same grant is released twice at once
// (docs/design.md §13).
func TestConcurrentReleasesLeaveEveryBudgetExact(t *testing.T) {
	e := newEnv(t)
	ctx := context.Background()
	customers := []string{"a", "b", "c"}
	for _, c := range customers {
		e.rule(c, "calls", d("10000"))
	}
	e.scopeRule(quota.PoolScope("team"), "calls", d("10000"))
	e.scopeRule(quota.Global, "calls", d("10000"))
	e.putPool("team", customers...)
	type held struct {
		g        admission.Grant
		customer string
		spent    decimal.Decimal
	}
	var grants []held
	for i := range 30 {
		c := customers[i%len(customers)]
		g, err := e.issue(fmt.Sprintf("gw%d", i%4), c, d("10"))
		if err != nil {
			t.Fatal(err)
		}
		grants = append(grants, held{g: g, customer: c, spent: decimal.NewFromInt(int64(i % 11))})
	}
	var wg sync.WaitGroup
	errs := make([]error, 2*len(grants))
	for i, h := range grants {
		for k := range 2 { // every grant released twice at once: one wins
			wg.Go(func() {
				_, errs[2*i+k] = e.store.Release(ctx, admission.Report{Grant: h.g.ID, Holder: h.g.Holder, Generation: 1, Spent: h.spent})
			})
		}
	}
	wg.Wait()
	want := map[string]decimal.Decimal{}
	total := decimal.Zero
	for i, h := range grants {
		ok := 0
		for _, err := range errs[2*i : 2*i+2] {
			if err == nil {
				ok++
			} else if _, ended := errors.AsType[*admission.GrantEndedError](err); !ended {
				t.Fatalf("release of grant %d: %v", i, err)
			}
		}
		if ok != 1 {
			t.Fatalf("grant %d released %d times", i, ok)
		}
		want[h.customer] = want[h.customer].Add(h.spent)
		total = total.Add(h.spent)
	}
	for _, c := range customers {
		if b := e.budget(c, "calls"); !b.Consumed.Equal(want[c]) || !b.Live.IsZero() {
			t.Fatalf("customer %s: consumed %s live %s, want %s and 0", c, b.Consumed, b.Live, want[c])
		}
	}
	for _, scope := range []string{"pool:team", "global"} {
		if c := e.scopeConsumed(scope, "calls"); !c.Equal(total) {
			t.Fatalf("%s consumed %s, want %s", scope, c, total)
		}
	}
}

// A refused release (stale generation, spent out of bounds) moves nothing
// and leaves the grant live, while releases beside it on the same budgets
// go through; the refused ones roll back, so the connections they used
// serve the next releases.
func TestRefusedReleaseMovesNothingBesideOthers(t *testing.T) {
	e := newEnv(t)
	ctx := context.Background()
	e.rule("a", "calls", d("1000"))
	e.scopeRule(quota.Global, "calls", d("1000"))
	var old []admission.Grant
	for range 10 {
		g, err := e.issue("gw", "a", d("10"))
		if err != nil {
			t.Fatal(err)
		}
		old = append(old, g)
	}
	var fresh []admission.Grant
	for range 10 { // gw restarted: generation 2
		g, err := e.store.Issue(ctx, admission.IssueRequest{Holder: "gw", Generation: 2, Customer: "a", Meter: "calls", Amount: d("10")})
		if err != nil {
			t.Fatal(err)
		}
		fresh = append(fresh, g)
	}
	var wg sync.WaitGroup
	staleErrs, boundErrs, okErrs := make([]error, 10), make([]error, 10), make([]error, 10)
	for i := range 10 {
		wg.Go(func() {
			_, staleErrs[i] = e.store.Release(ctx, admission.Report{Grant: old[i].ID, Holder: "gw", Generation: 1, Spent: d("3")})
		})
		wg.Go(func() {
			_, boundErrs[i] = e.store.Release(ctx, admission.Report{Grant: fresh[i].ID, Holder: "gw", Generation: 2, Spent: d("11")})
		})
	}
	wg.Wait()
	for i := range 10 {
		if se, ok := errors.AsType[*admission.StaleGenerationError](staleErrs[i]); !ok || se.Current != 2 {
			t.Fatalf("stale release %d: %v", i, staleErrs[i])
		}
		if _, ok := errors.AsType[*admission.SpentError](boundErrs[i]); !ok {
			t.Fatalf("release over the amount %d: %v", i, boundErrs[i])
		}
		wg.Go(func() {
			_, okErrs[i] = e.store.Release(ctx, admission.Report{Grant: fresh[i].ID, Holder: "gw", Generation: 2, Spent: d("4")})
		})
	}
	wg.Wait()
	for i, err := range okErrs {
		if err != nil {
			t.Fatalf("release %d: %v", i, err)
		}
		g, err := e.store.Get(ctx, old[i].ID)
		if err != nil {
			t.Fatal(err)
		}
		if g.State != "live" || !g.Spent.IsZero() {
			t.Fatalf("refused release changed grant %d: %+v", i, g)
		}
	}
	// 10 old grants still live (100) + 10 released with 4 spent (40).
	if b := e.budget("a", "calls"); !b.Consumed.Equal(d("140")) || !b.Live.Equal(d("100")) {
		t.Fatalf("customer: consumed %s live %s, want 140 and 100", b.Consumed, b.Live)
	}
	if c := e.scopeConsumed("global", "calls"); !c.Equal(d("140")) {
		t.Fatalf("global consumed %s, want 140", c)
	}
}
