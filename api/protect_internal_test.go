package api

import (
	"fmt"
	"testing"
	"time"
)

// TestRateLimitsBounded: a flood of distinct keys (addresses, tokens)
// never holds more than max buckets; a busy key's bucket is kept while
// refilled ones are dropped first, so its limit still holds.
func TestRateLimitsBounded(t *testing.T) {
	l := newRateLimits(1, 2, 100)
	now := time.Now()
	busy, allowed := "busy", 0
	for i := range 10_000 {
		at := now.Add(time.Duration(i) * time.Millisecond)
		l.allow(fmt.Sprintf("k%d", i), at)
		if n := l.len(); n > 100 {
			t.Fatalf("%d buckets after %d keys, max 100", n, i+1)
		}
		if ok, _ := l.allow(busy, at); ok { // the busy key asks every millisecond
			allowed++
		}
	}
	// 10 s at 1/s with a burst of 2: its bucket was never dropped for a
	// fresh one, or it would have had many more.
	if allowed > 2+10+1 {
		t.Fatalf("a key over its rate was allowed %d times in 10s at 1/s, burst 2", allowed)
	}
	if newRateLimits(0, 10, 10) != nil || newRateLimits(-1, 10, 10) != nil {
		t.Fatal("a rate ≤ 0 is no limit")
	}
	var off *rateLimits
	if ok, _ := off.allow("x", now); !ok {
		t.Fatal("no limit allows everything")
	}
}
