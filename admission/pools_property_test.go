package admission_test

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sync"
	"testing"

	"github.com/google/uuid"
	"github.com/shopspring/decimal"
	"pgregory.net/rapid"

	"github.com/tally-ledger/tally/admission"
	"github.com/tally-ledger/tally/quota"
)

type poolGrant struct {
	id       uuid.UUID
	holder   string
	budgets  []string
	amount   decimal.Decimal
	released bool
	spent    decimal.Decimal
}

// TestSeveralBudgetsProperty issues random grant requests (alone and
// concurrently, some naming a subset of their budgets) and releases over
// customers in overlapping pools and a global budget. After every step
// each budget's consumed is exactly Σ over the grants drawn from it
// (amount, or spent once released) — so a refused request changed no
// budget — and never above its limit; a request alone is granted exactly
// when every budget it draws from has room, else refused naming a budget
// without room and its available.
func TestSeveralBudgetsProperty(t *testing.T) {
	e := newEnv(t)
	ctx := context.Background()
	var n int
	rapid.Check(t, func(rt *rapid.T) {
		n++
		meter := fmt.Sprintf("m%d", n)
		customers := []string{fmt.Sprintf("i%d-a", n), fmt.Sprintf("i%d-b", n), fmt.Sprintf("i%d-c", n), fmt.Sprintf("i%d-d", n)}
		poolNames := []string{fmt.Sprintf("i%d-p", n), fmt.Sprintf("i%d-q", n)}
		limits := map[string]decimal.Decimal{}
		genLimit := func(label string) decimal.Decimal {
			return decimal.NewFromInt(rapid.Int64Range(0, 60).Draw(rt, label))
		}
		for _, c := range customers {
			if rapid.Bool().Draw(rt, "customer rule "+c) {
				limits[quota.CustomerScope(c)] = genLimit("limit " + c)
				e.rule(c, meter, limits[quota.CustomerScope(c)])
			}
		}
		members := map[string][]string{}
		for _, p := range poolNames {
			for _, c := range customers {
				if rapid.Bool().Draw(rt, "member "+c+" of "+p) {
					members[p] = append(members[p], c)
				}
			}
			e.putPool(p, members[p]...)
			if rapid.Bool().Draw(rt, "pool rule "+p) {
				limits[quota.PoolScope(p)] = genLimit("limit " + p)
				e.scopeRule(quota.PoolScope(p), meter, limits[quota.PoolScope(p)])
			}
		}
		limits[quota.Global] = genLimit("limit global")
		e.scopeRule(quota.Global, meter, limits[quota.Global])

		// budgetsOf is every exact budget of c, in lock order.
		budgetsOf := func(c string) []string {
			var out []string
			if _, ok := limits[quota.CustomerScope(c)]; ok {
				out = append(out, quota.CustomerScope(c))
			}
			var scopes []string
			for _, p := range poolNames {
				if _, ok := limits[quota.PoolScope(p)]; ok && slices.Contains(members[p], c) {
					scopes = append(scopes, quota.PoolScope(p))
				}
			}
			scopes = append(scopes, quota.Global)
			slices.Sort(scopes)
			return append(out, scopes...)
		}
		var grants []*poolGrant
		consumed := func(scope string) decimal.Decimal {
			sum := decimal.Zero
			for _, g := range grants {
				if slices.Contains(g.budgets, scope) {
					if g.released {
						sum = sum.Add(g.spent)
					} else {
						sum = sum.Add(g.amount)
					}
				}
			}
			return sum
		}
		available := func(scope string) decimal.Decimal {
			return decimal.Max(decimal.Zero, limits[scope].Sub(consumed(scope)))
		}
		// check reads every budget of the meter in one query.
		check := func(step string) {
			rows, err := e.pool.Query(ctx, `
				SELECT 'customer:' || customer, consumed::text FROM admission_budgets WHERE meter = $1 AND "limit" IS NOT NULL
				UNION ALL
				SELECT scope, consumed::text FROM admission_scope_budgets WHERE meter = $1`, meter)
			if err != nil {
				rt.Fatal(err)
			}
			stored := map[string]decimal.Decimal{}
			for rows.Next() {
				var scope, c string
				if err := rows.Scan(&scope, &c); err != nil {
					rt.Fatal(err)
				}
				stored[scope] = decimal.RequireFromString(c)
			}
			if err := rows.Err(); err != nil {
				rt.Fatal(err)
			}
			for scope, limit := range limits {
				got := stored[scope] // zero before the budget's first request
				if want := consumed(scope); !got.Equal(want) {
					rt.Fatalf("%s: %s consumed %s, model %s", step, scope, got, want)
				}
				if got.GreaterThan(limit) {
					rt.Fatalf("%s: %s consumed %s above its limit %s", step, scope, got, limit)
				}
			}
		}
		type request struct {
			customer string
			amount   decimal.Decimal
			named    []string // nil: every budget
		}
		genRequest := rapid.Custom(func(rt *rapid.T) request {
			c := rapid.SampledFrom(customers).Draw(rt, "customer")
			req := request{customer: c, amount: decimal.NewFromInt(rapid.Int64Range(1, 25).Draw(rt, "amount"))}
			if all := budgetsOf(c); rapid.Bool().Draw(rt, "subset") {
				for _, b := range all {
					if rapid.Bool().Draw(rt, "name "+b) {
						req.named = append(req.named, b)
					}
				}
				if len(req.named) == 0 {
					req.named = all[len(all)-1:]
				}
				// Named in any order: the store locks in its own.
				req.named = rapid.Permutation(req.named).Draw(rt, "order")
			}
			return req
		})
		drawnBy := func(req request) []string {
			if req.named == nil {
				return budgetsOf(req.customer)
			}
			out := slices.Clone(req.named)
			slices.SortFunc(out, func(a, b string) int { // customer first, then sorted
				_, ca := cutCustomer(a)
				_, cb := cutCustomer(b)
				switch {
				case ca && !cb:
					return -1
				case cb && !ca:
					return 1
				}
				return compareStrings(a, b)
			})
			return out
		}
		send := func(holder string, req request) (admission.Grant, error) {
			return e.store.Issue(ctx, admission.IssueRequest{Holder: holder, Generation: 1, Customer: req.customer,
				Meter: meter, Amount: req.amount, Budgets: req.named})
		}
		record := func(holder string, g admission.Grant) {
			grants = append(grants, &poolGrant{id: g.ID, holder: holder, budgets: g.Budgets, amount: g.Amount, spent: decimal.Zero})
		}
		holder := fmt.Sprintf("i%d-gw", n)
		// A budget row is created by the first request that draws from it,
		// counting what its members consumed so far this period (joining and
		// new rules never hand out a fresh allowance). Create them all before
		// any grant, with requests every budget refuses, so the model starts
		// every budget at zero.
		for _, c := range customers {
			if _, err := send(holder, request{customer: c, amount: decimal.NewFromInt(1000)}); err == nil {
				rt.Fatalf("1000 granted to %s with limits of at most 60", c)
			}
		}
		check("setup")

		rt.Repeat(map[string]func(*rapid.T){
			"issue": func(rt *rapid.T) {
				req := genRequest.Draw(rt, "request")
				want := drawnBy(req)
				var short []string
				for _, b := range want {
					if available(b).LessThan(req.amount) {
						short = append(short, b)
					}
				}
				g, err := send(holder, req)
				if len(short) == 0 {
					if err != nil || !g.Amount.Equal(req.amount) || !slices.Equal(g.Budgets, want) {
						rt.Fatalf("issue %s to %s from %v: %+v %v", req.amount, req.customer, want, g, err)
					}
					record(holder, g)
				} else {
					ex, ok := errors.AsType[*admission.BudgetExhaustedError](err)
					if !ok {
						rt.Fatalf("issue %s to %s with %v short: want budget_exhausted, got %v", req.amount, req.customer, short, err)
					}
					binding := ex.Binding[:len(ex.Binding)-len(meter)-1]
					if !slices.Contains(short, binding) || !ex.Available.Equal(available(binding)) {
						rt.Fatalf("refusal names %s with %s available; short: %v", ex.Binding, ex.Available, short)
					}
				}
				check("issue")
			},
			"concurrent issue": func(rt *rapid.T) {
				reqs := rapid.SliceOfN(genRequest, 2, 8).Draw(rt, "requests")
				out := make([]admission.Grant, len(reqs))
				errs := make([]error, len(reqs))
				var wg sync.WaitGroup
				for i, req := range reqs {
					wg.Go(func() { out[i], errs[i] = send(fmt.Sprintf("%s%d", holder, i), req) })
				}
				wg.Wait()
				for i := range reqs {
					if errs[i] == nil {
						record(fmt.Sprintf("%s%d", holder, i), out[i])
					} else if _, ok := errors.AsType[*admission.BudgetExhaustedError](errs[i]); !ok {
						rt.Fatalf("concurrent issue: %v", errs[i])
					}
				}
				check("concurrent issue")
			},
			"release": func(rt *rapid.T) {
				var live []*poolGrant
				for _, g := range grants {
					if !g.released {
						live = append(live, g)
					}
				}
				if len(live) == 0 {
					return // nothing to release yet: a no-op step
				}
				g := rapid.SampledFrom(live).Draw(rt, "grant")
				spent := decimal.NewFromInt(rapid.Int64Range(0, g.amount.IntPart()).Draw(rt, "spent"))
				if _, err := e.store.Release(ctx, admission.Report{Grant: g.id, Holder: g.holder, Generation: 1, Spent: spent}); err != nil {
					rt.Fatalf("release: %v", err)
				}
				g.released, g.spent = true, spent
				check("release")
			},
		})
	})
}

func cutCustomer(scope string) (string, bool) {
	const p = "customer:"
	if len(scope) > len(p) && scope[:len(p)] == p {
		return scope[len(p):], true
	}
	return "", false
}

func compareStrings(a, b string) int {
	switch {
	case a < b:
		return -1
	case a > b:
		return 1
	}
	return 0
}
