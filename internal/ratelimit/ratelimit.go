// Package ratelimit is the token bucket per key that the REST API (per
// client address, per token) and the console (sign-ins per token and per
// address) limit with: bounded in keys, so a flood of new keys cannot grow
// it, nor reset the keys that are being limited.
package ratelimit

import (
	"math"
	"sync"
	"time"

	"golang.org/x/time/rate"
)

// Limits is a token bucket (golang.org/x/time/rate) per key, in a
// bounded map: when it is full, half is freed (see evict). A nil *Limits
// allows everything.
type Limits struct {
	rate  rate.Limit
	burst int
	max   int

	mu sync.Mutex
	m  map[string]*rate.Limiter
}

// New returns nil (no limit) for a rate ≤ 0.
func New(perSecond float64, burst, maxKeys int) *Limits {
	if perSecond <= 0 {
		return nil
	}
	return &Limits{rate: rate.Limit(perSecond), burst: max(1, burst), max: maxKeys, m: map[string]*rate.Limiter{}}
}

// Allow takes one token from key's bucket, or says how long until one is there.
func (l *Limits) Allow(key string, now time.Time) (bool, time.Duration) {
	return l.AllowN(key, 1, now)
}

// AllowN takes n tokens (at most the burst) from key's bucket, or says how
// long until they are there.
func (l *Limits) AllowN(key string, n int, now time.Time) (bool, time.Duration) {
	if l == nil {
		return true, 0
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	lim, ok := l.m[key]
	if !ok {
		if len(l.m) >= l.max {
			l.evict(now)
		}
		lim = rate.NewLimiter(l.rate, l.burst)
		l.m[key] = lim
	}
	n = min(max(1, n), l.burst)
	if lim.AllowN(now, n) {
		return true, 0
	}
	missing := float64(n) - lim.TokensAt(now)
	return false, time.Duration(missing / float64(l.rate) * float64(time.Second))
}

func (l *Limits) evict(now time.Time) {
	// Dropping a bucket gives its key a full one. First the buckets that
	// are full (nothing lost), then those that would allow the next
	// request anyway (at most a burst given away), and only then others:
	// a flood of new keys does not reset the keys that are being limited.
	for _, floor := range []float64{float64(l.burst), 1, math.Inf(-1)} {
		for k, lim := range l.m { // random order
			if len(l.m) <= l.max/2 {
				return
			}
			if lim.TokensAt(now) >= floor {
				delete(l.m, k)
			}
		}
	}
}

func (l *Limits) Len() int {
	l.mu.Lock()
	defer l.mu.Unlock()
	return len(l.m)
}
