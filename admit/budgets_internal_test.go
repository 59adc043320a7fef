package admit

import (
	"strconv"
	"testing"
	"time"
)

// BenchmarkAddBudget adds a budget for a new customer to a client that
// already keeps 100,000: what a gateway pays, under the lock every new
// customer takes, to meet one more.
//
//	go test -run '^$' -bench AddBudget ./admit
func BenchmarkAddBudget(b *testing.B) {
	c := &Client{decisions: map[key]*lagged{}}
	for i := range 100_000 {
		c.budget("seen-"+strconv.Itoa(i), "tokens")
	}
	b.ReportAllocs()
	b.ResetTimer()
	for i := 0; b.Loop(); i++ {
		c.budget("new-"+strconv.Itoa(i), "tokens")
	}
}

// A report's wait, once passed, is forgotten when the report is sent
// again: reportAt holds only the reports still waiting, not every report
// that ever waited (a gateway with a revoked token for a day would keep
// one entry per grant).
func TestPassedReportWaitsAreForgotten(t *testing.T) {
	c := &Client{reportAt: map[string]time.Time{}}
	c.wait("g1", time.Millisecond)
	c.wait("g2", time.Hour)
	time.Sleep(2 * time.Millisecond)
	if c.waiting("g1") || !c.waiting("g2") {
		t.Fatal("g1 should be sendable, g2 still waiting")
	}
	if len(c.reportAt) != 1 {
		t.Fatalf("%d waits kept, want 1 (g2's)", len(c.reportAt))
	}
}
