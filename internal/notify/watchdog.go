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
// (migration 00012). A trigger reads the limit of the writer's session,
// which may be set per database and role: the lowest set for any role in
// this database, if below this session's, is the one that holds.
const qProbe = `SELECT pg_notification_queue_usage(),
       least(coalesce(nullif(current_setting('tally.notify_queue_limit', true), '')::float8, 0.5),
             (SELECT min(nullif(substr(c, length('tally.notify_queue_limit=') + 1), '')::float8)
              FROM pg_db_role_setting s CROSS JOIN unnest(s.setconfig) c
              WHERE s.setdatabase IN (0, (SELECT oid FROM pg_database WHERE datname = current_database()))
                AND c LIKE 'tally.notify\_queue\_limit=%'))
FROM (SELECT pg_notify($1, $2)) probe`

// qRunningAt is the transactions running now (a pg_snapshot's text): a
// transaction that wrote while the queue was filling skipped its
// notifications, and is among them if it has not ended yet.
const qRunningAt = `SELECT pg_current_snapshot()::text`

// qEnded reports whether every transaction running at snapshot $1 has
// ended (committed or rolled back).
const qEnded = `SELECT coalesce(bool_and(pg_xact_status(x) IS DISTINCT FROM 'in progress'), true)
FROM pg_snapshot_xip($1::pg_snapshot) x`

// drain is the watchdog's way back from a filling queue: when the queue
// was first seen low again, and the transactions running then. Any
// transaction whose writes skipped their notifications ran while the
// queue was high, so it had ended or was running then; subscribers may
// trust what they read once it has ended (its changes are visible and
// they forget everything read before), not earlier: a long transaction
// that commits after the queue drained would otherwise change answers
// nobody is told of.
type drain struct {
	since   time.Time // zero: the queue is not (known to be) low again
	running string    // pg_snapshot text; "" until read
	logged  bool      // the wait for them was logged
}

// drained reports whether the queue has been low for a lease and every
// transaction that may have skipped its notifications has ended.
func (l *Listener) drained(ctx context.Context, d *drain) (bool, error) {
	if d.running == "" {
		if err := l.cfg.Pool.QueryRow(ctx, qRunningAt).Scan(&d.running); err != nil {
			return false, err
		}
	}
	if time.Since(d.since) < l.Lease {
		return false, nil
	}
	var ended bool
	if err := l.cfg.Pool.QueryRow(ctx, qEnded, d.running).Scan(&ended); err != nil {
		return false, err
	}
	if !ended && !d.logged {
		d.logged = true
		l.cfg.Logger.Warn("usage cache still off: Postgres's notification queue is low again; waiting for the transactions that ran while it was filling to end (they sent no notifications)",
			"running_then", d.running)
	}
	return ended, nil
}

// watchdog probes the listener until ctx ends (see the package doc).
func (l *Listener) watchdog(ctx context.Context) {
	log := l.cfg.Logger
	t := time.NewTicker(l.ProbeEvery)
	defer t.Stop()
	var low drain // the queue below the limit again
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
			low = drain{}
			if !l.queueHigh.Load() {
				l.queueHigh.Store(true)
				log.Error("usage cache off: Postgres's notification queue is filling (a listening connection is not reading: look for LISTEN sessions idle in a transaction in pg_stat_activity); past tally.notify_queue_limit ingest stops notifying",
					"queue_usage", usage, "limit", limit)
			}
		case l.queueHigh.Load():
			if low.since.IsZero() {
				low.since = time.Now()
			}
			qctx, cancel := context.WithTimeout(ctx, l.ProbeEvery+time.Second)
			ok, err := l.drained(qctx, &low)
			cancel()
			if err != nil {
				if ctx.Err() == nil {
					log.Warn("usage cache: reading the transactions running failed", "err", err)
				}
				continue
			}
			if !ok {
				continue
			}
			// Drained, and what was written unnotified is committed or
			// gone: nothing held is known to be true.
			l.forgetAll()
			l.queueHigh.Store(false)
			low = drain{}
			log.Info("usage cache on: Postgres's notification queue has drained", "queue_usage", usage)
		}
	}
}
