package ratelimit

import (
	"fmt"
	"testing"
	"time"
)

// TestRateLimitsBounded: a flood of distinct keys (addresses, tokens)
// never holds more than max buckets; a busy key's bucket is kept while
// refilled ones are dropped first, so its limit still holds.
func TestRateLimitsBounded(t *testing.T) {
	l := New(1, 2, 100)
	now := time.Now()
	busy, allowed := "busy", 0
	for i := range 10_000 {
		at := now.Add(time.Duration(i) * time.Millisecond)
		l.Allow(fmt.Sprintf("k%d", i), at)
		if n := l.Len(); n > 100 {
			t.Fatalf("%d buckets after %d keys, max 100", n, i+1)
		}
		if ok, _ := l.Allow(busy, at); ok { // the busy key asks every millisecond
			allowed++
		}
	}
	// 10 s at 1/s with a burst of 2: its bucket was never dropped for a
	// fresh one, or it would have had many more.
	if allowed > 2+10+1 {
		t.Fatalf("a key over its rate was allowed %d times in 10s at 1/s, burst 2", allowed)
	}
	if New(0, 10, 10) != nil || New(-1, 10, 10) != nil {
		t.Fatal("a rate ≤ 0 is no limit")
	}
	var off *Limits
	if ok, _ := off.Allow("x", now); !ok {
		t.Fatal("no limit allows everything")
	}
}
