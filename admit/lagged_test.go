package admit_test

import (
	"context"
	"encoding/json"
	"testing"
	"time"

	"github.com/segmentio/kafka-go"
	"github.com/shopspring/decimal"

	"github.com/tally-ledger/tally/admit"
	"github.com/tally-ledger/tally/internal/kafkatest"
	"github.com/tally-ledger/tally/quota"
)

// admitUntil calls Admit until the decision satisfies ok (decisions reach
// the client through Kafka, so the first answers may precede them).
func admitUntil(t *testing.T, c *admit.Client, customer, meter, what string, ok func(admit.Decision) bool) admit.Decision {
	t.Helper()
	var d admit.Decision
	eventually(t, what, func() bool {
		var err error
		d, err = c.Admit(context.Background(), customer, meter, 1)
		if err != nil {
			t.Fatal(err)
		}
		return ok(d)
	})
	return d
}

// A customer over quota under a lagged rule is refused from the enforcer's
// decision, read from Kafka; one under quota is admitted; a meter without
// a rule is admitted without one. No grant is involved.
func TestLaggedRuleRefusedFromDecision(t *testing.T) {
	ts := startTally(t)
	p := ts.startPipeline()
	p.follow()
	ts.rule(quota.RuleInput{Customer: "acme", Meter: "tokens", Limit: decimal.NewFromInt(100)})
	ts.rule(quota.RuleInput{Customer: "globex", Meter: "tokens", Limit: decimal.NewFromInt(1000)})
	p.use("acme", "tokens", 150)
	p.use("globex", "tokens", 10)
	c := newClient(t, ts, "gw1", t.TempDir(), admit.Config{Brokers: p.brokers})
	defer c.Close(context.Background())

	d := admitUntil(t, c, "acme", "tokens", "acme refused", func(d admit.Decision) bool { return !d.Admitted })
	if d.How != admit.FromDecision || d.Stale || d.Binding != "customer:acme/tokens" || d.How.String() != "decision" {
		t.Fatalf("acme over quota: %+v", d)
	}
	if ld, ok := c.Latest("acme", "tokens"); !ok || ld.State != quota.Exceeded || !ld.Used.Equal(decimal.NewFromInt(150)) {
		t.Fatalf("latest decision of acme: %+v %v", ld, ok)
	}
	d = admitUntil(t, c, "globex", "tokens", "globex answered from a fresh decision", func(d admit.Decision) bool { return !d.Stale })
	if !d.Admitted || d.How != admit.FromDecision {
		t.Fatalf("globex under quota: %+v", d)
	}
	if d, err := c.Admit(context.Background(), "acme", "images", 1); err != nil || !d.Admitted || d.How != admit.NoRule {
		t.Fatalf("a meter without a rule: %+v %v", d, err)
	}
	// More usage than the limit pushes globex over too.
	p.use("globex", "tokens", 990)
	admitUntil(t, c, "globex", "tokens", "globex refused", func(d admit.Decision) bool { return !d.Admitted })
	if b := ts.budget("acme", "tokens"); !b.Consumed.IsZero() || !b.Live.IsZero() {
		t.Fatalf("a lagged rule took grants: %+v", b)
	}
}

// A stale decision follows its rule's on_stale; with no decision read
// at all (no Kafka here), Config.OnStale answers.
func TestStaleDecisionFollowsOnStale(t *testing.T) {
	ts := startTally(t)
	p := ts.startPipeline()
	// Ingest last applied an hour ago: every decision is older than its
	// stale_after of a minute from the start.
	p.position(time.Now().Add(-time.Hour))
	ts.rule(quota.RuleInput{Customer: "under", Meter: "tokens", Limit: decimal.NewFromInt(100),
		OnStale: quota.Deny, StaleAfter: time.Minute})
	ts.rule(quota.RuleInput{Customer: "over", Meter: "tokens", Limit: decimal.NewFromInt(100),
		OnStale: quota.Allow, StaleAfter: time.Minute})
	p.use("over", "tokens", 500)
	c := newClient(t, ts, "gw1", t.TempDir(), admit.Config{Brokers: p.brokers, OnStale: admit.Allow})
	defer c.Close(context.Background())

	// Under its limit, but stale with on_stale deny: refused.
	admitUntil(t, c, "under", "tokens", "a decision for under", func(admit.Decision) bool {
		_, ok := c.Latest("under", "tokens")
		return ok
	})
	if d, err := c.Admit(context.Background(), "under", "tokens", 1); err != nil || d.Admitted || !d.Stale || d.How != admit.FromDecision {
		t.Fatalf("stale, on_stale deny: %+v %v", d, err)
	}
	// Over its limit, but stale with on_stale allow: admitted.
	admitUntil(t, c, "over", "tokens", "a decision for over", func(admit.Decision) bool {
		ld, ok := c.Latest("over", "tokens")
		return ok && ld.State == quota.Exceeded
	})
	if d, err := c.Admit(context.Background(), "over", "tokens", 1); err != nil || !d.Admitted || !d.Stale || d.How != admit.FromDecision {
		t.Fatalf("stale, on_stale allow: %+v %v", d, err)
	}
	// Ingest catches up: the decision is fresh, and over is refused.
	p.follow()
	admitUntil(t, c, "over", "tokens", "over refused by a fresh decision", func(d admit.Decision) bool {
		return !d.Admitted && !d.Stale
	})

	// A gateway that reads no decisions at all answers by its OnStale.
	for _, pol := range []admit.Policy{admit.Deny, admit.Allow} {
		c := newClient(t, ts, "gw-"+string(pol), t.TempDir(), admit.Config{OnStale: pol})
		d, err := c.Admit(context.Background(), "over", "tokens", 1)
		if err != nil || d.Admitted != (pol == admit.Allow) || !d.Stale || d.How != admit.FromDecision {
			t.Fatalf("no decision, OnStale %s: %+v %v", pol, d, err)
		}
		if err := c.Close(context.Background()); err != nil {
			t.Fatal(err)
		}
	}
}

// One client serves an exact rule from grants and a lagged rule from
// decisions side by side, and follows a rule that turns from lagged to
// exact (the decision's new rule version makes it ask Tally again).
func TestExactAndLaggedRulesInOneClient(t *testing.T) {
	ts := startTally(t)
	p := ts.startPipeline()
	p.follow()
	ts.exactRule("acme", "tokens", "50")
	ts.rule(quota.RuleInput{Customer: "acme", Meter: "calls", Limit: decimal.NewFromInt(10)})
	p.use("acme", "calls", 20)
	ctx := context.Background()
	c := newClient(t, ts, "gw1", t.TempDir(), admit.Config{Brokers: p.brokers, MinGrant: 5})
	defer c.Close(ctx)

	admitUntil(t, c, "acme", "calls", "calls refused", func(d admit.Decision) bool { return !d.Admitted })
	var tokens int64
	for denied := 0; denied < 20; {
		d, err := c.Admit(ctx, "acme", "tokens", 1)
		if err != nil {
			t.Fatal(err)
		}
		if !d.Admitted {
			if d.How != admit.Exhausted || d.Binding != "customer:acme/tokens" {
				t.Fatalf("tokens refused: %+v", d)
			}
			denied++
			time.Sleep(5 * time.Millisecond)
			continue
		}
		if d.How != admit.FromGrant && d.How != admit.Debited {
			t.Fatalf("tokens admitted by %v", d.How)
		}
		tokens++
		// calls stays refused, from its decision, meanwhile.
		if d, err := c.Admit(ctx, "acme", "calls", 1); err != nil || d.Admitted || d.How != admit.FromDecision {
			t.Fatalf("calls: %+v %v", d, err)
		}
	}
	if tokens != 50 {
		t.Fatalf("admitted %d tokens from grants under a limit of 50", tokens)
	}
	// calls becomes exact with room for 30 more.
	ts.rule(quota.RuleInput{Customer: "acme", Meter: "calls", Limit: decimal.NewFromInt(50), Admission: quota.Exact})
	admitUntil(t, c, "acme", "calls", "calls admitted from a grant", func(d admit.Decision) bool {
		return d.Admitted && d.How == admit.FromGrant
	})
}

// A gateway started after the decisions were published reads them from
// the topic's recent history, and keeps the newest by (leader_epoch, seq)
// whatever order they arrive in.
func TestDecisionsReadFromHistoryNewestWins(t *testing.T) {
	ts := startTally(t)
	p := ts.startPipeline()
	p.enf.Stop(t) // only the decisions written below
	ts.rule(quota.RuleInput{Customer: "acme", Meter: "tokens", Limit: decimal.NewFromInt(100)})
	asOf := time.Now()
	decision := func(epoch, seq int64, state quota.State) kafka.Message {
		d := quota.Decision{Customer: "acme", Meter: "tokens", Period: "2026-12-01", State: state, AsOf: &asOf,
			Mode: quota.Enforce, OnStale: quota.Allow, StaleAfter: quota.Duration(time.Hour), DecidedAt: asOf,
			RuleVersion: 1, LeaderEpoch: epoch, Seq: seq}
		b, err := json.Marshal(d)
		if err != nil {
			t.Fatal(err)
		}
		return kafka.Message{Key: []byte(d.Key()), Value: b}
	}
	w := kafkatest.NewWriter(p.brokers, quota.DefaultTopic)
	// The newest says exceeded; a deposed leader's ok lands after it.
	err := w.WriteMessages(context.Background(), decision(2, 7, quota.Exceeded), decision(1, 9, quota.OK))
	w.Close()
	if err != nil {
		t.Fatal(err)
	}
	c := newClient(t, ts, "gw1", t.TempDir(), admit.Config{Brokers: p.brokers})
	defer c.Close(context.Background())
	d := admitUntil(t, c, "acme", "tokens", "a decision from history", func(d admit.Decision) bool { return !d.Stale })
	if d.Admitted {
		t.Fatalf("answered from the deposed leader's decision: %+v", d)
	}
	if ld, _ := c.Latest("acme", "tokens"); ld.LeaderEpoch != 2 || ld.Seq != 7 {
		t.Fatalf("latest decision %+v", ld)
	}
}

// A rule turned from exact to lagged is noticed from the decision's new
// rule version while the gateway still holds plenty of grant: it answers
// from decisions and gives its grants back.
func TestRuleTurnedLaggedReleasesGrants(t *testing.T) {
	ts := startTally(t)
	p := ts.startPipeline()
	p.follow()
	ts.exactRule("acme", "tokens", "1000000")
	ctx := context.Background()
	c := newClient(t, ts, "gw1", t.TempDir(), admit.Config{Brokers: p.brokers, MinGrant: 100_000})
	defer c.Close(ctx)
	if d, err := c.Admit(ctx, "acme", "tokens", 1); err != nil || !d.Admitted || d.How != admit.FromGrant {
		t.Fatalf("first admit: %+v %v", d, err)
	}
	p.use("acme", "tokens", 500)
	ts.rule(quota.RuleInput{Customer: "acme", Meter: "tokens", Limit: decimal.NewFromInt(100)}) // lagged, exceeded
	admitUntil(t, c, "acme", "tokens", "refused from the decision", func(d admit.Decision) bool {
		return !d.Admitted && d.How == admit.FromDecision && !d.Stale
	})
	eventually(t, "grants given back", func() bool { return ts.budget("acme", "tokens").Live.IsZero() })
}

// A lagged rule the customer has exceeded, changed to a rate contract
// (docs/design.md §17: no period limit): the enforcer's next decision
// says no period limit applies, so the gateway stops refusing at once,
// without waiting to ask Tally about the rule again (RuleRecheck, an hour
// here), and the decision's new rule version then makes it admit from the
// rate bucket's grants. A gateway started afterwards finds the same
// decision in the topic's recent history, newer than the exceeded one.
func TestRuleTurnedRateOnlyLiftsTheExceededDecision(t *testing.T) {
	ts := startTally(t)
	p := ts.startPipeline()
	p.follow()
	ts.rule(quota.RuleInput{Customer: "acme", Meter: "tokens", Limit: decimal.NewFromInt(100)})
	p.use("acme", "tokens", 150)
	ctx := context.Background()
	cfg := admit.Config{Brokers: p.brokers, RuleRecheck: time.Hour}
	c := newClient(t, ts, "gw1", t.TempDir(), cfg)
	defer c.Close(ctx)
	admitUntil(t, c, "acme", "tokens", "acme refused", func(d admit.Decision) bool { return !d.Admitted && !d.Stale })

	ts.rule(quota.RuleInput{Customer: "acme", Meter: "tokens", Admission: quota.Exact,
		Rate: &quota.Rate{Amount: decimal.NewFromInt(1), Per: quota.DurationText(time.Hour), Burst: decimal.NewFromInt(30)}})
	admitUntil(t, c, "acme", "tokens", "acme admitted under a rule without a period limit", func(d admit.Decision) bool {
		return d.Admitted
	})
	admitUntil(t, c, "acme", "tokens", "acme admitted from the rate bucket", func(d admit.Decision) bool {
		return d.Admitted && d.How == admit.FromGrant
	})

	late := newClient(t, ts, "gw2", t.TempDir(), cfg)
	defer late.Close(ctx)
	eventually(t, "the rate rule's decision read from history", func() bool {
		ld, ok := late.Latest("acme", "tokens")
		return ok && ld.RuleVersion == 2
	})
	if ld, _ := late.Latest("acme", "tokens"); ld.State != quota.NoLimit || ld.Blocks(time.Now()) {
		t.Fatalf("a gateway started later holds %+v", ld)
	}
}
