package admission_test

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"sync"
	"testing"
	"time"

	"github.com/shopspring/decimal"

	"github.com/tally-ledger/tally/admission"
	"github.com/tally-ledger/tally/pools"
	"github.com/tally-ledger/tally/quota"
)

// Two API processes (two Stores on one database) serve the same gateways
// at once: first grants of new holders, grants drawn from a customer's,
// pools' and the global budget, renews, releases one by one and together,
// grants of a customer's rate budget, customers joining and leaving two
// pools, holders retired and new versions of the budgets' rules
// meanwhile. No request fails for the database's sake (a deadlock, a
// serialization failure): every answer is a grant or one of admission's
// own refusals.
func TestTwoProcessesServingTheSameGatewaysNeverDeadlock(t *testing.T) {
	e := newEnv(t)
	stores := []*admission.Store{e.store, e.otherProcess()}
	customers := []string{"a", "b", "c", "d", "e", "f"}
	for _, c := range customers[:5] {
		e.rule(c, "calls", d("1000000"))
	}
	e.rateRule("customer:f", "calls", "100000", "1s", "100000", 0, time.Time{})
	e.scopeRule(quota.PoolScope("team"), "calls", d("1000000"))
	e.scopeRule(quota.Global, "calls", d("1000000"))
	e.putPool("team", customers[:3]...)
	e.scopeRule(quota.PoolScope("ops"), "calls", d("1000000"))
	e.putPool("ops", customers[2:5]...)
	ctx := context.Background()
	check := func(what string, err error) {
		if err == nil {
			return
		}
		var ended *admission.GrantEndedError
		var exhausted *admission.BudgetExhaustedError
		var fenced *admission.FencedError
		if !errors.As(err, &ended) && !errors.As(err, &exhausted) && !errors.As(err, &fenced) &&
			!errors.Is(err, admission.ErrKeptChanging) {
			t.Errorf("%s: %v", what, err)
		}
	}
	var wg sync.WaitGroup
	for w := range 12 {
		wg.Go(func() {
			r := rand.New(rand.NewPCG(uint64(w), 7))
			var held []admission.Grant
			for i := range 40 {
				s := stores[r.IntN(2)]
				switch {
				case len(held) == 0 || r.IntN(3) > 0:
					g, err := s.Issue(ctx, admission.IssueRequest{Holder: fmt.Sprintf("gw%d-%d", w, i/10), Generation: 1,
						Customer: customers[r.IntN(len(customers))], Meter: "calls", Amount: d("5")})
					check("issue", err)
					if err == nil {
						held = append(held, g)
					}
				case r.IntN(3) == 0:
					g := held[r.IntN(len(held))]
					_, err := s.Renew(ctx, admission.Report{Grant: g.ID, Holder: g.Holder, Generation: 1, Spent: d("1")})
					check("renew", err)
				case r.IntN(2) == 0:
					g := held[0]
					held = held[1:]
					_, err := s.Release(ctx, admission.Report{Grant: g.ID, Holder: g.Holder, Generation: 1, Spent: d("2")})
					check("release", err)
				default:
					var rs []admission.Report
					for _, g := range held {
						rs = append(rs, admission.Report{Grant: g.ID, Holder: g.Holder, Generation: 1, Spent: d("3")})
					}
					held = nil
					_, errs := s.ReleaseAll(ctx, rs)
					for _, err := range errs {
						check("release all", err)
					}
				}
			}
		})
	}
	wg.Go(func() {
		// New rule versions: the budgets are brought to them mid-flight.
		for i := range 8 {
			time.Sleep(15 * time.Millisecond)
			scope := quota.CustomerScope(customers[i%5])
			if i%2 == 1 {
				scope = []string{quota.PoolScope("team"), quota.Global}[i/2%2]
			}
			if err := e.putLimit(scope, "calls", decimal.NewFromInt(int64(1000000+i))); err != nil {
				t.Errorf("rule %d: %v", i, err)
			}
		}
	})
	wg.Go(func() {
		for i := range 6 {
			time.Sleep(20 * time.Millisecond)
			_, err := stores[i%2].RetireHolder(ctx, fmt.Sprintf("gw%d-0", i))
			if !errors.Is(err, admission.ErrUnknownHolder) {
				check("retire", err)
			}
		}
	})
	for k, pool := range []string{"team", "ops"} {
		wg.Go(func() {
			for i := range 20 {
				members := customers[(i+k)%4 : (i+k)%4+3]
				if _, err := stores[(i+k)%2].PutPool(ctx, pools.PutInput{Name: pool, Members: members, Actor: "test"}); err != nil {
					check("pool", err)
				}
			}
		})
	}
	wg.Wait()
	var live, spent decimal.Decimal
	if err := e.pool.QueryRow(ctx, `SELECT coalesce(sum(amount) FILTER (WHERE ended_at IS NULL), 0),
		coalesce(sum(spent) FILTER (WHERE ended_at IS NOT NULL), 0) FROM admission_grants`).Scan(&live, &spent); err != nil {
		t.Fatal(err)
	}
	if c := e.scopeConsumed(quota.Global, "calls"); !c.Equal(live.Add(spent)) {
		t.Errorf("global consumed %s, want %s live + %s spent", c, live, spent)
	}
}
