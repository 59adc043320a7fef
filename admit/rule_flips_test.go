package admit_test

import (
	"context"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/shopspring/decimal"

	"github.com/tally-ledger/tally/admit"
	"github.com/tally-ledger/tally/quota"
)

// fleet is several gateways admitting one customer's meter concurrently,
// metering every request they admit (as a gateway's producer would), and
// counting how each was admitted.
type fleet struct {
	t        *testing.T
	p        *pipeline
	customer string
	meter    string
	clients  []*admit.Client
	meterMu  sync.Mutex // the test ledger's streams want records in order
	metered  atomic.Int64
	byHow    [16]atomic.Int64
	admitted [16]atomic.Int64 // by how
	// from (unix nanos, 0: not yet) starts a count of the admissions of
	// Admits begun from then on, by how: an Admit begun before may be
	// metered after (a worker waits for meterMu), and is not counted.
	from       atomic.Int64
	since      atomic.Int64
	sinceByHow [16]atomic.Int64
	stop       chan struct{}
	done       sync.WaitGroup
	errs       chan error
}

func startFleet(t *testing.T, ts *tally, p *pipeline, customer, meter string, gateways, workers int) *fleet {
	f := &fleet{t: t, p: p, customer: customer, meter: meter, stop: make(chan struct{}), errs: make(chan error, 100)}
	for g := range gateways {
		c := newClient(t, ts, fmt.Sprintf("gw%d", g), t.TempDir(), admit.Config{Brokers: p.brokers, MinGrant: 5})
		f.clients = append(f.clients, c)
		for range workers {
			f.done.Add(1)
			go f.work(c)
		}
	}
	return f
}

func (f *fleet) work(c *admit.Client) {
	defer f.done.Done()
	for {
		select {
		case <-f.stop:
			return
		default:
		}
		begun := time.Now().UnixNano()
		d, err := c.Admit(context.Background(), f.customer, f.meter, 1)
		if err != nil {
			f.errs <- err
			return
		}
		if d.Admitted {
			f.meterMu.Lock()
			f.p.use(f.customer, f.meter, 1)
			f.metered.Add(1)
			f.admitted[d.How].Add(1)
			if from := f.from.Load(); from != 0 && begun >= from {
				f.since.Add(1)
				f.sinceByHow[d.How].Add(1)
			}
			f.meterMu.Unlock()
		}
		f.byHow[d.How].Add(1)
		time.Sleep(2 * time.Millisecond)
	}
}

func (f *fleet) close() {
	close(f.stop)
	f.done.Wait()
	for _, c := range f.clients {
		if err := c.Close(context.Background()); err != nil {
			f.t.Error(err)
		}
	}
	select {
	case err := <-f.errs:
		f.t.Fatal(err)
	default:
	}
}

// A customer's rule flips exact → lagged → exact while three gateways
// admit concurrently, and every request admitted is metered. Exact
// admission never admits past the limit in force: the metered total stays
// within it after each change, whatever the gateways admitted from the
// lagged decisions in between (turning exact counts the period's usage).
func TestRuleFlipsExactLaggedExactUnderLoad(t *testing.T) {
	ts := startTally(t)
	p := ts.startPipeline()
	p.follow()
	ts.exactRule("acme", "tokens", "100")
	f := startFleet(t, ts, p, "acme", "tokens", 3, 2)
	defer f.close()

	eventually(t, "the exact budget spent", func() bool { return f.byHow[admit.Exhausted].Load() > 20 })
	if m := f.metered.Load(); m > 100 {
		t.Fatalf("exact 100: %d admitted", m)
	}
	t0 := time.Now()
	ts.rule(quota.RuleInput{Customer: "acme", Meter: "tokens", Limit: decimal.NewFromInt(100)}) // lagged, exceeded
	before := f.byHow[admit.FromDecision].Load()
	eventually(t, "answers from the lagged decision", func() bool { return f.byHow[admit.FromDecision].Load() > before+20 })
	t.Logf("exact → lagged converged in %v", time.Since(t0))
	eventually(t, "grants given back", func() bool { return ts.budget("acme", "tokens").Live.IsZero() })
	// Lagged admission may overshoot by the decisions' lag
	// (docs/gateways.md); turning exact again counts it.
	t.Logf("lagged 100 after exact 100: %d admitted", f.metered.Load())

	t0 = time.Now()
	ts.exactRule("acme", "tokens", "150")
	before = f.byHow[admit.Exhausted].Load()
	eventually(t, "the exact budget spent again", func() bool { return f.byHow[admit.Exhausted].Load() > before+20 })
	t.Logf("lagged → exact converged in %v", time.Since(t0))
	if m := f.metered.Load(); m > 150 {
		t.Fatalf("exact 150 after lagged: %d admitted (by how: grant %d, debit %d, decision %d)", m,
			f.admitted[admit.FromGrant].Load(), f.admitted[admit.Debited].Load(), f.admitted[admit.FromDecision].Load())
	}

	// Raised, then lowered below consumed: no new grant after the lowering.
	ts.exactRule("acme", "tokens", "300")
	base := f.metered.Load()
	eventually(t, "admitting under the raised limit", func() bool { return f.metered.Load() > base+30 })
	ts.exactRule("acme", "tokens", "160")
	// Grants and debits decided before the change may still commit; once
	// refusals come, consumed no longer grows and nothing more is admitted
	// than it counts.
	before = f.byHow[admit.Exhausted].Load()
	eventually(t, "refusals under the lowered limit", func() bool { return f.byHow[admit.Exhausted].Load() > before+20 })
	consumed := ts.budget("acme", "tokens").Consumed
	before = f.byHow[admit.Exhausted].Load()
	eventually(t, "more refusals", func() bool { return f.byHow[admit.Exhausted].Load() > before+40 })
	if b := ts.budget("acme", "tokens"); !b.Consumed.Equal(consumed) {
		t.Fatalf("consumed went from %s to %s under a limit of 160", consumed, b.Consumed)
	}
	if m := f.metered.Load(); decimal.NewFromInt(m).GreaterThan(consumed) {
		t.Fatalf("after lowering: %d admitted, more than consumed %s", m, consumed)
	}
}

// A lagged rule turned into a rate contract (burst 30, 1 an hour) while
// gateways admit: its no_limit decision lifts the refusal, and what is
// admitted from then on comes from the bucket's grants, never past its
// burst.
func TestRuleTurnedRateUnderLoad(t *testing.T) {
	ts := startTally(t)
	p := ts.startPipeline()
	p.follow()
	ts.rule(quota.RuleInput{Customer: "acme", Meter: "tokens", Limit: decimal.NewFromInt(10)})
	p.use("acme", "tokens", 20)
	f := startFleet(t, ts, p, "acme", "tokens", 3, 2)
	defer f.close()
	// Every gateway answers from the exceeded decision before the count
	// starts: one whose reader has not read it yet answers by OnStale
	// (allow), which is lagged admission, not the rate contract's (a loaded
	// run counted two such admissions after the count began: 32 of 31).
	eventually(t, "every gateway holding the exceeded decision", func() bool {
		for _, c := range f.clients {
			if d, ok := c.Latest("acme", "tokens"); !ok || d.State != quota.Exceeded {
				return false
			}
		}
		return true
	})
	before := f.byHow[admit.FromDecision].Load()
	eventually(t, "refused from the decision", func() bool { return f.byHow[admit.FromDecision].Load() > before+20 })
	// The count is of the Admits begun from here on: one begun before,
	// while a gateway still answered by OnStale, may be metered later (a
	// loaded run counted two such as admitted after the count began: 32
	// of 31, "decision" among them).
	f.from.Store(time.Now().UnixNano())
	ts.rule(quota.RuleInput{Customer: "acme", Meter: "tokens", Admission: quota.Exact,
		Rate: &quota.Rate{Amount: decimal.NewFromInt(1), Per: quota.DurationText(time.Hour), Burst: decimal.NewFromInt(30)}})
	eventually(t, "the bucket spent", func() bool { return f.byHow[admit.Exhausted].Load() > 20 })
	f.meterMu.Lock() // every admission counted so far is metered
	defer f.meterMu.Unlock()
	if m := f.since.Load(); m > 31 { // 1 an hour may refill one
		t.Fatalf("rate 1/h burst 30: %d admitted (grant %d, debit %d, decision %d)", m,
			f.sinceByHow[admit.FromGrant].Load(), f.sinceByHow[admit.Debited].Load(), f.sinceByHow[admit.FromDecision].Load())
	}
}
