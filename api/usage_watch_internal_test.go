package api

import (
	"fmt"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgtype"
)

// TestUsageCacheBound: the cache's bytes stay within its bound and are
// counted exactly as answers come, are replaced and are forgotten.
func TestUsageCacheBound(t *testing.T) {
	c := usageCache{ttl: time.Minute, maxBytes: 100_000, m: map[string][]usageEntry{}}
	now := time.Now()
	yes := func() bool { return true }
	answer := func(n int) usageData {
		return usageData{items: []meterUsage{{total: "1", json: []byte(strings.Repeat("x", n))}}}
	}
	count := func() int {
		total := 0
		for _, entries := range c.m {
			for _, e := range entries {
				total += e.size
			}
		}
		return total
	}
	for i := range 1000 {
		key := usageKey{customer: fmt.Sprintf("c%d", i%300), meter: fmt.Sprint(i % 3)}
		c.put(key, answer(100+i%7*500), now, yes)
		if c.bytes != count() || c.bytes > c.maxBytes {
			t.Fatalf("after %d puts: bytes %d, counted %d, bound %d", i+1, c.bytes, count(), c.maxBytes)
		}
		if i%10 == 0 {
			c.forget(fmt.Sprintf("c%d", i%300))
		}
	}
	if len(c.m) < 20 {
		t.Fatalf("only %d customers left: a full cache should keep about half", len(c.m))
	}
	key := usageKey{customer: "fresh"}
	c.put(key, answer(10), now, func() bool { return false })
	if _, ok := c.get(key, now); ok {
		t.Fatal("an answer whose ticket went stale was cached")
	}
	c.put(key, answer(10), now, yes)
	if _, ok := c.get(key, now.Add(time.Minute)); ok {
		t.Fatal("an answer was served past its TTL")
	}
}

// TestUsageCacheFullDropsExpiredFirst: a cache serving more customers
// than it holds over its TTL fills with answers that have expired, which
// are never served again. Full, it used to drop customers at random until
// half was free, fresh answers as likely as expired ones; now the expired
// go first.
func TestUsageCacheFullDropsExpiredFirst(t *testing.T) {
	c := usageCache{ttl: time.Minute, maxBytes: 20_000, m: map[string][]usageEntry{}}
	now := time.Now()
	yes := func() bool { return true }
	answer := usageData{items: []meterUsage{{total: "1", json: []byte(strings.Repeat("x", 100))}}}
	for i := range 40 {
		c.put(usageKey{customer: fmt.Sprintf("old%d", i)}, answer, now, yes)
	}
	now = now.Add(2 * time.Minute)
	var fresh []usageKey
	for i := 0; len(fresh) < 40; i++ {
		before := len(c.m)
		key := usageKey{customer: fmt.Sprintf("new%d", i)}
		c.put(key, answer, now, yes)
		fresh = append(fresh, key)
		if len(c.m) <= before { // it was full
			break
		}
	}
	if len(fresh) == 40 {
		t.Fatalf("the cache never filled: %d bytes of %d", c.bytes, c.maxBytes)
	}
	for _, key := range fresh {
		if _, ok := c.get(key, now); !ok {
			t.Errorf("%s's fresh answer was dropped; %d customers kept", key.customer, len(c.m))
		}
	}
	if len(c.m) != len(fresh) {
		t.Errorf("%d customers kept, want the %d with a fresh answer", len(c.m), len(fresh))
	}
}

// fakeListener stands for the listener's state (internal/notify tests
// the listener itself).
type fakeListener struct {
	epoch atomic.Uint64
	live  atomic.Bool
}

func (f *fakeListener) Epoch() uint64 { return f.epoch.Load() }
func (f *fakeListener) Up() bool      { return f.epoch.Load()%2 == 0 }
func (f *fakeListener) Live() bool    { return f.live.Load() }

func upListener() *fakeListener {
	l := &fakeListener{}
	l.epoch.Store(2)
	l.live.Store(true)
	return l
}

// TestUsageCacheNeedsLiveListener: a listener that is not live (it heard
// no probe sent within its lease: it hangs, or its connection died
// silently; or the queue is filling) has its cache not used. (Tokens:
// tokens.TestTokenTrust.)
func TestUsageCacheNeedsLiveListener(t *testing.T) {
	l := upListener()
	w := newUsageWatch("t", l, time.Minute, 1<<20)
	key := usageKey{customer: "c"}
	w.put(w.ticket("c"), key, usageData{}, time.Now())
	if _, ok := w.get(key, time.Now()); !ok {
		t.Fatal("no hit while live")
	}
	l.live.Store(false)
	if _, ok := w.get(key, time.Now()); ok {
		t.Error("a cached answer was served while the listener is not live")
	}
}

// TestUsageWatchGetAgainstApply drives get against apply: a commit
// forgets the customer, then moves its partition's position. An answer
// read before the commit must never go out stamped with the position
// after it (as_of claims usage the answer does not hold).
func TestUsageWatchGetAgainstApply(t *testing.T) {
	w := newUsageWatch("t", upListener(), time.Minute, 1<<20)
	base := time.Date(2026, 11, 20, 0, 0, 0, 0, time.UTC)
	at := func(v int) time.Time { return base.Add(time.Duration(v) * time.Second) }
	w.publish(map[int32]pgtype.Timestamptz{0: {Time: at(0), Valid: true}})
	key := usageKey{customer: "c", meter: "m"}
	version := func(v int) usageData {
		return usageData{asOf: pgtype.Timestamptz{Time: at(v), Valid: true}, items: []meterUsage{{total: strconv.Itoa(v)}}}
	}
	w.put(w.ticket("c"), key, version(0), time.Now())

	var stop atomic.Bool
	var violations, hits atomic.Int64
	var first atomic.Value
	var wg sync.WaitGroup
	for range 4 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for !stop.Load() {
				d, ok := w.get(key, time.Now())
				if !ok {
					continue
				}
				hits.Add(1)
				v, _ := strconv.Atoi(d.items[0].total)
				if d.asOf.Time.After(at(v)) {
					violations.Add(1)
					first.CompareAndSwap(nil, fmt.Sprintf("answer of version %d stamped %s", v, d.asOf.Time.Format(time.RFC3339)))
				}
			}
		}()
	}
	deadline := time.Now().Add(2 * time.Second)
	v := 0
	for ; time.Now().Before(deadline); v++ {
		// Commit v+1: its customers, then (deferred to commit) its position.
		if _, err := w.apply(`{"customers":["c"]}`); err != nil {
			t.Fatal(err)
		}
		w.publish(map[int32]pgtype.Timestamptz{0: {Time: at(v + 1), Valid: true}})
		w.put(w.ticket("c"), key, version(v+1), time.Now())
	}
	stop.Store(true)
	wg.Wait()
	t.Logf("%d commits, %d hits, %d violations", v, hits.Load(), violations.Load())
	if n := violations.Load(); n > 0 {
		t.Fatalf("%d stale answers stamped with a newer as_of, e.g. %v", n, first.Load())
	}
	if hits.Load() == 0 {
		t.Fatal("no hits: the race was not exercised")
	}
}
