package admit

import (
	"math/rand/v2"
	"sync"
	"sync/atomic"
	"time"
)

// reach is what the client remembers of Tally's health, so that no
// caller waits on a Tally known to be down, hung or shedding load:
//
//   - A call that gets no answer (connection refused, timeout, 5xx), or an
//     Admit that waited MaxWait for a grant, marks Tally unreachable and
//     pauses calls for a backoff: 2 ticks, doubling to MaxBackoff, with
//     ±25% jitter. Meanwhile Admit answers by on_unreachable at once; a
//     refusal's RetryAfter is the time left of the pause. After the pause, calls
//     resume from the background (the loop's renews and reports, a grant
//     request started by a miss without waiting for it): they are the
//     probes. The first answer marks Tally up again.
//   - A refusal for load (429, 503) pauses calls for its Retry-After,
//     without calling Tally unreachable.
//
// A 503 budgets-changing is not a refusal for load: it concerns one grant
// request's budgets and pauses nothing (changingError).
//
// Both transitions are logged once.
type reach struct {
	pausedUntil atomic.Int64 // unix nanos; no call to Tally before then
	down        atomic.Bool
	mu          sync.Mutex
	backoff     time.Duration
	downSince   time.Time
	upSince     time.Time
}

// MaxBackoff is the longest pause between probes of an unreachable Tally.
const MaxBackoff = 5 * time.Second

func (c *Client) paused(now time.Time) bool { return now.UnixNano() < c.reach.pausedUntil.Load() }

// retryIn is how long until Tally is asked again: never 0 (an immediate
// retry by every client is a storm), at least a tick.
func (c *Client) retryIn(now time.Time) time.Duration {
	return max(time.Duration(c.reach.pausedUntil.Load()-now.UnixNano()), c.cfg.Tick)
}

func (c *Client) markDown(err error) {
	r := &c.reach
	now := time.Now()
	r.mu.Lock()
	defer r.mu.Unlock()
	// An outage that follows a short recovery keeps its backoff: a Tally
	// that answers one call in ten is not probed ten times a second.
	if r.backoff == 0 || (!r.down.Load() && now.Sub(r.upSince) > time.Minute) {
		r.backoff = 2 * c.cfg.Tick
	} else if r.down.Load() {
		r.backoff = min(2*r.backoff, MaxBackoff)
	}
	pause := r.backoff*3/4 + rand.N(r.backoff/2)
	until := now.Add(pause).UnixNano()
	if until > r.pausedUntil.Load() {
		r.pausedUntil.Store(until)
	}
	if !r.down.Load() {
		r.down.Store(true)
		r.downSince = now
		c.metrics.reachable.Set(0)
		c.log.Warn("Tally unreachable: admitting by each rule's on_unreachable, final spend reports and bypasses kept on disk until it answers",
			"url", c.cfg.URL, "err", err)
	}
}

func (c *Client) markBusy(wait time.Duration) {
	until := time.Now().Add(max(wait, c.cfg.Tick)).UnixNano()
	for {
		cur := c.reach.pausedUntil.Load()
		if until <= cur || c.reach.pausedUntil.CompareAndSwap(cur, until) {
			return
		}
	}
}

func (c *Client) markUp() {
	r := &c.reach
	if !r.down.Load() {
		return
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	if !r.down.Load() {
		return
	}
	now := time.Now()
	r.down.Store(false)
	r.upSince = now
	r.pausedUntil.Store(0) // it answered: calls resume at once
	c.metrics.reachable.Set(1)
	c.log.Info("Tally answers again", "url", c.cfg.URL, "unreachable_for", now.Sub(r.downSince).Round(time.Millisecond))
}
