package notify

import (
	"testing"
	"time"
)

// TestLiveness: the listener is live while it has heard a probe this
// process sent within the lease; a forged probe proves nothing; it is
// behind by the age of the oldest committed probe it has not heard.
func TestLiveness(t *testing.T) {
	l := New(Config{})
	if l.Up() || l.Epoch()%2 != 1 {
		t.Fatal("up before Run")
	}
	l.setState(true)
	if !l.Up() || !l.Live() {
		t.Fatal("not live once up")
	}
	l.alive.Store(time.Now().Add(-l.Lease).UnixNano())
	if l.Live() {
		t.Fatal("live with no probe heard within the lease")
	}
	l.heard("forged")
	if l.Live() {
		t.Fatal("a probe this process did not send made the listener live")
	}
	l.sending("p", time.Now().Add(-time.Minute))
	if l.behind() != 0 {
		t.Fatal("behind on a probe whose NOTIFY has not committed")
	}
	l.committed("p", true)
	if b := l.behind(); b < time.Minute {
		t.Fatalf("behind %s, want a minute", b)
	}
	l.sending("q", time.Now())
	l.committed("q", true)
	l.heard("q")
	if !l.Live() || l.behind() != 0 {
		t.Fatalf("live %v, behind %s after the newest probe was heard", l.Live(), l.behind())
	}
	l.heard("q") // a replay: nothing
	l.queueHigh.Store(true)
	if l.Live() {
		t.Fatal("live while the queue is filling")
	}
	l.queueHigh.Store(false)
	e := l.Epoch()
	l.setState(false)
	if l.Up() || l.Epoch() == e {
		t.Fatal("still up")
	}
}
