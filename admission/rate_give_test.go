package admission_test

import (
	"context"
	"testing"
	"time"

	"github.com/shopspring/decimal"

	"github.com/tally-ledger/tally/admission"
)

// A release's unspent part must not become capacity the bucket would not
// have had: a grant that held the whole burst while the bucket refilled,
// released unspent just before its reclaim, used to put the whole burst
// back on top of the refill another holder had already taken, so three
// grants live at one instant held burst + two refills, past the §17 bound
// (docs/design.md §17, "The bound").
func TestRateReleaseAfterRefillKeepsTheBound(t *testing.T) {
	e := rateEnv(t)
	ctx := context.Background()
	const skew = 100 * time.Millisecond
	scope := "customer:acme"
	// 1 per 100 ms (10/s), a burst of 20: the refill over ttl (1 s) +
	// max_skew (100 ms) is 11, and the bucket does not fill up in it.
	start := pgNow(t, e)
	e.rateRule(scope, "calls", "1", "100ms", "20", skew, time.Time{})
	versions := []rateVersion{{at: start, amount: d("1"), burst: d("20"), per: 100 * time.Millisecond}}
	min := decimal.NewNullDecimal(d("0.000000001"))
	issue := func(holder string) admission.Grant {
		t.Helper()
		g, err := e.store.Issue(ctx, admission.IssueRequest{Holder: holder, Generation: 1, Customer: "acme",
			Meter: "calls", Amount: d("20"), MinAmount: min})
		if err != nil {
			t.Fatalf("issue to %s: %v", holder, err)
		}
		return g
	}
	awaitTokens := func(want string) {
		t.Helper()
		for {
			if tok, _ := tokensAt(t, e, scope); tok.GreaterThanOrEqual(d(want)) {
				return
			}
			time.Sleep(5 * time.Millisecond)
		}
	}
	g0 := issue("gw0") // the whole burst
	awaitTokens("8")   // refilled while g0 holds its tokens (reclaimed at 1.1 s)
	g1 := issue("gw1") // takes the refill
	if _, err := e.store.Release(ctx, admission.Report{Grant: g0.ID, Holder: "gw0", Generation: 1, Spent: d("0")}); err != nil {
		t.Fatalf("release g0 before its reclaim: %v", err)
	}
	g2 := issue("gw2") // what the release gave back
	awaitTokens("8.5") // refilled again, while g1 still admits (until 1 s after it)
	g3 := issue("gw3")
	grants := []*rateGrant{{id: g0.ID, amount: g0.Amount, admitted: d("0"), released: true}}
	for _, g := range []admission.Grant{g1, g2, g3} {
		grants = append(grants, &rateGrant{id: g.ID, amount: g.Amount, admitted: g.Amount})
	}
	t.Logf("granted %s, %s, %s after a release of %s", g1.Amount, g2.Amount, g3.Amount, g0.Amount)
	checkRateBound(t, e, grants, versions, skew)
}
