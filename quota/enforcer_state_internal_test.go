package quota

import (
	"context"
	"slices"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/shopspring/decimal"

	"github.com/tally-ledger/tally/internal/kafkatest"
	"github.com/tally-ledger/tally/internal/ledgertest"
	"github.com/tally-ledger/tally/internal/pgtest"
	"github.com/tally-ledger/tally/ledger"
)

// The leader keeps recent usage samples only for the keys it evaluates: a
// key whose rule turns into a rate contract (so it is no longer decided
// from usage, only told no_limit) drops its samples at the next
// evaluation, rather than holding them until leadership changes. Without
// that, the leader's memory grows with every key that ever had a lagged
// period limit.
//
// This test is internal because what it checks, the per-key state the
// leader holds in memory, has no public view: the decisions it publishes
// and stores are the same whether or not the samples are kept.
func TestEnforcerForgetsSamplesOfKeysNoLongerEvaluated(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	const ingest = "tally.meter-batches"
	pool := pgtest.New(t)
	kc := kafkatest.New(t, kafkatest.Options{Topics: []kafkatest.Topic{
		{Name: DefaultTopic, Partitions: 1}, {Name: ingest, Partitions: 2},
	}})
	led, err := ledger.New(ledger.Config{})
	if err != nil {
		t.Fatal(err)
	}
	streams := ledgertest.New(pool, led)
	ledgertest.Follow(t, pool, ingest, 2, time.Now)
	put := func(in RuleInput) {
		t.Helper()
		in.Actor = "test"
		if _, err := PutRuleDB(ctx, pool, in); err != nil {
			t.Fatalf("PutRule: %v", err)
		}
	}
	for _, c := range []string{"acme", "beta"} {
		put(RuleInput{Customer: c, Meter: "api_calls", Limit: decimal.NewFromInt(100)})
		streams.Use(t, c, "api_calls", ledgertest.Recent(time.Now()), decimal.NewFromInt(10))
	}

	enf, err := NewEnforcer(Config{
		Pool: pool, Brokers: kc.Addrs, IngestTopic: ingest,
		Interval: 50 * time.Millisecond, Republish: 2 * time.Second, LeaseTTL: time.Second,
		Holder: "a", Registerer: prometheus.NewRegistry(),
	})
	if err != nil {
		t.Fatal(err)
	}
	runCtx, cancel := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() { done <- enf.Run(runCtx) }()
	stopped := false
	stop := func() {
		if !stopped {
			stopped = true
			cancel()
			if err := <-done; err != nil {
				t.Errorf("Run: %v", err)
			}
		}
	}
	defer stop()

	// until waits for customer's stored decision to satisfy ok.
	until := func(customer, what string, ok func(Decision) bool) {
		t.Helper()
		deadline := time.Now().Add(10 * time.Second)
		for {
			ds, err := Decisions(ctx, pool, customer)
			if err != nil {
				t.Fatal(err)
			}
			if len(ds) == 1 && ok(ds[0]) {
				return
			}
			if time.Now().After(deadline) {
				t.Fatalf("%s: no decision %s within 10s; have %+v", customer, what, ds)
			}
			time.Sleep(20 * time.Millisecond)
		}
	}
	// A decision with an as_of means the leader took a sample of the key.
	for _, c := range []string{"acme", "beta"} {
		until(c, "with an as_of", func(d Decision) bool { return d.State == OK && d.AsOf != nil })
	}

	put(RuleInput{Customer: "beta", Meter: "api_calls", Admission: Exact,
		Rate: &Rate{Amount: decimal.NewFromInt(1), Per: DurationText(time.Hour), Burst: decimal.NewFromInt(30)}})
	until("beta", "no_limit", func(d Decision) bool { return d.State == NoLimit })
	// A few more evaluations, so that the leader has had its chance to
	// forget beta's samples after the one that found beta undecided.
	time.Sleep(200 * time.Millisecond)
	stop()

	// Run has returned: the leader state can be read without a race.
	var kept []string
	for k := range enf.samples {
		kept = append(kept, k)
	}
	slices.Sort(kept)
	if !slices.Equal(kept, []string{"acme/api_calls"}) {
		t.Fatalf("samples kept for %v, want only the evaluated key acme/api_calls", kept)
	}
	// beta's no_limit decision is still republished (docs/design.md §5):
	// its last decision and seq stay, as they do in quota_decisions.
	if d, ok := enf.last["beta/api_calls"]; !ok || d.State != NoLimit || enf.seqs["beta/api_calls"] != d.Seq {
		t.Fatalf("beta's last decision %+v (seq %d), want its no_limit decision", d, enf.seqs["beta/api_calls"])
	}
}
