// Package ttlcache is a small map whose entries expire, shared by the
// caches that remember what Postgres said for a while (the API's
// schedules, the token store's principals and refusals).
package ttlcache

import (
	"math/rand/v2"
	"sync"
	"time"
)

// Cache is a small map whose entries expire. When full, the entries that
// have expired make room; when most have not, it is emptied rather than
// tracking recency: entries are cheap to reload. A nil Cache,
// or one with a TTL <= 0, holds nothing.
type Cache[K comparable, V any] struct {
	ttl time.Duration
	max int
	now func() time.Time

	mu sync.Mutex
	m  map[K]entry[V]
}

type entry[V any] struct {
	v       V
	expires time.Time
}

// New returns a cache of at most max entries, each kept for between half
// ttl and ttl.
func New[K comparable, V any](ttl time.Duration, max int) *Cache[K, V] {
	return &Cache[K, V]{ttl: ttl, max: max, now: time.Now, m: map[K]entry[V]{}}
}

// Get returns k's value if it is there and fresh.
func (c *Cache[K, V]) Get(k K) (V, bool) {
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

// Put stores v for k.
func (c *Cache[K, V]) Put(k K, v V) { c.PutIf(k, v, nil) }

// PutIf stores v if ok is nil or ok() holds, checked under the lock Del
// takes, so a Del cannot slip between the check and the store.
func (c *Cache[K, V]) PutIf(k K, v V, ok func() bool) {
	if c == nil || c.ttl <= 0 {
		return
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if ok != nil && !ok() {
		return
	}
	if len(c.m) >= c.max {
		c.makeRoom()
	}
	// Each entry lives between half the TTL and the TTL, so entries filled
	// together (after a restart, or a burst) do not all expire together.
	c.m[k] = entry[V]{v: v, expires: c.now().Add(c.ttl - rand.N(c.ttl/2+1))}
}

// Clear drops every entry.
func (c *Cache[K, V]) Clear() {
	if c == nil {
		return
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	clear(c.m)
}

// Del drops k.
func (c *Cache[K, V]) Del(k K) {
	if c == nil {
		return
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	delete(c.m, k)
}

// makeRoom drops the expired entries, which a cache serving more keys
// than max over a TTL fills up with (nothing else removes them), and
// empties the cache when that frees less than half of it: each sweep then
// frees at least max/2, so its cost is spread over as many Puts.
func (c *Cache[K, V]) makeRoom() {
	now := c.now()
	for k, e := range c.m {
		if !now.Before(e.expires) {
			delete(c.m, k)
		}
	}
	if len(c.m) > c.max/2 {
		clear(c.m)
	}
}
