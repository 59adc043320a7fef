package admit

import (
	"strconv"
	"testing"
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
