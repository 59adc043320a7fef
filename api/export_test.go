package api

import (
	"time"

	"github.com/go-chi/chi/v5"
)

// Routes is the router a serves, for TestOpenAPICoversRoutes.
func Routes(a *API) (chi.Routes, bool) {
	r, ok := a.handler.(chi.Routes)
	return r, ok
}

// UsageWatchUp reports whether a's usage cache is in use.
func UsageWatchUp(a *API) bool { return a.watch.epoch.Load()%2 == 0 }

// OnUsageSync calls f with the value of every {"sync": value} notification
// a's listener handles: everything committed before it was sent has been
// handled by then.
func OnUsageSync(a *API, f func(string)) { a.watch.onSync = f }

// Tests ping the usage listener's connection often, so its quiet spells
// are exercised.
func init() { usageWatchPing = 100 * time.Millisecond }

// SlowPositions pauses the usage listener for d after each position it
// applies (0: no pause), widening the window in which a position heard
// before its transaction's customers would show.
func SlowPositions(d time.Duration) { positionDelay.Store(int64(d)) }

// ListenerTimings sets how often a's watchdog probes its change listener,
// how long the listener is trusted after the newest probe it heard was
// sent, and how far behind it may fall before its connection is closed.
// Call it before Run.
func ListenerTimings(a *API, probeEvery, lease, behind time.Duration) {
	a.watch.probeEvery, a.watch.lease, a.watch.behindLimit = probeEvery, lease, behind
}

// HoldListener has a's change listener call f before it handles each
// notification (f blocking: a listener that hangs). Call it before Run.
func HoldListener(a *API, f func()) { a.watch.hold = f }
