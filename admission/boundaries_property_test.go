package admission_test

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"math"
	"os"
	"slices"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/shopspring/decimal"
	"pgregory.net/rapid"

	"github.com/tally-ledger/tally/admission"
	"github.com/tally-ledger/tally/periods"
	"github.com/tally-ledger/tally/pools"
	"github.com/tally-ledger/tally/quota"
)

// boundaryChecks is how many random runs TestBoundariesProperty makes: a
// few by default, so that it stays within a minute under -race (each run
// is dozens of transactions); TALLY_BOUNDARY_CHECKS=n, or -rapid.checks=n
// given explicitly, asks for n.
func boundaryChecks() int {
	if n, err := strconv.Atoi(os.Getenv("TALLY_BOUNDARY_CHECKS")); err == nil && n > 0 {
		return n
	}
	set := false
	flag.Visit(func(f *flag.Flag) { set = set || f.Name == "rapid.checks" })
	if set {
		return math.MaxInt
	}
	return 40
}

// admissionPool is a pool's members from now.
func admissionPool(name string, members []string) pools.PutInput {
	return pools.PutInput{Name: name, Members: members, Actor: "test"}
}

// The model of TestBoundariesProperty: what was asked and answered, from
// which it derives, by docs/design.md §12 and §13 alone, the rule version
// in force, the periods and what each budget consumed.

type modelVersion struct {
	version   int64
	effective time.Time
	limit     decimal.Decimal
	exact     bool
}

type modelStay struct {
	customer     string
	joined, left time.Time // left zero: still a member
}

type boundaryGrant struct {
	g        admission.Grant
	holder   string
	released *time.Time
	spent    decimal.Decimal
}

type boundaryModel struct {
	rules     map[string][]modelVersion // by scope
	stays     map[string][]modelStay    // by pool
	calendars map[string]periods.Calendar
	grants    []*boundaryGrant
}

// inForce is the version in force at t: the latest effective time not
// after t, ties broken by the higher version.
func (m *boundaryModel) inForce(scope string, t time.Time) (modelVersion, bool) {
	var best modelVersion
	found := false
	for _, v := range m.rules[scope] {
		if v.effective.After(t) {
			continue
		}
		if !found || v.effective.After(best.effective) || (v.effective.Equal(best.effective) && v.version > best.version) {
			best, found = v, true
		}
	}
	return best, found
}

// period of a scope at t: the customer's calendar, or monthly UTC.
func (m *boundaryModel) period(rt *rapid.T, scope string, t time.Time) periods.Period {
	cal := periods.DefaultCalendar()
	if c, ok := cutCustomer(scope); ok {
		if mc, ok := m.calendars[c]; ok {
			cal = mc
		}
	}
	p, err := cal.PeriodAt(t)
	if err != nil {
		rt.Fatal(err)
	}
	return p
}

// member says whether c's grants issued at t count for pool: c had a stay
// of the pool's period, and at t had not left it for good (a customer
// still a member counts from the period's start; one that left, until it
// left).
func (m *boundaryModel) member(pool, c string, p periods.Period, t, now time.Time) bool {
	in, open := false, false
	var lastLeft time.Time
	for _, s := range m.stays[pool] {
		if s.customer != c || s.joined.After(now) || (!s.left.IsZero() && !s.left.After(p.Start)) {
			continue
		}
		in = true
		if s.left.IsZero() {
			open = true
		} else if s.left.After(lastLeft) {
			lastLeft = s.left
		}
	}
	return in && (open || t.Before(lastLeft))
}

// memberNow says whether c is in pool at t.
func (m *boundaryModel) memberNow(pool, c string, t time.Time) bool {
	for _, s := range m.stays[pool] {
		if s.customer == c && !s.joined.After(t) && (s.left.IsZero() || s.left.After(t)) {
			return true
		}
	}
	return false
}

// consumed is what the budget of scope whose period contains now consumed:
// every grant that counts for it, issued in its period (amount, or spent
// once released).
func (m *boundaryModel) consumed(rt *rapid.T, scope string, now time.Time) decimal.Decimal {
	p := m.period(rt, scope, now)
	sum := decimal.Zero
	for _, g := range m.grants {
		if g.g.IssuedAt.Before(p.Start) || !g.g.IssuedAt.Before(p.End) {
			continue
		}
		c := g.g.Customer
		switch {
		case scope == quota.Global:
		case scope == quota.CustomerScope(c):
		default:
			pool, ok := cutPool(scope)
			if !ok || !m.member(pool, c, p, g.g.IssuedAt, now) {
				continue
			}
		}
		if g.released != nil && !g.released.After(now) {
			sum = sum.Add(g.spent)
		} else {
			sum = sum.Add(g.g.Amount)
		}
	}
	return sum
}

// budgets is every exact budget of customer c at t, in lock order.
func (m *boundaryModel) budgets(c string, pools []string, t time.Time) []string {
	var out []string
	if v, ok := m.inForce(quota.CustomerScope(c), t); ok && v.exact {
		out = append(out, quota.CustomerScope(c))
	}
	var scopes []string
	for _, p := range pools {
		if v, ok := m.inForce(quota.PoolScope(p), t); ok && v.exact && m.memberNow(p, c, t) {
			scopes = append(scopes, quota.PoolScope(p))
		}
	}
	if v, ok := m.inForce(quota.Global, t); ok && v.exact {
		scopes = append(scopes, quota.Global)
	}
	slices.Sort(scopes)
	return append(out, scopes...)
}

func cutPool(scope string) (string, bool) {
	const p = "pool:"
	if len(scope) > len(p) && scope[:len(p)] == p {
		return scope[len(p):], true
	}
	return "", false
}

// TestBoundariesProperty runs random interleavings of rule versions (some
// effective later, turning exact and lagged), pool joins and leaves, time
// passing across period boundaries of customers on UTC, Los Angeles and
// Tokyo calendars (monthly and daily) and of the pool and global budgets
// (monthly UTC), and issue (alone and concurrent), renew and release. It
// checks, by a model that knows only docs/design.md's definitions:
//
//   - after every issue, every budget a grant drew from has consumed (Σ
//     live amounts + Σ ended spent of the grants that count in its period)
//     no more than the limit of the version in force;
//   - a grant draws from exactly the exact budgets in force; a request
//     alone is granted when all of them have room, and refused naming one
//     without room otherwise;
//   - no grant, issued or renewed, is valid past the end of a period it
//     drew from.
func TestBoundariesProperty(t *testing.T) {
	e := newEnv(t)
	ctx := context.Background()
	var n, passed int
	checks, failing := boundaryChecks(), false
	// What the runs did, so that a run that exercises nothing shows.
	var mu sync.Mutex
	did := map[string]int{}
	count := func(what string) { mu.Lock(); did[what]++; mu.Unlock() }
	defer func() { t.Logf("runs %d: %v", passed, did) }()
	rapid.Check(t, func(rt *rapid.T) {
		if passed >= checks && !failing {
			return // enough runs: the rest of rapid's checks pass at once
		}
		defer func() {
			r := recover()
			if rt.Failed() {
				failing = true // shrink and replay run in full
			}
			if r != nil {
				panic(r)
			}
			passed++
		}()
		n++
		meter := fmt.Sprintf("b%d", n)
		cals := map[string]periods.Calendar{
			fmt.Sprintf("b%d-utc", n): periods.DefaultCalendar(),
			fmt.Sprintf("b%d-la", n):  {Cadence: periods.Monthly, AnchorDay: 1, Zone: "America/Los_Angeles"},
			fmt.Sprintf("b%d-tk", n):  {Cadence: periods.Daily, Zone: "Asia/Tokyo"},
		}
		customers := slices.Sorted(func(yield func(string) bool) {
			for c := range cals {
				if !yield(c) {
					return
				}
			}
		})
		for _, c := range customers {
			e.calendar(c, cals[c])
		}
		poolNames := []string{fmt.Sprintf("b%d-p", n), fmt.Sprintf("b%d-q", n)}
		m := &boundaryModel{rules: map[string][]modelVersion{}, stays: map[string][]modelStay{}, calendars: cals}
		// From some hours before a month's end in every zone.
		e.clock.t = time.Date(2026, 12, 31, 0, 0, 0, 0, time.UTC).
			Add(time.Duration(rapid.IntRange(0, 20).Draw(rt, "start hour")) * time.Hour)
		for _, p := range poolNames {
			if _, err := e.store.PutPool(ctx, admissionPool(p, nil)); err != nil {
				rt.Fatal(err)
			}
		}
		scopes := []string{quota.Global}
		for _, c := range customers {
			scopes = append(scopes, quota.CustomerScope(c))
		}
		for _, p := range poolNames {
			scopes = append(scopes, quota.PoolScope(p))
		}
		holder := fmt.Sprintf("b%d-gw", n)

		checkValidity := func(step string, g admission.Grant) {
			for _, b := range g.Budgets {
				if end := m.period(rt, b, g.IssuedAt).End; g.ValidUntil.After(end) {
					rt.Fatalf("%s: grant valid until %v, past the end %v of %s's period", step, g.ValidUntil, end, b)
				}
			}
		}
		checkWithin := func(step string, drawn []string) {
			now := e.clock.Now()
			for _, b := range drawn {
				v, _ := m.inForce(b, now)
				if got := m.consumed(rt, b, now); got.GreaterThan(v.limit) {
					rt.Fatalf("%s: %s consumed %s above the limit %s of v%d in force", step, b, got, v.limit, v.version)
				}
			}
		}
		issue := func(h, c string, amt decimal.Decimal) (admission.Grant, error) {
			return e.store.Issue(ctx, admission.IssueRequest{Holder: h, Generation: 1, Customer: c, Meter: meter, Amount: amt,
				TTL: time.Duration(rapid.IntRange(5, 600).Draw(rt, "ttl seconds")) * time.Second})
		}
		record := func(h string, g admission.Grant) {
			m.grants = append(m.grants, &boundaryGrant{g: g, holder: h, spent: decimal.Zero})
		}
		liveGrants := func() []*boundaryGrant {
			var out []*boundaryGrant
			for _, g := range m.grants {
				if g.released == nil && e.clock.Now().Before(g.g.ReclaimAt) {
					out = append(out, g)
				}
			}
			return out
		}

		rt.Repeat(map[string]func(*rapid.T){
			"rule version": func(rt *rapid.T) {
				scope := rapid.SampledFrom(scopes).Draw(rt, "scope")
				now := e.clock.Now()
				v := modelVersion{
					effective: now.Add(rapid.SampledFrom([]time.Duration{0, time.Second, time.Hour, 5 * time.Hour}).Draw(rt, "effective in")),
					limit:     decimal.NewFromInt(rapid.Int64Range(0, 80).Draw(rt, "limit")),
					exact:     rapid.Float64().Draw(rt, "exact") < 0.7,
				}
				adm := quota.Lagged
				if v.exact {
					adm = quota.Exact
				}
				err := pgx.BeginFunc(ctx, e.pool, func(tx pgx.Tx) error {
					if c, ok := cutCustomer(scope); ok {
						r, err := quota.PutRuleAt(ctx, tx, quota.RuleInput{Customer: c, Meter: meter, Limit: v.limit, Admission: adm,
							EffectiveAt: v.effective, Actor: "test"}, now)
						v.version = r.Version
						return err
					}
					r, err := quota.PutScopeRuleAt(ctx, tx, quota.ScopeRuleInput{Scope: scope, Meter: meter, Limit: v.limit, Admission: adm,
						EffectiveAt: v.effective, Actor: "test"}, now)
					v.version = r.Version
					return err
				})
				if err != nil {
					rt.Fatalf("put %s rule: %v", scope, err)
				}
				m.rules[scope] = append(m.rules[scope], v)
			},
			"membership": func(rt *rapid.T) {
				p := rapid.SampledFrom(poolNames).Draw(rt, "pool")
				var members []string
				for _, c := range customers {
					if rapid.Bool().Draw(rt, "member "+c) {
						members = append(members, c)
					}
				}
				// A stay is keyed by its join instant: a leave and a rejoin
				// are never the same microsecond.
				e.clock.Advance(time.Millisecond)
				if _, err := e.store.PutPool(ctx, admissionPool(p, members)); err != nil {
					rt.Fatal(err)
				}
				now := e.clock.Now()
				for i, s := range m.stays[p] {
					if s.left.IsZero() && !slices.Contains(members, s.customer) {
						m.stays[p][i].left = now
					}
				}
				for _, c := range members {
					if !m.memberNow(p, c, now) {
						m.stays[p] = append(m.stays[p], modelStay{customer: c, joined: now})
					}
				}
			},
			"time passes": func(rt *rapid.T) {
				e.clock.Advance(rapid.SampledFrom([]time.Duration{time.Second, 40 * time.Second, 20 * time.Minute, 3 * time.Hour, 9 * time.Hour}).
					Draw(rt, "by"))
			},
			"issue": func(rt *rapid.T) {
				c := rapid.SampledFrom(customers).Draw(rt, "customer")
				amt := decimal.NewFromInt(rapid.Int64Range(1, 30).Draw(rt, "amount"))
				now := e.clock.Now()
				want := m.budgets(c, poolNames, now)
				var short []string
				for _, b := range want {
					v, _ := m.inForce(b, now)
					if m.consumed(rt, b, now).Add(amt).GreaterThan(v.limit) {
						short = append(short, b)
					}
				}
				g, err := issue(holder, c, amt)
				switch {
				case len(want) == 0:
					if _, ok := errors.AsType[*admission.NotExactError](err); !ok {
						rt.Fatalf("issue to %s with no exact budget: %+v %v", c, g, err)
					}
				case len(short) == 0:
					if err != nil || !g.Amount.Equal(amt) || !slices.Equal(g.Budgets, want) {
						rt.Fatalf("issue %s to %s from %v (all with room): %+v %v", amt, c, want, g, err)
					}
					record(holder, g)
					checkValidity("issue", g)
					checkWithin("issue", g.Budgets)
					count(fmt.Sprintf("issued from %d budgets", len(g.Budgets)))
				default:
					ex, ok := errors.AsType[*admission.BudgetExhaustedError](err)
					if !ok {
						rt.Fatalf("issue %s to %s with %v short: want budget_exhausted, got %+v %v", amt, c, short, g, err)
					}
					if binding := ex.Binding[:len(ex.Binding)-len(meter)-1]; !slices.Contains(short, binding) {
						rt.Fatalf("refusal names %s; short: %v", ex.Binding, short)
					}
					count("refused")
				}
			},
			"concurrent issue": func(rt *rapid.T) {
				k := rapid.IntRange(2, 6).Draw(rt, "requests")
				cs := make([]string, k)
				amts := make([]decimal.Decimal, k)
				ttls := make([]time.Duration, k)
				for i := range k {
					cs[i] = rapid.SampledFrom(customers).Draw(rt, "customer")
					amts[i] = decimal.NewFromInt(rapid.Int64Range(1, 30).Draw(rt, "amount"))
					ttls[i] = time.Duration(rapid.IntRange(5, 600).Draw(rt, "ttl seconds")) * time.Second
				}
				out := make([]admission.Grant, k)
				errs := make([]error, k)
				var wg sync.WaitGroup
				for i := range k {
					wg.Go(func() {
						out[i], errs[i] = e.store.Issue(ctx, admission.IssueRequest{Holder: fmt.Sprintf("%s%d", holder, i), Generation: 1,
							Customer: cs[i], Meter: meter, Amount: amts[i], TTL: ttls[i]})
					})
				}
				wg.Wait()
				var drawn []string
				for i := range k {
					var notExact *admission.NotExactError
					var exhausted *admission.BudgetExhaustedError
					switch {
					case errs[i] == nil:
						if want := m.budgets(cs[i], poolNames, e.clock.Now()); !slices.Equal(out[i].Budgets, want) {
							rt.Fatalf("concurrent grant drew from %v, want %v", out[i].Budgets, want)
						}
						record(fmt.Sprintf("%s%d", holder, i), out[i])
						checkValidity("concurrent issue", out[i])
						count("issued concurrently")
						drawn = append(drawn, out[i].Budgets...)
					case errors.As(errs[i], &notExact), errors.As(errs[i], &exhausted):
					default:
						rt.Fatalf("concurrent issue: %v", errs[i])
					}
				}
				checkWithin("concurrent issue", drawn)
			},
			"renew": func(rt *rapid.T) {
				live := liveGrants()
				if len(live) == 0 {
					return
				}
				g := rapid.SampledFrom(live).Draw(rt, "grant")
				spent := decimal.NewFromInt(rapid.Int64Range(g.spent.IntPart(), g.g.Amount.IntPart()).Draw(rt, "spent"))
				r, err := e.store.Renew(ctx, admission.Report{Grant: g.g.ID, Holder: g.holder, Generation: 1, Spent: spent,
					TTL: time.Duration(rapid.IntRange(5, 600).Draw(rt, "ttl seconds")) * time.Second})
				if err != nil {
					rt.Fatalf("renew: %v", err)
				}
				// A renewal that extends the grant never passes a period it
				// draws from (a grant counted by a budget after it was issued
				// keeps the validity it had).
				if r.ValidUntil.After(g.g.ValidUntil) {
					checkValidity("renew", r)
				}
				g.spent, g.g.ValidUntil, g.g.ReclaimAt = spent, r.ValidUntil, r.ReclaimAt
				count("renewed")
			},
			"release": func(rt *rapid.T) {
				live := liveGrants()
				if len(live) == 0 {
					return
				}
				g := rapid.SampledFrom(live).Draw(rt, "grant")
				spent := decimal.NewFromInt(rapid.Int64Range(g.spent.IntPart(), g.g.Amount.IntPart()).Draw(rt, "spent"))
				if _, err := e.store.Release(ctx, admission.Report{Grant: g.g.ID, Holder: g.holder, Generation: 1, Spent: spent}); err != nil {
					rt.Fatalf("release: %v", err)
				}
				now := e.clock.Now()
				g.released, g.spent = &now, spent
				count("released")
			},
		})
	})
}
