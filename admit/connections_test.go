package admit_test

import (
	"context"
	"fmt"
	"net/http"
	"sync"
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/tally-ledger/tally/admit"
)

// A gateway asks for grants for many customers at once (one request in
// flight per budget). With the Config's default HTTP client, the
// connections one such wave opened must serve the next: a gateway that
// reconnects for most grant requests pays a TCP (and, in production, TLS)
// handshake on each, which is the admission latency of a request waiting
// for a grant.
func TestDefaultClientKeepsItsConnectionsForTheNextGrants(t *testing.T) {
	ts := startTally(t)
	const wave = 16
	for i := range 2 * wave {
		ts.exactRule(fmt.Sprintf("cust-%02d", i), "tokens", "1000000")
	}
	c := newClient(t, ts, "gw", t.TempDir(), admit.Config{})
	defer c.Close(context.Background())

	// Each wave holds its grant requests until all of them are in flight,
	// so that it needs wave connections at once, and notes where each came
	// from (a connection is a client address).
	var mu sync.Mutex
	var arrived int
	var all chan struct{}
	from := map[string]int{} // client address → wave that first used it
	current := 0
	hold := func(r *http.Request) int {
		if r.URL.Path != "/v1/grants" {
			return 0
		}
		mu.Lock()
		if _, seen := from[r.RemoteAddr]; !seen {
			from[r.RemoteAddr] = current
		}
		arrived++
		if arrived == wave {
			close(all)
		}
		ch := all
		mu.Unlock()
		select {
		case <-ch:
		case <-time.After(30 * time.Second):
			t.Errorf("only %d of %d grant requests arrived together", arrived, wave)
		}
		return 0
	}
	ts.refuse.Store(&hold)

	for w := range 2 {
		mu.Lock()
		current, arrived, all = w, 0, make(chan struct{})
		mu.Unlock()
		var wg sync.WaitGroup
		for i := range wave {
			customer := fmt.Sprintf("cust-%02d", w*wave+i)
			wg.Go(func() {
				d, err := c.Admit(context.Background(), customer, "tokens", 1)
				if err != nil || !d.Admitted || d.How != admit.FromGrant {
					t.Errorf("%s: %+v, %v", customer, d, err)
				}
			})
		}
		wg.Wait()
	}
	mu.Lock()
	defer mu.Unlock()
	opened := [2]int{}
	for _, w := range from {
		opened[w]++
	}
	if opened[0] < wave {
		t.Fatalf("the first wave of %d grant requests in flight together came over %d connections", wave, opened[0])
	}
	// The background loop's own calls (renewals, reports) may hold a
	// connection while the second wave arrives: a new one or two is that.
	if opened[1] > 2 {
		t.Fatalf("the second wave of %d grant requests opened %d new connections; the first wave's %d were not kept",
			wave, opened[1], opened[0])
	}
}

// Closing a client built with the default HTTP client closes its
// connections to Tally: nothing of it is left running.
func TestCloseLeavesNoConnectionOpen(t *testing.T) {
	ts := startTally(t)
	ts.exactRule("acme", "tokens", "1000")
	before := goleak.IgnoreCurrent()
	c := newClient(t, ts, "gw", t.TempDir(), admit.Config{})
	if d, err := c.Admit(context.Background(), "acme", "tokens", 1); err != nil || !d.Admitted {
		t.Fatalf("%+v, %v", d, err)
	}
	if err := c.Close(context.Background()); err != nil {
		t.Fatal(err)
	}
	goleak.VerifyNone(t, before)
}
