package admit_test

import (
	"context"
	"errors"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/shopspring/decimal"

	"github.com/tally-ledger/tally/admit"
)

func newClient(t testing.TB, ts *tally, holder, dir string, cfg admit.Config) *admit.Client {
	t.Helper()
	cfg.URL, cfg.Token, cfg.Holder, cfg.Dir = ts.url, ts.gatewayToken(holder), holder, dir
	if cfg.MaxWait == 0 {
		// Far above a loaded machine's grant round trip: a test that
		// expects a grant must not see Tally "unreachable" because the
		// machine was slow (the 250 ms default is for gateways). A test of
		// MaxWait itself sets it.
		cfg.MaxWait = 10 * time.Second
	}
	c, err := admit.New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	return c
}

// Two gateways share one exact budget: together they never admit more
// than the limit, and once they close, Tally's consumed is exactly what
// they admitted (every grant released with its true spent).
func TestGatewaysShareOneBudgetExactly(t *testing.T) {
	ts := startTally(t)
	ts.exactRule("acme", "tokens", "1000")
	ctx := context.Background()
	var admitted atomic.Int64
	// run has two gateways, three workers each, admit until stop says so,
	// then close them (releasing what they did not spend).
	run := func(stop func(deniedInARow int) bool) {
		var wg sync.WaitGroup
		clients := []*admit.Client{
			newClient(t, ts, "gw1", t.TempDir(), admit.Config{MinGrant: 20}),
			newClient(t, ts, "gw2", t.TempDir(), admit.Config{MinGrant: 20}),
		}
		for _, c := range clients {
			for range 3 {
				wg.Go(func() {
					denied := 0
					for !stop(denied) {
						d, err := c.Admit(ctx, "acme", "tokens", 1)
						if err != nil {
							t.Error(err)
							return
						}
						if !d.Admitted {
							denied++
							time.Sleep(5 * time.Millisecond)
							continue
						}
						if d.How != admit.FromGrant && d.How != admit.Debited {
							t.Errorf("admitted by %v while Tally was up", d.How)
						}
						if admitted.Add(1) > 1000 {
							t.Errorf("admitted more than the limit")
						}
						denied = 0
					}
				})
			}
		}
		wg.Wait()
		for _, c := range clients {
			if err := c.Close(ctx); err != nil {
				t.Fatal(err)
			}
		}
		b := ts.budget("acme", "tokens")
		if !b.Consumed.Equal(decimal.NewFromInt(admitted.Load())) || !b.Live.IsZero() {
			t.Fatalf("admitted %d, budget %+v", admitted.Load(), b)
		}
	}
	// Demand stops early: every unspent unit goes back to the budget.
	run(func(int) bool { return admitted.Load() >= 600 })
	// New generations then take the rest, never more.
	run(func(denied int) bool { return denied >= 50 })
	if got := admitted.Load(); got > 1000 || got < 900 {
		t.Fatalf("admitted %d of a limit of 1000", got)
	}
}

func TestGenerationGrowsPerRun(t *testing.T) {
	ts := startTally(t)
	dir := t.TempDir()
	for want := int64(1); want <= 3; want++ {
		c := newClient(t, ts, "gw1", dir, admit.Config{})
		if c.Generation() != want {
			t.Fatalf("generation %d, want %d", c.Generation(), want)
		}
		if err := c.Close(context.Background()); err != nil {
			t.Fatal(err)
		}
	}
}

// Tally is killed mid-run under each policy: deny refuses, allow and local
// admit as bypasses (local at most LocalAmount per LocalEvery), and every
// bypass reaches Tally once it is back, even across a gateway restart.
func TestTallyUnreachable(t *testing.T) {
	for _, tc := range []struct {
		policy admit.Policy // the rule's on_unreachable; the SDK's default is the opposite
		want   int64        // bypassed of 30 attempts
	}{{admit.Deny, 0}, {admit.Allow, 30}, {admit.Local, 7}} {
		t.Run(string(tc.policy), func(t *testing.T) {
			ts := startTally(t)
			ts.exactRuleWith("acme", "tokens", "1000000", tc.policy)
			ctx := context.Background()
			dir := t.TempDir()
			// The rule's policy comes with the grant and overrides this one.
			cfg := admit.Config{OnUnreachable: admit.Allow, MinGrant: 5}
			if tc.policy == admit.Allow {
				cfg.OnUnreachable = admit.Deny
			}
			c := newClient(t, ts, "gw1", dir, cfg)
			if d, err := c.Admit(ctx, "acme", "tokens", 1); err != nil || !d.Admitted || d.How != admit.FromGrant {
				t.Fatalf("first admit: %+v %v", d, err)
			}
			ts.down.Store(true)
			// Admit from the grant's rest, then 30 times without a grant.
			var bypassed, fromGrant, attempts int64
			for attempts < 30 {
				d, err := c.Admit(ctx, "acme", "tokens", 1)
				if err != nil {
					t.Fatal(err)
				}
				if d.How == admit.FromGrant {
					if fromGrant++; fromGrant > 1_000_000 {
						t.Fatal("admitting from a grant forever while Tally is down")
					}
					continue
				}
				attempts++
				// A refusal says when the client asks Tally again (never
				// 0); an admission has nothing to retry (0).
				if !d.Unreachable || d.Admitted != (d.How == admit.Bypass) || d.Admitted != (d.RetryAfter == 0) {
					t.Fatalf("decision %+v while Tally is down", d)
				}
				if d.Admitted {
					bypassed++
				}
			}
			if bypassed != tc.want {
				t.Fatalf("bypassed %d, want %d", bypassed, tc.want)
			}
			// The gateway restarts while Tally is still down: nothing lost.
			// Close says the grant's final spend report is kept on disk.
			var und *admit.UndeliveredError
			if err := c.Close(ctx); !errors.As(err, &und) || und.Reports != 1 {
				t.Fatalf("close while Tally is down: %v, want one undelivered final spend report", err)
			}
			c = newClient(t, ts, "gw1", dir, cfg)
			defer c.Close(ctx)
			ts.down.Store(false)
			eventually(t, "bypasses reported", func() bool {
				return ts.budget("acme", "tokens").Bypassed.Equal(decimal.NewFromInt(bypassed))
			})
			if bypassed == 0 {
				time.Sleep(200 * time.Millisecond) // give a wrong report time to show
				if b := ts.budget("acme", "tokens"); !b.Bypassed.IsZero() {
					t.Fatalf("deny reported bypasses: %+v", b)
				}
			}
		})
	}
}

// A burst makes grants grow with demand; when demand stops, the gateway
// gives the capacity back by itself (without Close), so another gateway can
// get it.
func TestIdleGatewayGivesCapacityBack(t *testing.T) {
	ts := startTally(t)
	ts.exactRule("acme", "tokens", "1000000")
	ctx := context.Background()
	c := newClient(t, ts, "gw1", t.TempDir(), admit.Config{MinGrant: 10})
	defer c.Close(ctx)
	const burst = 20_000
	var peakLive decimal.Decimal
	for i := range burst {
		d, err := c.Admit(ctx, "acme", "tokens", 1)
		if err != nil || !d.Admitted {
			t.Fatalf("admit %d: %+v %v", i, d, err)
		}
		if i%2000 == 0 {
			time.Sleep(60 * time.Millisecond) // let the loop measure the demand and top up
			peakLive = decimal.Max(peakLive, ts.budget("acme", "tokens").Live)
		}
	}
	if peakLive.LessThan(decimal.NewFromInt(100)) {
		t.Fatalf("grants did not grow with demand: peak live %s", peakLive)
	}
	eventually(t, "idle capacity given back", func() bool {
		return ts.budget("acme", "tokens").Live.LessThanOrEqual(decimal.NewFromInt(30))
	})
	// Released grants reported what they spent; what is still live may
	// have been spent or not.
	b := ts.budget("acme", "tokens")
	if a := decimal.NewFromInt(burst); b.Consumed.Sub(b.Live).GreaterThan(a) || b.Consumed.LessThan(a) {
		t.Fatalf("admitted %d, budget %+v", burst, b)
	}
}

// A client asks Tally for nothing once closed: an Admit racing or
// following Close gets ErrClosed instead of a grant nobody would give
// back (it would strand its amount until it expired).
func TestClosedClientTakesNoGrant(t *testing.T) {
	ts := startTally(t)
	ts.exactRule("acme", "tokens", "1000")
	ctx := context.Background()
	c := newClient(t, ts, "gw1", t.TempDir(), admit.Config{})
	if d, err := c.Admit(ctx, "acme", "tokens", 1); err != nil || !d.Admitted {
		t.Fatalf("before close: %+v %v", d, err)
	}
	if err := c.Close(ctx); err != nil {
		t.Fatal(err)
	}
	for _, meter := range []string{"tokens", "other"} {
		if _, err := c.Admit(ctx, "acme", meter, 1000); !errors.Is(err, admit.ErrClosed) {
			t.Errorf("admit %s after close: %v, want ErrClosed", meter, err)
		}
	}
	if b := ts.budget("acme", "tokens"); !b.Live.IsZero() || !b.Consumed.Equal(decimal.NewFromInt(1)) {
		t.Fatalf("after close: %+v, want consumed 1 and nothing live", b)
	}
}
