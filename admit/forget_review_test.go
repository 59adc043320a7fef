package admit_test

import (
	"context"
	"fmt"
	"math/rand/v2"
	"net/http"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/shopspring/decimal"

	"github.com/tally-ledger/tally/admission"
	"github.com/tally-ledger/tally/admit"
	"github.com/tally-ledger/tally/quota"
)

// admissionSeries reads every series of tally_admit_admissions_total.
func admissionSeries(t *testing.T, reg *prometheus.Registry) map[string]float64 {
	t.Helper()
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	out := map[string]float64{}
	for _, mf := range mfs {
		if mf.GetName() != "tally_admit_admissions_total" {
			continue
		}
		for _, m := range mf.GetMetric() {
			var ls []string
			for _, l := range m.GetLabel() {
				ls = append(ls, l.GetName()+"="+l.GetValue())
			}
			out[strings.Join(ls, ",")] = m.GetCounter().GetValue()
		}
	}
	return out
}

// A scrape while budgets are forgotten sees every counter where it was or
// further: a forgotten budget's counts move to the client's own at once,
// never missing from one scrape (Prometheus reads a counter that went
// back as a restart, and a rate over it as a burst of every admission
// since the start).
func TestCountersNeverGoBackWhileBudgetsAreForgotten(t *testing.T) {
	ts := startTally(t)
	reg := prometheus.NewRegistry()
	c := newClient(t, ts, "gw1", t.TempDir(), admit.Config{Registerer: reg,
		ForgetAfter: time.Millisecond, Tick: 10 * time.Millisecond})
	defer c.Close(context.Background())
	ctx := context.Background()
	stop := make(chan struct{})
	var wg sync.WaitGroup
	wg.Go(func() {
		// Meters without a rule: each customer's second Admit is counted
		// in its budget, then forgotten a tick later.
		for i := 0; ; i++ {
			select {
			case <-stop:
				return
			default:
			}
			customer := fmt.Sprint("c-", i%400)
			for range 3 {
				if _, err := c.Admit(ctx, customer, "tokens", 1); err != nil {
					t.Error(err)
					return
				}
			}
		}
	})
	last := map[string]float64{}
	deadline := time.Now().Add(3 * time.Second)
	scrapes := 0
	for time.Now().Before(deadline) && !t.Failed() {
		now := admissionSeries(t, reg)
		for k, v := range now {
			if v < last[k] {
				t.Errorf("scrape %d: %s went back from %v to %v", scrapes, k, last[k], v)
			}
			last[k] = v
		}
		scrapes++
	}
	close(stop)
	wg.Wait()
	forgotten, err := metricValue(reg, "tally_admit_budgets_forgotten_total", "")
	if err != nil {
		t.Fatal(err)
	}
	if !t.Failed() && forgotten < 100 {
		t.Fatalf("only %v budgets forgotten: the race was not run", forgotten)
	}
	t.Logf("%d scrapes, %v budgets forgotten, %v", scrapes, forgotten, last)
}

// Forgetting races Admits on every kind of exact budget at once: one
// near its end (tight: debits, refusals remembered), one on a rate
// contract (short grants, never renewed), one roomy (grants given back
// when idle for half a TTL). Budgets are forgotten after a millisecond
// unused and grants last a second, so all of it happens in the run.
// Nothing is admitted past a limit or a bucket, and once the gateways
// close, Tally's consumed is what they admitted and nothing is live.
func TestForgettingRacesTightAndRateBudgets(t *testing.T) {
	ts := startTally(t)
	const tightLimit, burst = 200, 200
	ts.exactRule("tight", "tokens", fmt.Sprint(tightLimit))
	ts.exactRule("roomy", "tokens", "100000")
	// 1 per hour, bursts of 200: the refill during the test is below 0.01.
	ts.rule(quota.RuleInput{Customer: "rate", Meter: "tokens", Admission: quota.Exact,
		Rate: &quota.Rate{Amount: decimal.NewFromInt(1), Per: quota.DurationText(time.Hour), Burst: decimal.NewFromInt(burst)}})
	ctx := context.Background()
	regs := []*prometheus.Registry{prometheus.NewRegistry(), prometheus.NewRegistry()}
	var clients []*admit.Client
	for i, reg := range regs {
		clients = append(clients, newClient(t, ts, fmt.Sprint("gw", i), t.TempDir(), admit.Config{Registerer: reg,
			ForgetAfter: time.Millisecond, Tick: 10 * time.Millisecond, GrantTTL: time.Second, Lookahead: 100 * time.Millisecond, MinGrant: 3}))
	}
	customers := []string{"tight", "roomy", "rate"}
	admitted := map[string]*atomic.Int64{}
	for _, cu := range customers {
		admitted[cu] = &atomic.Int64{}
	}
	var wg sync.WaitGroup
	deadline := time.Now().Add(3 * time.Second)
	for _, c := range clients {
		for _, customer := range customers {
			wg.Go(func() {
				for time.Now().Before(deadline) {
					cost := 1 + int64(rand.IntN(2))
					d, err := c.Admit(ctx, customer, "tokens", cost)
					if err != nil {
						t.Error(err)
						return
					}
					if d.Admitted {
						admitted[customer].Add(cost)
					}
					if d.Admitted && d.How != admit.FromGrant && d.How != admit.Debited {
						t.Errorf("%s admitted by %v", customer, d.How)
					}
					// Mostly short pauses, now and then long enough for
					// grants to go back and the budget to be forgotten.
					pause := time.Duration(2+rand.IntN(10)) * time.Millisecond
					if rand.IntN(20) == 0 {
						pause = time.Duration(rand.IntN(700)) * time.Millisecond
					}
					time.Sleep(pause)
				}
			})
		}
	}
	wg.Wait()
	forgotten := closeForgotten(t, ctx, regs, clients)
	for _, cu := range []string{"tight", "roomy"} {
		b := ts.budget(cu, "tokens")
		if n := admitted[cu].Load(); !b.Consumed.Equal(decimal.NewFromInt(n)) || !b.Live.IsZero() {
			t.Errorf("%s: admitted %d, budget %+v", cu, n, b)
		}
	}
	if n := admitted["tight"].Load(); n > tightLimit {
		t.Errorf("tight: admitted %d past its limit of %d", n, tightLimit)
	}
	s, err := admission.New(ts.pool, admission.Config{})
	if err != nil {
		t.Fatal(err)
	}
	bs, err := s.RateBudgetsOf(ctx, "rate")
	if err != nil || len(bs) != 1 {
		t.Fatalf("rate budgets %v %+v", err, bs)
	}
	// Everything unspent went back: the bucket holds burst − admitted
	// (plus a refill below 0.01), nothing is live or stranded.
	n := admitted["rate"].Load()
	want := decimal.NewFromInt(burst - n)
	if b := bs[0]; n > burst || b.Tokens.LessThan(want) || b.Tokens.GreaterThan(want.Add(decimal.RequireFromString("0.01"))) || !b.Live.IsZero() || !b.Stranded.IsZero() {
		t.Errorf("rate: admitted %d, after close %+v, want %s tokens", n, b, want)
	}
	t.Logf("forgotten %v times; admitted %d tight, %d roomy, %d rate", forgotten, admitted["tight"].Load(), admitted["roomy"].Load(), n)
}

// While Tally is unreachable, a budget whose on_unreachable local
// allowance admitted in a window that has not ended is not forgotten:
// forgotten, its next Admit would start a new window, and a customer
// pausing between requests would be admitted LocalAmount per pause.
// Budgets of the same gateway are forgotten meanwhile (one whose only
// request is larger than the allowance, so it admitted nothing).
func TestForgettingKeepsTheLocalAllowanceWindow(t *testing.T) {
	ts := startTally(t)
	reg := prometheus.NewRegistry()
	c := newClient(t, ts, "gw1", t.TempDir(), admit.Config{Registerer: reg, ForgetAfter: time.Millisecond,
		Tick: 10 * time.Millisecond, OnUnreachable: admit.Local, LocalAmount: 5, LocalEvery: time.Hour})
	defer c.Close(context.Background())
	ts.down.Store(true)
	ctx := context.Background()
	bypassed := 0
	for i := range 40 {
		d, err := c.Admit(ctx, "acme", "tokens", 1)
		if err != nil {
			t.Fatal(err)
		}
		if d.Admitted {
			bypassed++
		}
		if _, err := c.Admit(ctx, fmt.Sprint("big-", i), "tokens", 6); err != nil {
			t.Fatal(err)
		}
		time.Sleep(30 * time.Millisecond) // three ticks unused
	}
	if bypassed != 5 {
		t.Errorf("acme admitted %d times by its local allowance of 5 an hour", bypassed)
	}
	if v, err := metricValue(reg, "tally_admit_budgets_forgotten_total", ""); err != nil || v < 20 {
		t.Errorf("forgotten %v (%v): the budgets admitting nothing were not forgotten while Tally was down", v, err)
	}
}

// A grant request outlives the Admit that started it (the caller's
// context ended first): its budget, unused meanwhile, is kept until the
// grant arrives, so the grant is held where the loop and Close find it.
// Forgotten in between, the grant would land in a budget no one tends:
// never renewed, given back or released at Close (live until it
// expired, its capacity refused to every gateway meanwhile).
func TestAGrantArrivingAfterItsAdmitIsNotOrphaned(t *testing.T) {
	ts := startTally(t)
	ts.exactRule("acme", "tokens", "1000")
	reg := prometheus.NewRegistry()
	c := newClient(t, ts, "gw1", t.TempDir(), admit.Config{Registerer: reg, ForgetAfter: time.Millisecond,
		Tick: 10 * time.Millisecond, GrantTTL: 10 * time.Second})
	slow := func(r *http.Request) int {
		if r.URL.Path == "/v1/grants" {
			time.Sleep(300 * time.Millisecond) // thirty ticks
		}
		return 0
	}
	ts.refuse.Store(&slow)
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Millisecond)
	defer cancel()
	if d, err := c.Admit(ctx, "acme", "tokens", 1); err != nil || d.Admitted {
		t.Fatalf("admit before the grant came: %+v %v, want refused by on_unreachable (deny)", d, err)
	}
	eventually(t, "the grant issued", func() bool { return !ts.budget("acme", "tokens").Live.IsZero() })
	ts.refuse.Store(nil)
	time.Sleep(50 * time.Millisecond) // five ticks: the budget holds it, unused
	if v, err := metricValue(reg, "tally_admit_grants_held", ""); err != nil || v != 1 {
		t.Errorf("grants held %v (%v), want the one that arrived", v, err)
	}
	if err := c.Close(context.Background()); err != nil {
		t.Fatal(err)
	}
	if b := ts.budget("acme", "tokens"); !b.Live.IsZero() || !b.Consumed.IsZero() {
		t.Fatalf("after Close: %+v, want nothing live or consumed", b)
	}
}
