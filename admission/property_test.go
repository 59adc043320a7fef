package admission_test

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/shopspring/decimal"
	"pgregory.net/rapid"

	"github.com/tally-ledger/tally/admission"
)

// model is what the protocol promises, tracked independently of the store.
type modelGrant struct {
	id         uuid.UUID
	holder     string
	generation int64
	amount     decimal.Decimal
	spent      decimal.Decimal
	reclaimAt  time.Time
	released   bool
}

type model struct {
	limit    decimal.Decimal
	ceiling  decimal.Decimal  // max(limit, consumed when the limit was last lowered)
	holders  map[string]int64 // newest generation each holder uses
	server   map[string]int64 // newest generation the store has seen
	grants   []*modelGrant
	customer string
}

func (m *model) consumed() decimal.Decimal {
	c := decimal.Zero
	for _, g := range m.grants {
		if g.released {
			c = c.Add(g.spent)
		} else {
			c = c.Add(g.amount)
		}
	}
	return c
}

func (m *model) available() decimal.Decimal {
	return decimal.Max(decimal.Zero, m.limit.Sub(m.consumed()))
}

// TestIssuingProperty runs random interleavings of issue (sequential and
// concurrent), debits (and debits sent again), renew, release, expiry,
// holder restarts and rule changes
// across many holders, and checks after every step that the store's
// consumed equals Σ amount of unreleased grants + Σ spent of released ones,
// that it never exceeds the limit (or, after a lowering, what was already
// consumed), and that no request was refused while it fitted. At the end
// everyone releases and exactly limit - consumed can be granted again.
func TestIssuingProperty(t *testing.T) {
	e := newEnv(t)
	ctx := context.Background()
	meter := "tokens"
	var n int
	rapid.Check(t, func(rt *rapid.T) {
		n++
		m := &model{customer: fmt.Sprintf("c%d", n), holders: map[string]int64{}, server: map[string]int64{}}
		m.limit = decimal.New(rapid.Int64Range(0, 20000).Draw(rt, "limit"), -2)
		m.ceiling = m.limit
		e.rule(m.customer, meter, m.limit)
		// Holder ids are global: each iteration has its own.
		var holders []string
		for i := range 6 {
			holders = append(holders, fmt.Sprintf("%s-gw%d", m.customer, i))
		}
		for _, h := range holders {
			m.holders[h] = 1
		}
		genAmount := rapid.Custom(func(rt *rapid.T) decimal.Decimal {
			return decimal.New(rapid.Int64Range(1, 6000).Draw(rt, "cents"), -2)
		})

		check := func(step string) {
			b := e.budgetOrZero(m.customer, meter)
			want := m.consumed()
			if !b.Consumed.Equal(want) {
				rt.Fatalf("%s: store consumed %s, model %s", step, b.Consumed, want)
			}
			if b.Consumed.GreaterThan(m.ceiling) {
				rt.Fatalf("%s: consumed %s above limit %s (ceiling %s)", step, b.Consumed, m.limit, m.ceiling)
			}
		}
		issueOne := func(holder string, gen int64, amt decimal.Decimal, min decimal.NullDecimal) (admission.Grant, error) {
			return e.store.Issue(ctx, admission.IssueRequest{Holder: holder, Generation: gen, Customer: m.customer,
				Meter: meter, Amount: amt, MinAmount: min, TTL: 30 * time.Second})
		}
		record := func(g admission.Grant) {
			m.grants = append(m.grants, &modelGrant{id: g.ID, holder: g.Holder, generation: g.Generation,
				amount: g.Amount, spent: decimal.Zero, reclaimAt: g.ReclaimAt})
			if g.Generation > m.server[g.Holder] {
				m.server[g.Holder] = g.Generation
			}
		}
		var debits []admission.DebitRequest
		live := func() []*modelGrant {
			var out []*modelGrant
			now := e.clock.Now()
			for _, g := range m.grants {
				if !g.released && now.Before(g.reclaimAt) {
					out = append(out, g)
				}
			}
			return out
		}

		rt.Repeat(map[string]func(*rapid.T){
			"issue": func(rt *rapid.T) {
				h := rapid.SampledFrom(holders).Draw(rt, "holder")
				amt := genAmount.Draw(rt, "amount")
				var min decimal.NullDecimal
				if rapid.Bool().Draw(rt, "with_min") {
					min = decimal.NewNullDecimal(decimal.Min(amt, genAmount.Draw(rt, "min")))
				}
				avail := m.available()
				g, err := issueOne(h, m.holders[h], amt, min)
				switch {
				case avail.GreaterThanOrEqual(amt):
					if err != nil || !g.Amount.Equal(amt) {
						rt.Fatalf("issue %s with %s available: %+v %v", amt, avail, g, err)
					}
					record(g)
				case min.Valid && avail.GreaterThanOrEqual(min.Decimal):
					if err != nil || !g.Amount.Equal(avail) {
						rt.Fatalf("issue %s min %s with %s available: %+v %v", amt, min.Decimal, avail, g, err)
					}
					record(g)
				default:
					ex, ok := errors.AsType[*admission.BudgetExhaustedError](err)
					if !ok || !ex.Available.Equal(avail) {
						rt.Fatalf("issue %s with %s available: want budget_exhausted, got %+v %v", amt, avail, g, err)
					}
				}
				check("issue")
			},
			"concurrent issue": func(rt *rapid.T) {
				k := rapid.IntRange(2, len(holders)).Draw(rt, "holders")
				amts := make([]decimal.Decimal, k)
				for i := range amts {
					amts[i] = genAmount.Draw(rt, "amount")
				}
				before := m.available()
				grants := make([]admission.Grant, k)
				errs := make([]error, k)
				var wg sync.WaitGroup
				for i := range k {
					wg.Go(func() {
						grants[i], errs[i] = issueOne(holders[i], m.holders[holders[i]], amts[i], decimal.NullDecimal{})
					})
				}
				wg.Wait()
				granted := decimal.Zero
				for i := range k {
					if errs[i] == nil {
						granted = granted.Add(grants[i].Amount)
						record(grants[i])
					} else if _, ok := errors.AsType[*admission.BudgetExhaustedError](errs[i]); !ok {
						rt.Fatalf("concurrent issue: %v", errs[i])
					}
				}
				if granted.GreaterThan(before) {
					rt.Fatalf("concurrent issues granted %s with %s available", granted, before)
				}
				// Available only shrank during the batch: a refused request
				// that fits what is left now was refused wrongly.
				after := m.available()
				for i := range k {
					if errs[i] != nil && amts[i].LessThanOrEqual(after) {
						rt.Fatalf("refused %s while %s stayed available", amts[i], after)
					}
				}
				check("concurrent issue")
			},
			"debit": func(rt *rapid.T) {
				h := rapid.SampledFrom(holders).Draw(rt, "holder")
				amt := genAmount.Draw(rt, "amount")
				req := admission.DebitRequest{ID: uuid.New(), Holder: h, Generation: m.holders[h], Customer: m.customer,
					Meter: meter, Amount: amt}
				avail := m.available()
				g, err := e.store.Debit(ctx, req)
				if avail.GreaterThanOrEqual(amt) {
					if err != nil || !g.Amount.Equal(amt) || !g.Spent.Equal(amt) || g.EndReason != "released" {
						rt.Fatalf("debit %s with %s available: %+v %v", amt, avail, g, err)
					}
					record(g)
					m.grants[len(m.grants)-1].spent, m.grants[len(m.grants)-1].released = amt, true
					debits = append(debits, req)
				} else if ex, ok := errors.AsType[*admission.BudgetExhaustedError](err); !ok || !ex.Available.Equal(avail) {
					rt.Fatalf("debit %s with %s available: want budget_exhausted, got %+v %v", amt, avail, g, err)
				}
				check("debit")
			},
			"debit sent again": func(rt *rapid.T) {
				if len(debits) == 0 {
					return // nothing debited yet: the step is a no-op
				}
				req := rapid.SampledFrom(debits).Draw(rt, "debit")
				g, err := e.store.Debit(ctx, req)
				if err != nil || g.ID != req.ID || !g.Spent.Equal(req.Amount) {
					rt.Fatalf("debit %s sent again: %+v %v, want the debit stored", req.ID, g, err)
				}
				check("debit sent again")
			},
			"renew": func(rt *rapid.T) {
				if len(m.grants) == 0 {
					return // nothing to report on yet: the step is a no-op
				}
				g := rapid.SampledFrom(m.grants).Draw(rt, "grant")
				spent := decimal.Min(g.amount, g.spent.Add(genAmount.Draw(rt, "more")))
				got, err := e.store.Renew(ctx, admission.Report{Grant: g.id, Holder: g.holder, Generation: g.generation,
					Spent: spent, TTL: 30 * time.Second})
				expectReport(rt, m, g, err, e.clock.Now(), false)
				if err == nil {
					g.spent, g.reclaimAt = spent, got.ReclaimAt
				}
				check("renew")
			},
			"release": func(rt *rapid.T) {
				if len(m.grants) == 0 {
					return // nothing to report on yet: the step is a no-op
				}
				g := rapid.SampledFrom(m.grants).Draw(rt, "grant")
				spent := decimal.Min(g.amount, g.spent.Add(genAmount.Draw(rt, "more")))
				_, err := e.store.Release(ctx, admission.Report{Grant: g.id, Holder: g.holder, Generation: g.generation, Spent: spent})
				late := !g.released && !e.clock.Now().Before(g.reclaimAt)
				expectReport(rt, m, g, err, e.clock.Now(), true)
				switch {
				case err == nil && late:
					g.spent = spent // recorded; the grant stays counted fully spent
				case err == nil:
					g.spent, g.released = spent, true
				}
				check("release")
			},
			"time passes": func(rt *rapid.T) {
				e.clock.Advance(time.Duration(rapid.Int64Range(0, 40_000).Draw(rt, "ms")) * time.Millisecond)
				check("time passes")
			},
			"holder restarts": func(rt *rapid.T) {
				h := rapid.SampledFrom(holders).Draw(rt, "holder")
				m.holders[h]++
			},
			"rule changes": func(rt *rapid.T) {
				e.clock.Advance(time.Millisecond)
				limit := decimal.New(rapid.Int64Range(0, 20000).Draw(rt, "limit"), -2)
				e.rule(m.customer, meter, limit)
				m.limit = limit
				m.ceiling = decimal.Max(limit, m.consumed())
				check("rule changes")
			},
			"": func(rt *rapid.T) { check("between steps") },
		})

		// Everyone still able to release does; then exactly limit - consumed
		// (Σ spent of released grants + Σ amount of the rest) is available.
		for _, g := range live() {
			if m.server[g.holder] == g.generation {
				if _, err := e.store.Release(ctx, admission.Report{Grant: g.id, Holder: g.holder, Generation: g.generation, Spent: g.spent}); err != nil {
					rt.Fatalf("final release: %v", err)
				}
				g.released = true
			}
		}
		check("final release")
		avail := m.available()
		if avail.IsPositive() {
			g, err := issueOne(m.customer+"-final", 1, avail, decimal.NullDecimal{})
			if err != nil {
				rt.Fatalf("%s should be available again: %v", avail, err)
			}
			record(g)
		}
		if _, err := issueOne(m.customer+"-final", 1, decimal.New(1, -2), decimal.NullDecimal{}); err == nil {
			rt.Fatalf("more than limit - consumed (%s) was available", avail)
		}
		check("final")
	})
}

// expectReport checks the store's answer to a renew or release of g. A
// release from the grant's own holder and generation after its reclaim is
// a late final report: accepted, whatever the holder's newest generation.
func expectReport(rt *rapid.T, m *model, g *modelGrant, err error, now time.Time, release bool) {
	switch {
	case release && !g.released && !now.Before(g.reclaimAt):
		if err != nil {
			rt.Fatalf("late final report: %v", err)
		}
	case m.server[g.holder] > g.generation:
		if _, ok := errors.AsType[*admission.StaleGenerationError](err); !ok {
			rt.Fatalf("report from an older generation: %v", err)
		}
	case g.released || !now.Before(g.reclaimAt):
		if _, ok := errors.AsType[*admission.GrantEndedError](err); !ok {
			rt.Fatalf("report on an ended grant: %v", err)
		}
	default:
		if err != nil {
			rt.Fatalf("report on a live grant: %v", err)
		}
	}
}
