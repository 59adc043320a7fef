package admit

import (
	"strconv"
	"testing"
	"time"
)

// Forgetting many budgets at once (a burst of customers seen once, idle
// for ForgetAfter together) lets new customers' Admits in meanwhile:
// adding a budget takes the client's lock, which forgetting takes too.
// Held while all of them were forgotten, a new customer waited for the
// whole of it (100,000 budgets: 100-450 ms, past MaxWait's 250 ms
// default on a loaded machine). Whoever takes the lock meanwhile finds
// some budgets forgotten and others not yet; held throughout, it finds
// all or none.
//
// A loaded machine may not run the taker at all while forgetting runs, so
// a run that saw no partial state is tried again, up to five times: held
// throughout, every run sees none.
func TestForgettingManyBudgetsHoldsUpNoNewCustomer(t *testing.T) {
	for try := 1; ; try++ {
		forgot, partial, longest := forgetManyWhileTakingTheLock(t)
		if partial > 0 {
			t.Logf("forgetting took %v; the lock taken %d times meanwhile, after a wait of at most %v", forgot, partial, longest)
			return
		}
		if try == 5 {
			t.Fatalf("forgetting took %v, and held the lock new customers take all along (one waited %v), in %d runs", forgot, longest, try)
		}
	}
}

// forgetManyWhileTakingTheLock forgets n idle budgets while taking c.mu
// in a loop, as adding a new customer's budget does: how often it found
// some forgotten and others not, and its longest wait.
func forgetManyWhileTakingTheLock(t *testing.T) (forgot time.Duration, partial int, longest time.Duration) {
	const n = 30_000
	c := &Client{decisions: map[key]*lagged{}, cfg: Config{ForgetAfter: time.Millisecond}}
	var err error
	if c.metrics, err = newMetrics(nil, c); err != nil {
		t.Fatal(err)
	}
	// Built shard by shard: adding them one by one copies a shard each.
	var idle []*budget
	built := map[int]map[key]*budget{}
	for i := range n {
		k := key{"seen-" + strconv.Itoa(i), "tokens"}
		b := newBudget(k.customer, k.meter)
		b.usedAt = time.Now().Add(-time.Hour)
		idle = append(idle, b)
		s := c.budgets.index(k)
		if built[s] == nil {
			built[s] = map[key]*budget{}
		}
		built[s][k] = b
	}
	for s, m := range built {
		c.budgets.shards[s].Store(&m)
	}
	kept := func() int { // under c.mu
		left := 0
		for i := range c.budgets.shards {
			if p := c.budgets.shards[i].Load(); p != nil {
				left += len(*p)
			}
		}
		return left
	}

	done := make(chan time.Duration)
	go func() {
		start := time.Now()
		c.forgetIdle(idle)
		done <- time.Since(start)
	}()
	for {
		select {
		case forgot = <-done:
			if left := kept(); left != 0 {
				t.Fatalf("%d budgets left unforgotten", left)
			}
			return forgot, partial, longest
		default:
		}
		start := time.Now()
		c.mu.Lock() // as adding a new customer's budget does
		longest = max(longest, time.Since(start))
		if left := kept(); left > 0 && left < n {
			partial++
		}
		c.mu.Unlock()
	}
}
