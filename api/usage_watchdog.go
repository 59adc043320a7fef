package api

import (
	"context"
	"crypto/rand"
	"math"
	"net"
	"sync"
	"sync/atomic"
	"time"
)

// The listener's liveness. Postgres keeps every notification until each
// listening connection has read it: a listener that hangs while connected
// (a bug in this process, a stopped process) stops the queue from
// draining, and when the queue is full every notifying commit fails,
// ingest included. And a listener whose connection died silently hears
// nothing, so the cache it keeps is stale and revoked tokens stay
// trusted. So the watchdog sends a probe on the channel every probeEvery:
//
//   - The newest probe the listener has handled says how far it has read:
//     everything committed before that probe was sent. The cache is used,
//     and checked tokens trusted past TokenCacheTTL, only while that is
//     within lease: a listener that died silently or hangs is trusted for
//     at most lease (plus a probe period).
//   - A listener more than behindLimit behind is dropped: its connection
//     is closed, so Postgres forgets it and the queue drains whatever the
//     listener's goroutine is doing; the cache is off until Run has
//     reconnected.
//   - pg_notification_queue_usage() is read with each probe: the metric
//     tally_postgres_notify_queue_usage and GET /v1/ingest/status show it.
//     The triggers stop notifying once the queue is as full as
//     tally.notify_queue_limit (migration 00014: 0.5 unless set), so that
//     ingest's commits never fail for it. The caches need every
//     notification: from half that limit on, they are not used, and when
//     the queue is below it again they are emptied before they are used.
//
// Probes are random and remembered until heard, so a probe forged by
// another database login proves nothing.

// Defaults of the listener's timings; tests change them per instance.
var (
	defaultProbeEvery  = time.Second
	defaultLease       = 5 * time.Second
	defaultBehindLimit = 30 * time.Second
)

// liveness is the usageWatch's part that the watchdog keeps.
type liveness struct {
	probeEvery, lease, behindLimit time.Duration

	alive      atomic.Int64 // unix ns: when the newest probe heard was sent
	mu         sync.Mutex
	probes     map[string]probe // sent, not yet heard
	conn       atomic.Pointer[net.Conn]
	queueUsage atomic.Uint64 // float64 bits: pg_notification_queue_usage()
	queueHigh  atomic.Bool   // at least half of tally.notify_queue_limit
	// hold, if set, is called before each notification is handled
	// (tests: a listener that hangs).
	hold func()
}

// probe is one sent by the watchdog; committed once its NOTIFY has.
type probe struct {
	sent      time.Time
	committed bool
}

// live reports whether the listener has heard a probe sent within lease,
// and notifications are not being skipped.
func (l *liveness) live() bool {
	return !l.queueHigh.Load() && time.Since(time.Unix(0, l.alive.Load())) < l.lease
}

// heardAt marks the listener as having read everything committed by t.
func (l *liveness) heardAt(t time.Time) {
	for {
		old := l.alive.Load()
		if t.UnixNano() <= old || l.alive.CompareAndSwap(old, t.UnixNano()) {
			return
		}
	}
}

// heard handles a probe notification: one this process sent moves alive.
func (l *liveness) heard(id string) {
	l.mu.Lock()
	p, ok := l.probes[id]
	if ok {
		for q, o := range l.probes { // older ones were lost or are behind it
			if !o.sent.After(p.sent) {
				delete(l.probes, q)
			}
		}
	}
	l.mu.Unlock()
	if ok {
		l.heardAt(p.sent)
	}
}

// sending records a probe about to be sent; committed(id, true) once its
// NOTIFY has committed, committed(id, false) if it failed.
func (l *liveness) sending(id string, t time.Time) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if len(l.probes) > 1000 { // never heard (a lost listener): forget them
		clear(l.probes)
	}
	l.probes[id] = probe{sent: t}
}

func (l *liveness) committed(id string, ok bool) {
	l.mu.Lock()
	defer l.mu.Unlock()
	p, found := l.probes[id]
	switch {
	case !found:
	case ok:
		p.committed = true
		l.probes[id] = p
	default:
		delete(l.probes, id)
	}
}

// behind is how long ago the oldest committed probe not yet heard was
// sent (0: none). Probes that could not be sent (Postgres busy or down)
// do not count: the listener is not behind on what was never sent.
func (l *liveness) behind() time.Duration {
	l.mu.Lock()
	defer l.mu.Unlock()
	var oldest time.Time
	for _, p := range l.probes {
		if p.committed && (oldest.IsZero() || p.sent.Before(oldest)) {
			oldest = p.sent
		}
	}
	if oldest.IsZero() {
		return 0
	}
	return time.Since(oldest)
}

func (l *liveness) forgetProbes() {
	l.mu.Lock()
	defer l.mu.Unlock()
	clear(l.probes)
}

// QueueUsage is the last pg_notification_queue_usage() read, 0 to 1.
func (l *liveness) QueueUsage() float64 { return math.Float64frombits(l.queueUsage.Load()) }

// dropConn closes the listening connection's socket: Postgres ends the
// backend and forgets its place in the queue, and the listener's next
// read fails.
func (l *liveness) dropConn() {
	if c := l.conn.Load(); c != nil {
		_ = (*c).Close()
	}
}

// watchdog probes the listener until ctx ends (see liveness).
func (a *API) watchdog(ctx context.Context) {
	w := a.watch
	t := time.NewTicker(w.probeEvery)
	defer t.Stop()
	var lowSince time.Time // the queue below the limit again, since
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		if behind := w.behind(); w.up() && behind > w.behindLimit {
			a.log.Error("usage cache off: the change listener is behind; closed its connection so Postgres's notification queue keeps draining",
				"behind", behind.Round(time.Millisecond), "limit", w.behindLimit)
			a.metrics.usageWatchDropped.Inc()
			w.reset(false, nil)
			a.metrics.usageWatchUp.Set(0)
			w.dropConn()
		}
		id := rand.Text()
		up := w.up()
		if up { // a listener that is down hears nothing: no probe to wait for
			w.sending(id, time.Now())
		}
		pctx, cancel := context.WithTimeout(ctx, w.probeEvery+time.Second)
		var usage, limit float64
		err := a.pool.QueryRow(pctx, qProbe, usageChannel, `{"probe":"`+id+`"}`).Scan(&usage, &limit)
		cancel()
		if up {
			w.committed(id, err == nil)
		}
		if err != nil {
			if ctx.Err() == nil {
				a.log.Warn("usage cache: probe failed", "err", err)
			}
			continue
		}
		w.queueUsage.Store(math.Float64bits(usage))
		a.metrics.notifyQueueUsage.Set(usage)
		high := usage >= limit/2
		switch {
		case high:
			lowSince = time.Time{}
			if !w.queueHigh.Load() {
				w.queueHigh.Store(true)
				a.log.Error("usage cache off: Postgres's notification queue is filling (a listening connection is not reading: look for LISTEN sessions idle in a transaction in pg_stat_activity); past tally.notify_queue_limit ingest stops notifying",
					"queue_usage", usage, "limit", limit)
			}
		case w.queueHigh.Load() && lowSince.IsZero():
			lowSince = time.Now()
		case w.queueHigh.Load() && time.Since(lowSince) >= w.lease:
			// Drained a while ago (a transaction that skipped its
			// notifications has committed by now): nothing cached is
			// known to be true.
			w.tokenStamp.Add(1)
			a.tokens.clear()
			w.forgetAll()
			w.queueHigh.Store(false)
			lowSince = time.Time{}
			a.log.Info("usage cache on: Postgres's notification queue has drained", "queue_usage", usage)
		}
	}
}
