package admission_test

import (
	"context"
	"errors"
	"testing"

	"github.com/shopspring/decimal"

	"github.com/tally-ledger/tally/admission"
	"github.com/tally-ledger/tally/quota"
)

// A holder's several grants released at once (ReleaseAll, one shared
// transaction): every report is fenced by its own holder and generation
// and decided all or nothing on its own. The refused ones move nothing;
// the others free amount - spent in every budget drawn, once, even when
// the batch names the same grant twice (docs/design.md §13).
func TestReleaseAllIsAllOrNothingPerGrant(t *testing.T) {
	e := newEnv(t)
	ctx := context.Background()
	e.rule("acme", "calls", d("1000"))
	e.scopeRule(quota.PoolScope("team"), "calls", d("1000"))
	e.scopeRule(quota.Global, "calls", d("1000"))
	e.putPool("team", "acme")
	issue := func(holder string, gen int64) admission.Grant {
		t.Helper()
		g, err := e.store.Issue(ctx, admission.IssueRequest{Holder: holder, Generation: gen, Customer: "acme",
			Meter: "calls", Amount: d("10")})
		if err != nil {
			t.Fatal(err)
		}
		return g
	}
	old := issue("gw1", 1)   // gw1's first run
	other := issue("gw2", 1) // another holder's
	cur := issue("gw1", 2)   // gw1 restarted: generation 2
	over := issue("gw1", 2)
	whole := issue("gw1", 2)
	twice := issue("gw1", 2)
	type state struct{ customer, pool, global decimal.Decimal }
	read := func() state {
		return state{e.budget("acme", "calls").Consumed, e.scopeConsumed(quota.PoolScope("team"), "calls"),
			e.scopeConsumed(quota.Global, "calls")}
	}
	before := read()
	rep := func(g admission.Grant, gen int64, spent string) admission.Report {
		return admission.Report{Grant: g.ID, Holder: "gw1", Generation: gen, Spent: d(spent)}
	}
	gs, errs := e.store.ReleaseAll(ctx, []admission.Report{
		rep(cur, 2, "4"),    // frees 6
		rep(old, 1, "1"),    // an older generation of the holder: fenced
		rep(other, 2, "1"),  // another holder's grant: fenced
		rep(over, 2, "11"),  // more than the amount: refused, moves nothing
		rep(whole, 2, "10"), // all spent: ends, frees nothing
		rep(twice, 2, "3"),  // frees 7
		rep(twice, 2, "3"),  // the same grant again: ended by the report before
		{Grant: cur.ID, Holder: "gw1", Generation: 2, Spent: d("-1")}, // invalid on its own
	})
	wantOK := func(i int, spent string) {
		t.Helper()
		if errs[i] != nil || gs[i].State != "ended" || gs[i].EndReason != "released" || !gs[i].Spent.Equal(d(spent)) {
			t.Errorf("report %d: %+v, %v; want released with spent %s", i, gs[i], errs[i], spent)
		}
	}
	wantOK(0, "4")
	if _, ok := errors.AsType[*admission.StaleGenerationError](errs[1]); !ok {
		t.Errorf("report 1: %v, want a stale generation", errs[1])
	}
	if _, ok := errors.AsType[*admission.FencedError](errs[2]); !ok {
		t.Errorf("report 2: %v, want not the holder", errs[2])
	}
	if _, ok := errors.AsType[*admission.SpentError](errs[3]); !ok {
		t.Errorf("report 3: %v, want a spent error", errs[3])
	}
	wantOK(4, "10")
	wantOK(5, "3")
	if _, ok := errors.AsType[*admission.GrantEndedError](errs[6]); !ok {
		t.Errorf("report 6: %v, want grant ended", errs[6])
	}
	if _, ok := errors.AsType[*admission.FieldError](errs[7]); !ok {
		t.Errorf("report 7: %v, want a field error", errs[7])
	}
	freed := d("13") // 6 + 7
	after := read()
	if want := (state{before.customer.Sub(freed), before.pool.Sub(freed), before.global.Sub(freed)}); !after.customer.Equal(want.customer) ||
		!after.pool.Equal(want.pool) || !after.global.Equal(want.global) {
		t.Errorf("consumed after: %+v, want %+v (before %+v)", after, want, before)
	}
	// The refused ones are as they were: live, unreported.
	for _, g := range []admission.Grant{old, other, over} {
		got, err := e.store.Get(ctx, g.ID)
		if err != nil || got.State != "live" || !got.Spent.IsZero() {
			t.Errorf("grant %s after a refused release: %+v, %v; want live with nothing spent", g.ID, got, err)
		}
	}
	// And each can still be released by its own holder and generation.
	if _, err := e.store.Release(ctx, admission.Report{Grant: other.ID, Holder: "gw2", Generation: 1, Spent: d("2")}); err != nil {
		t.Errorf("release by its holder: %v", err)
	}
}
