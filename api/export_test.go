package api

import (
	"net/url"
	"time"

	"github.com/go-chi/chi/v5"
)

// Routes is the router a serves, for TestOpenAPICoversRoutes.
func Routes(a *API) (chi.Routes, bool) {
	r, ok := a.handler.(chi.Routes)
	return r, ok
}

// UsageWatchUp reports whether a's usage cache is in use.
func UsageWatchUp(a *API) bool { return a.listener.Up() }

// OnUsageSync calls f with the value of every {"sync": value} notification
// a's listener handles: everything committed before it was sent has been
// handled by then.
func OnUsageSync(a *API, f func(string)) { a.watch.onSync = f }

// PingEvery sets how long a's listener waits quietly before it pings its
// connection (tests ping often, so quiet spells are exercised). Call it
// before Run.
func PingEvery(a *API, d time.Duration) { a.listener.PingEvery = d }

// SlowPositions pauses a's usage listener for d after each read of the
// positions it starts using, widening the window in which a position used
// before its transaction's customers were forgotten would show. Call it
// before Run.
func SlowPositions(a *API, d time.Duration) { a.watch.positionDelay = d }

// ListenerTimings sets how often a's watchdog probes its change listener,
// how long the listener is trusted after the newest probe it heard was
// sent, and how far behind it may fall before its connection is closed.
// Call it before Run.
func ListenerTimings(a *API, probeEvery, lease, behind time.Duration) {
	a.listener.ProbeEvery, a.listener.Lease, a.listener.BehindLimit = probeEvery, lease, behind
}

// HoldListener has a's change listener call f before it handles each
// notification (f blocking: a listener that hangs). Call it before Run.
func HoldListener(a *API, f func()) { a.listener.Hold = f }

// ReadyFor is how long /readyz reuses its answer.
const ReadyFor = readyFor

// CursorFor makes the cursor that reads on after key in the list that
// target (a path and query, such as "/v1/reconciliations?period=current")
// requests, as if a page of it had returned it.
func CursorFor(target string, key ...string) string {
	u, err := url.Parse(target)
	if err != nil {
		panic(err)
	}
	q := map[string]string{}
	for k, vs := range u.Query() {
		q[k] = vs[0]
	}
	return encodeCursor(listTag(u.Path, q), key...)
}
