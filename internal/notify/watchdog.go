package notify

import (
	"context"
	"crypto/rand"
	"math"
	"time"
)

// heardAt marks the listener as having read everything committed by t.
func (l *Listener) heardAt(t time.Time) {
	for {
		old := l.alive.Load()
		if t.UnixNano() <= old || l.alive.CompareAndSwap(old, t.UnixNano()) {
			return
		}
	}
}

// heard handles a probe: one this process sent moves alive.
func (l *Listener) heard(id string) {
	l.probesMu.Lock()
	p, ok := l.probes[id]
	if ok {
		for q, o := range l.probes { // older ones were lost or are behind it
			if !o.sent.After(p.sent) {
				delete(l.probes, q)
			}
		}
	}
	l.probesMu.Unlock()
	if ok {
		l.heardAt(p.sent)
	}
}

// sending records a probe about to be sent; committed(id, true) once its
// NOTIFY has committed, committed(id, false) if it failed.
func (l *Listener) sending(id string, t time.Time) {
	l.probesMu.Lock()
	defer l.probesMu.Unlock()
	if len(l.probes) > 1000 { // never heard (a lost listener): forget them
		clear(l.probes)
	}
	l.probes[id] = probe{sent: t}
}

func (l *Listener) committed(id string, ok bool) {
	l.probesMu.Lock()
	defer l.probesMu.Unlock()
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
func (l *Listener) behind() time.Duration {
	l.probesMu.Lock()
	defer l.probesMu.Unlock()
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

func (l *Listener) forgetProbes() {
	l.probesMu.Lock()
	defer l.probesMu.Unlock()
	clear(l.probes)
}

// dropConn closes the listening connection's socket: Postgres ends the
// backend and forgets its place in the queue, and the listener's next
// read fails.
func (l *Listener) dropConn() {
	if c := l.conn.Load(); c != nil {
		_ = (*c).Close()
	}
}

// qProbe sends a probe and reads how full Postgres's notification queue
// is, and how full it may be before the triggers stop notifying
// (migration 00012).
const qProbe = `SELECT pg_notification_queue_usage(),
       coalesce(nullif(current_setting('tally.notify_queue_limit', true), '')::float8, 0.5)
FROM (SELECT pg_notify($1, $2)) probe`

// watchdog probes the listener until ctx ends (see the package doc).
func (l *Listener) watchdog(ctx context.Context) {
	log := l.cfg.Logger
	t := time.NewTicker(l.ProbeEvery)
	defer t.Stop()
	var lowSince time.Time // the queue below the limit again, since
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		if behind := l.behind(); l.Up() && behind > l.BehindLimit {
			log.Error("usage cache off: the change listener is behind; closed its connection so Postgres's notification queue keeps draining",
				"behind", behind.Round(time.Millisecond), "limit", l.BehindLimit)
			if l.cfg.OnDropped != nil {
				l.cfg.OnDropped()
			}
			l.setState(false)
			l.dropConn()
		}
		id := rand.Text()
		up := l.Up()
		if up { // a listener that is down hears nothing: no probe to wait for
			l.sending(id, time.Now())
		}
		pctx, cancel := context.WithTimeout(ctx, l.ProbeEvery+time.Second)
		var usage, limit float64
		err := l.cfg.Pool.QueryRow(pctx, qProbe, l.cfg.Channel, probePrefix+id+`"}`).Scan(&usage, &limit)
		cancel()
		if up {
			l.committed(id, err == nil)
		}
		if err != nil {
			if ctx.Err() == nil {
				log.Warn("usage cache: probe failed", "err", err)
			}
			continue
		}
		l.queueUsage.Store(math.Float64bits(usage))
		if l.cfg.OnQueueUsage != nil {
			l.cfg.OnQueueUsage(usage)
		}
		switch high := usage >= limit/2; {
		case high:
			lowSince = time.Time{}
			if !l.queueHigh.Load() {
				l.queueHigh.Store(true)
				log.Error("usage cache off: Postgres's notification queue is filling (a listening connection is not reading: look for LISTEN sessions idle in a transaction in pg_stat_activity); past tally.notify_queue_limit ingest stops notifying",
					"queue_usage", usage, "limit", limit)
			}
		case l.queueHigh.Load() && lowSince.IsZero():
			lowSince = time.Now()
		case l.queueHigh.Load() && time.Since(lowSince) >= l.Lease:
			// Drained a while ago (a transaction that skipped its
			// notifications has committed by now): nothing held is known
			// to be true.
			l.forgetAll()
			l.queueHigh.Store(false)
			lowSince = time.Time{}
			log.Info("usage cache on: Postgres's notification queue has drained", "queue_usage", usage)
		}
	}
}
