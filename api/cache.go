package api

import (
	"math/rand/v2"
	"sync"
	"time"
)

// ttlCache is a small map whose entries expire. When full it is emptied
// rather than tracking recency: entries are cheap to reload.
type ttlCache[K comparable, V any] struct {
	ttl time.Duration
	max int
	now func() time.Time

	mu sync.Mutex
	m  map[K]ttlEntry[V]
}

type ttlEntry[V any] struct {
	v       V
	expires time.Time
}

func newTTLCache[K comparable, V any](ttl time.Duration, max int) *ttlCache[K, V] {
	return &ttlCache[K, V]{ttl: ttl, max: max, now: time.Now, m: map[K]ttlEntry[V]{}}
}

func (c *ttlCache[K, V]) get(k K) (V, bool) {
	var zero V
	if c == nil || c.ttl <= 0 {
		return zero, false
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	e, ok := c.m[k]
	if !ok || !c.now().Before(e.expires) {
		return zero, false
	}
	return e.v, true
}

func (c *ttlCache[K, V]) put(k K, v V) { c.putIf(k, v, nil) }

// putIf stores v if ok is nil or ok() holds, checked under the lock del
// takes, so a del cannot slip between the check and the store.
func (c *ttlCache[K, V]) putIf(k K, v V, ok func() bool) {
	if c == nil || c.ttl <= 0 {
		return
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if ok != nil && !ok() {
		return
	}
	if len(c.m) >= c.max {
		clear(c.m)
	}
	// Each entry lives between half the TTL and the TTL, so entries filled
	// together (after a restart, or a burst) do not all expire together.
	c.m[k] = ttlEntry[V]{v: v, expires: c.now().Add(c.ttl - rand.N(c.ttl/2+1))}
}

// clear drops every entry.
func (c *ttlCache[K, V]) clear() {
	if c == nil {
		return
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	clear(c.m)
}

func (c *ttlCache[K, V]) del(k K) {
	if c == nil {
		return
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	delete(c.m, k)
}
