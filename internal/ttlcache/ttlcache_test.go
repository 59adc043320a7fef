package ttlcache

import (
	"fmt"
	"testing"
	"time"
)

// TestFullCacheDropsExpiredFirst: a cache serving more keys than it holds
// over a TTL (the schedules or tokens of many customers, each used now and
// then) fills with entries that have expired. It used to be emptied at the
// next Put, fresh entries and all, so every key in use read Postgres again
// at once; now what has expired makes room first, and it is emptied only
// when most of it is fresh.
func TestFullCacheDropsExpiredFirst(t *testing.T) {
	now := time.Date(2026, 12, 3, 10, 0, 0, 0, time.UTC)
	c := New[string, int](time.Minute, 4)
	c.now = func() time.Time { return now }
	c.Put("old1", 1)
	c.Put("old2", 2)
	now = now.Add(time.Minute)
	c.Put("a", 3)
	c.Put("b", 4)
	c.Put("c", 5) // full: old1 and old2 have expired
	for _, k := range []string{"a", "b", "c"} {
		if _, ok := c.Get(k); !ok {
			t.Errorf("%s, just put, was dropped to make room for c", k)
		}
	}
	// Full of fresh entries: it is emptied, and stays bounded.
	for i := range 10 {
		c.Put(fmt.Sprint(i), i)
		if n := len(c.m); n > 4 {
			t.Fatalf("%d entries, max 4", n)
		}
	}
	if v, ok := c.Get("9"); !ok || v != 9 {
		t.Fatalf("the last entry put: %v, %v", v, ok)
	}
}
