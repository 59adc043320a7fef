package admission_test

import (
	"context"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/shopspring/decimal"
	"pgregory.net/rapid"

	"github.com/tally-ledger/tally/admission"
)

// rateVersion is one rate rule version as the test wrote it.
type rateVersion struct {
	at            time.Time
	amount, burst decimal.Decimal
	per           time.Duration
}

// rateGrant is a grant as the test saw it: it may admit from taken (when
// Postgres took its tokens) until until + skew, its final spent (its
// amount while no final report came).
type rateGrant struct {
	id       uuid.UUID
	holder   string
	gen      int64
	amount   decimal.Decimal
	admitted decimal.Decimal
	released bool
}

// TestRateBoundProperty runs random interleavings of issue (alone and by
// concurrent holders), renew, release, expiry, holder restarts and rule
// changes (burst lowered and raised, the rate changed at a future instant)
// on one customer's rate budget, with Postgres's clock the only clock, and
// checks the §17 bound: for every window [t1, t2], Σ what every grant that
// may admit in it admitted ≤ the largest burst in force + the refill over
// [t1 − ttl − max_skew, t2] at the rates in force. And a new rule version
// never refills the bucket.
func TestRateBoundProperty(t *testing.T) {
	e := rateEnv(t)
	ctx := context.Background()
	const skew = 100 * time.Millisecond
	n := 0
	rapid.Check(t, func(rt *rapid.T) {
		n++
		customer := fmt.Sprintf("c%d", n)
		scope := "customer:" + customer
		var versions []rateVersion
		put := func(amount, burst string, per time.Duration, at time.Time) {
			e.t = t
			e.rateRule(scope, "calls", amount, per.String(), burst, skew, at)
			versions = append(versions, rateVersion{at: at, amount: d(amount), burst: d(burst), per: per})
		}
		// A slow rate (the bound is the burst, tight) or a fast one.
		per := rapid.SampledFrom([]time.Duration{time.Hour, 100 * time.Millisecond}).Draw(rt, "per")
		start := pgNow(t, e)
		put("1", rapid.SampledFrom([]string{"3", "5", "10"}).Draw(rt, "burst"), per, start)
		gens := map[string]int64{"h1": 1, "h2": 1, "h3": 1}
		var mu sync.Mutex
		var grants []*rateGrant
		issue := func(holder string, gen int64, amount string) {
			g, err := e.store.Issue(ctx, admission.IssueRequest{Holder: holder, Generation: gen, Customer: customer,
				Meter: "calls", Amount: d(amount), MinAmount: decimal.NewNullDecimal(d("1"))})
			if err != nil {
				return // refused (or fenced): nothing taken
			}
			mu.Lock()
			grants = append(grants, &rateGrant{id: g.ID, holder: holder, gen: gen, amount: g.Amount, admitted: g.Amount})
			mu.Unlock()
		}
		steps := rapid.IntRange(4, 14).Draw(rt, "steps")
		for range steps {
			holder := rapid.SampledFrom([]string{"h1", "h2", "h3"}).Draw(rt, "holder")
			switch rapid.IntRange(0, 7).Draw(rt, "op") {
			case 0, 1:
				issue(holder, gens[holder], rapid.SampledFrom([]string{"1", "2", "4"}).Draw(rt, "amount"))
			case 2: // concurrent holders
				var wg sync.WaitGroup
				for h, g := range gens {
					wg.Add(1)
					go func() { defer wg.Done(); issue(h, g, "2") }()
				}
				wg.Wait()
			case 3, 4: // release, or renew, a live grant with some spent
				var live []*rateGrant
				for _, g := range grants {
					if !g.released && g.gen == gens[g.holder] {
						live = append(live, g)
					}
				}
				if len(live) == 0 {
					continue
				}
				g := rapid.SampledFrom(live).Draw(rt, "grant")
				spent := g.amount.Mul(decimal.NewFromInt(int64(rapid.IntRange(0, 2).Draw(rt, "half")))).Div(decimal.NewFromInt(2)).Floor()
				r := admission.Report{Grant: g.id, Holder: g.holder, Generation: g.gen, Spent: spent}
				if rapid.Bool().Draw(rt, "renew") {
					before, err := e.store.Get(ctx, g.id)
					if err != nil {
						t.Fatal(err)
					}
					if after, err := e.store.Renew(ctx, r); err == nil && after.ValidUntil.After(before.ValidUntil) {
						t.Fatalf("renew extended a rate grant from %v to %v", before.ValidUntil, after.ValidUntil)
					}
					continue
				}
				if _, err := e.store.Release(ctx, r); err == nil {
					g.released, g.admitted = true, spent
				}
			case 5: // expiry: let time pass
				time.Sleep(time.Duration(rapid.IntRange(10, 150).Draw(rt, "sleep")) * time.Millisecond)
			case 6: // the holder restarts: its grants count fully spent
				gens[holder]++
			case 7: // a rule change: burst lowered or raised, or the rate changed at a future instant
				tok0, t0 := tokensAt(t, e, scope)
				burst := rapid.SampledFrom([]string{"2", "4", "12"}).Draw(rt, "newBurst")
				at := time.Time{}
				if rapid.Bool().Draw(rt, "future") {
					at = time.Now().Add(time.Duration(rapid.IntRange(20, 200).Draw(rt, "in")) * time.Millisecond)
				}
				newPer := rapid.SampledFrom([]time.Duration{time.Hour, 100 * time.Millisecond}).Draw(rt, "newPer")
				put("1", burst, newPer, at)
				if at.IsZero() {
					versions[len(versions)-1].at = pgNow(t, e) // effective by now: an upper bound of its instant
				}
				tok1, t1 := tokensAt(t, e, scope)
				// The new version never refills: at most what the bucket
				// held plus the refill since, at the fastest rate any
				// version may have in force over [t0, t1] (an earlier
				// version is still in force while a later one waits for
				// its future instant).
				var maxRefill decimal.Decimal
				for _, v := range versions {
					if r := refill(v, t1.Sub(t0)); r.GreaterThan(maxRefill) {
						maxRefill = r
					}
				}
				if tok1.GreaterThan(tok0.Add(maxRefill)) {
					t.Fatalf("a rule version refilled the bucket: %s before, %s after (refill at most %s)", tok0, tok1, maxRefill)
				}
			}
		}
		checkRateBound(t, e, grants, versions, skew)
	})
}

func pgNow(t *testing.T, e *env) time.Time {
	var now time.Time
	if err := e.pool.QueryRow(context.Background(), `SELECT now()`).Scan(&now); err != nil {
		t.Fatal(err)
	}
	return now
}

// tokensAt is the bucket's tokens refilled to Postgres's now, and that now.
func tokensAt(t *testing.T, e *env, scope string) (decimal.Decimal, time.Time) {
	var s *string
	var now time.Time
	err := pgx.BeginFunc(context.Background(), e.pool, func(tx pgx.Tx) error {
		return tx.QueryRow(context.Background(), `SELECT admission_rate_refill($1, 'calls', now())::text, now()`, scope).Scan(&s, &now)
	})
	if err != nil {
		t.Fatal(err)
	}
	if s == nil {
		return decimal.Decimal{}, now // no bucket yet: nothing taken
	}
	return decimal.RequireFromString(*s), now
}

func refill(v rateVersion, d time.Duration) decimal.Decimal {
	return v.amount.Mul(decimal.NewFromInt(d.Microseconds())).Div(decimal.NewFromInt(v.per.Microseconds()))
}

// checkRateBound checks the §17 bound over every window whose ends are
// grants' first and last instants of admitting.
func checkRateBound(t *testing.T, e *env, grants []*rateGrant, versions []rateVersion, skew time.Duration) {
	if len(grants) == 0 {
		return
	}
	type span struct {
		from, to time.Time
		admitted decimal.Decimal
	}
	spans := make([]span, 0, len(grants))
	var ttl time.Duration
	for _, g := range grants {
		var taken, until time.Time
		if err := e.pool.QueryRow(context.Background(), `SELECT taken_at, until FROM admission_rate_draws WHERE grant_id = $1`, g.id).Scan(&taken, &until); err != nil {
			t.Fatal(err)
		}
		ttl = max(ttl, until.Sub(taken))
		spans = append(spans, span{taken, until.Add(skew), g.admitted})
	}
	ttl = max(ttl, admission.DefaultRateTTL)
	for _, a := range spans {
		for _, b := range spans {
			t1, t2 := a.from, b.to
			if t2.Before(t1) {
				continue
			}
			sum := decimal.Zero
			for _, s := range spans {
				if !s.to.Before(t1) && !s.from.After(t2) {
					sum = sum.Add(s.admitted)
				}
			}
			bound := rateBound(versions, t1.Add(-ttl-skew), t2)
			if sum.GreaterThan(bound) {
				t.Fatalf("window [%s, %s]: admitted %s > bound %s (versions %+v)", t1.Format(time.StampMicro), t2.Format(time.StampMicro), sum, bound, versions)
			}
		}
	}
}

// rateBound is the largest burst in force over [from, to] plus the refill
// over it at the rates in force (piecewise over the versions).
func rateBound(versions []rateVersion, from, to time.Time) decimal.Decimal {
	burst, total := decimal.Zero, decimal.Zero
	for i, v := range versions {
		end := to
		if i+1 < len(versions) && versions[i+1].at.Before(end) {
			end = versions[i+1].at
		}
		begin := v.at
		if begin.Before(from) {
			begin = from
		}
		if i+1 < len(versions) && !versions[i+1].at.After(from) {
			continue // superseded before the window
		}
		if v.burst.GreaterThan(burst) {
			burst = v.burst
		}
		if end.After(begin) {
			total = total.Add(refill(v, end.Sub(begin)).Ceil())
		}
	}
	return burst.Add(total)
}
