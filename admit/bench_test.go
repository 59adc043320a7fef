package admit_test

import (
	"context"
	"sync/atomic"
	"testing"
	"time"

	"github.com/shopspring/decimal"

	"github.com/tally-ledger/tally/admit"
	"github.com/tally-ledger/tally/quota"
)

// BenchmarkAdmit measures Admit from a held grant: the budget's limit is
// far above what the benchmark admits, so every call is answered from
// memory while the background loop keeps the grant topped up.
//
//	go test -run '^$' -bench Admit -benchmem -cpu 1,2 ./admit
func BenchmarkAdmit(b *testing.B) {
	ts := startTally(b)
	ts.exactRule("acme", "tokens", "1000000000000")
	ctx := context.Background()
	c := newClient(b, ts, "gw1", b.TempDir(), admit.Config{MinGrant: 50_000_000})
	defer c.Close(ctx)
	if d, err := c.Admit(ctx, "acme", "tokens", 1); err != nil || !d.Admitted {
		b.Fatalf("first admit: %+v %v", d, err)
	}
	b.ReportAllocs()
	b.ResetTimer()
	b.RunParallel(func(pb *testing.PB) {
		for pb.Next() {
			if d, _ := c.Admit(ctx, "acme", "tokens", 1); !d.Admitted {
				b.Error("denied")
				return
			}
		}
	})
}

// BenchmarkAtomicBaseline is the baseline for BenchmarkAdmit: one shared
// atomic counter decremented by compare-and-swap, the least a central
// in-memory counter costs.
func BenchmarkAtomicBaseline(b *testing.B) {
	var n atomicCounter
	n.v.Store(1 << 62)
	b.ReportAllocs()
	b.RunParallel(func(pb *testing.PB) {
		for pb.Next() {
			for {
				v := n.v.Load()
				if n.v.CompareAndSwap(v, v-1) {
					break
				}
			}
		}
	})
}

type atomicCounter struct{ v atomic.Int64 }

// BenchmarkAdmitDecision measures Admit under a lagged rule: answered from
// the latest decision read from Kafka (a real enforcer's, over kfake).
//
//	go test -run '^$' -bench Admit -benchmem -cpu 1,2 ./admit
func BenchmarkAdmitDecision(b *testing.B) {
	ts := startTally(b)
	p := ts.startPipeline()
	p.position(time.Now().Add(time.Hour)) // fresh for the whole run
	ts.rule(quota.RuleInput{Customer: "acme", Meter: "tokens", Limit: decimal.NewFromInt(1_000_000)})
	ctx := context.Background()
	c := newClient(b, ts, "gw1", b.TempDir(), admit.Config{Brokers: p.brokers})
	defer c.Close(ctx)
	eventually(b, "a fresh decision", func() bool {
		d, err := c.Admit(ctx, "acme", "tokens", 1)
		return err == nil && d.Admitted && d.How == admit.FromDecision && !d.Stale
	})
	p.enf.Stop(b) // the decision stays fresh (as_of an hour ahead); the enforcer's loop is not measured
	b.ReportAllocs()
	b.ResetTimer()
	b.RunParallel(func(pb *testing.PB) {
		for pb.Next() {
			if d, _ := c.Admit(ctx, "acme", "tokens", 1); !d.Admitted || d.How != admit.FromDecision {
				b.Error("not admitted from the decision")
				return
			}
		}
	})
}
