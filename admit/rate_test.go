package admit_test

import (
	"context"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/shopspring/decimal"

	"github.com/tally-ledger/tally/admission"
	"github.com/tally-ledger/tally/admit"
	"github.com/tally-ledger/tally/quota"
)

// Two gateways on one rate contract (docs/design.md §17): together they
// never admit past the bucket, once a grant said "rate" they ask short
// grants and never renew them, and when they close the unspent tokens go
// back to the bucket.
func TestRateBudgetThroughTheSDK(t *testing.T) {
	ts := startTally(t)
	// 1 per hour, bursts of 30: the refill during the test is below 0.01.
	ts.rule(quota.RuleInput{Customer: "acme", Meter: "tokens", Admission: quota.Exact,
		Rate: &quota.Rate{Amount: decimal.NewFromInt(1), Per: quota.DurationText(time.Hour), Burst: decimal.NewFromInt(30)}})
	ctx := context.Background()
	var admitted atomic.Int64
	var wg sync.WaitGroup
	clients := []*admit.Client{
		newClient(t, ts, "gw1", t.TempDir(), admit.Config{Tick: 50 * time.Millisecond}),
		newClient(t, ts, "gw2", t.TempDir(), admit.Config{Tick: 50 * time.Millisecond}),
	}
	for _, c := range clients {
		wg.Go(func() {
			for end := time.Now().Add(2500 * time.Millisecond); time.Now().Before(end); {
				if d, err := c.Admit(ctx, "acme", "tokens", 1); err == nil && d.Admitted {
					admitted.Add(1)
				}
				time.Sleep(2 * time.Millisecond)
			}
		})
	}
	wg.Wait()
	n := admitted.Load()
	if n == 0 || n > 30 {
		t.Fatalf("admitted %d, want 1 to the burst of 30", n)
	}
	for _, c := range clients {
		if err := c.Close(ctx); err != nil {
			t.Fatal(err)
		}
	}
	var long, renewed int
	if err := ts.pool.QueryRow(ctx, `
SELECT count(*) FILTER (WHERE g.valid_until - g.issued_at > interval '1 second'
                          AND g.issued_at > (SELECT min(issued_at) FROM admission_grants x WHERE x.holder = g.holder)),
       count(*) FILTER (WHERE g.valid_until > d.until)
FROM admission_grants g JOIN admission_rate_draws d ON d.grant_id = g.id`).Scan(&long, &renewed); err != nil {
		t.Fatal(err)
	}
	if long != 0 || renewed != 0 {
		t.Errorf("%d grants after a holder's first lasted over 1s, %d were extended", long, renewed)
	}
	s, err := admission.New(ts.pool, admission.Config{})
	if err != nil {
		t.Fatal(err)
	}
	bs, err := s.RateBudgetsOf(ctx, "acme")
	if err != nil || len(bs) != 1 {
		t.Fatalf("rate budgets %v %+v", err, bs)
	}
	// Everything unspent went back: the bucket holds 30 − admitted (plus
	// a refill below 0.01), nothing is live or stranded.
	want := decimal.NewFromInt(30 - n)
	if b := bs[0]; b.Tokens.LessThan(want) || b.Tokens.GreaterThan(want.Add(decimal.RequireFromString("0.01"))) || !b.Live.IsZero() || !b.Stranded.IsZero() {
		t.Errorf("after close: %+v, want %s tokens", b, want)
	}
}
