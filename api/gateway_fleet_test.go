package api_test

import (
	"encoding/json"
	"fmt"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/tally-ledger/tally/api"
)

// TestAGatewayFleetBehindOneAddressIsNotRateLimited: twenty holders behind
// one address, under the default settings, race for one budget through
// REST (issue, renew, release, as fast as they can): none is refused 429
// or 503. The per-address limit is for floods of made-up tokens; a
// gateway's grant traffic has its own per-token limit, and a 429 on a
// renew or release would strand capacity for the period.
//
// Whether the defaults' 100/s is exceeded depends on the machine's speed,
// so the same race runs with the address's bucket nearly empty too: a
// burst of 25 that never refills covers each holder's first request (a
// gateway token is trusted once this process has verified it), and every
// request after those would be refused if the address's limit applied.
func TestAGatewayFleetBehindOneAddressIsNotRateLimited(t *testing.T) {
	t.Parallel()
	t.Run("defaults", func(t *testing.T) {
		t.Parallel()
		gatewayFleet(t, nil)
	})
	t.Run("address-nearly-spent", func(t *testing.T) {
		t.Parallel()
		gatewayFleet(t, func(c *api.Config) { c.AddressRate, c.AddressBurst = 0.0001, 25 })
	})
}

// gatewayFleet races twenty holders from one address for one budget on
// an API configured by configure, and fails on any 429 or 5xx.
func gatewayFleet(t *testing.T, configure func(*api.Config)) {
	f := newFixtureWith(t, configure)
	if r := f.do("PUT", "/v1/customers/acme/quotas/tokens", adminToken, map[string]any{"limit": "500", "admission": "exact"}); r.status != 201 {
		t.Fatalf("rule: %d %s", r.status, r.body)
	}
	const holders = 20
	toks := make([]string, holders)
	for i := range toks {
		toks[i] = f.gatewayToken(fmt.Sprintf("gw%d", i))
	}
	var requests, issued, exhausted atomic.Int64
	var mu sync.Mutex
	var refused []string
	note := func(what string, r response) {
		requests.Add(1)
		if r.status == 429 || r.status >= 500 {
			mu.Lock()
			refused = append(refused, fmt.Sprintf("%s: %d %s", what, r.status, r.body))
			mu.Unlock()
		}
	}
	// Each holder tries 20 times to issue, renew and release (giving back
	// what it did not spend, so the budget keeps changing hands; 20 holders
	// asking for 30 each want more than the 500): 400 to 1200 requests as
	// fast as they go, far over the address's burst of 200 and rate of 100/s.
	var wg sync.WaitGroup
	start := time.Now()
	for i := range holders {
		wg.Go(func() {
			holder := fmt.Sprintf("gw%d", i)
			for range 20 {
				r := f.do("POST", "/v1/grants", toks[i], map[string]any{"holder": holder, "generation": 1, "customer": "acme",
					"meter": "tokens", "amount": "30", "min_amount": "1", "ttl": "30s"})
				note("issue", r)
				if r.status == 409 {
					exhausted.Add(1)
					continue
				}
				if r.status != 201 {
					continue
				}
				issued.Add(1)
				var g struct {
					ID     string `json:"id"`
					Amount string `json:"amount"`
				}
				if err := json.Unmarshal(r.body, &g); err != nil {
					t.Errorf("grant: %v", err)
					return
				}
				note("renew", f.do("POST", "/v1/grants/"+g.ID+"/renew", toks[i], map[string]any{"holder": holder, "generation": 1, "spent": "0"}))
				note("release", f.do("POST", "/v1/grants/"+g.ID+"/release", toks[i], map[string]any{"holder": holder, "generation": 1, "spent": "1"}))
			}
		})
	}
	wg.Wait()
	took := time.Since(start)
	if len(refused) > 0 {
		t.Fatalf("%d of %d requests refused for load, e.g. %s", len(refused), requests.Load(), refused[0])
	}
	if issued.Load() == 0 {
		t.Fatalf("%d requests and no grant issued", requests.Load())
	}
	t.Logf("%d requests in %s from one address (%.0f/s): %d grants issued, %d refused as exhausted, none for load",
		requests.Load(), took.Round(time.Millisecond), float64(requests.Load())/took.Seconds(), issued.Load(), exhausted.Load())
}

// TestGatewayTokensHaveTheirOwnLimit: a gateway token is limited by the
// gateway limit, sized for the grant protocol, not by the customer read
// limit: a gateway starting up for 60 customers asks for 60 grants at
// once under the defaults and none is refused. Over its own limit it is
// answered 429 with Retry-After, and another gateway is not.
func TestGatewayTokensHaveTheirOwnLimit(t *testing.T) {
	t.Parallel()
	t.Run("defaults", func(t *testing.T) {
		t.Parallel()
		f := newFixture(t)
		gw := f.gatewayToken("gw1")
		for i := range 60 {
			c := fmt.Sprintf("c%02d", i)
			f.do("PUT", "/v1/customers/"+c+"/quotas/tokens", adminToken, map[string]any{"limit": "100", "admission": "exact"})
		}
		var wg sync.WaitGroup
		statuses := make([]int, 60)
		for i := range 60 {
			wg.Go(func() {
				statuses[i] = f.do("POST", "/v1/grants", gw, map[string]any{"holder": "gw1", "generation": 1,
					"customer": fmt.Sprintf("c%02d", i), "meter": "tokens", "amount": "10"}).status
			})
		}
		wg.Wait()
		for i, s := range statuses {
			if s != 201 {
				t.Fatalf("grant %d of 60 at once: %d", i, s)
			}
		}
	})
	t.Run("over", func(t *testing.T) {
		t.Parallel()
		f := newFixtureWith(t, func(c *api.Config) { c.GatewayRate, c.GatewayBurst, c.TokenRate = 0.01, 2, 1000 })
		f.do("PUT", "/v1/customers/acme/quotas/tokens", adminToken, map[string]any{"limit": "100", "admission": "exact"})
		gw1, gw2 := f.gatewayToken("gw1"), f.gatewayToken("gw2")
		grant := func(tok, holder string) response {
			return f.do("POST", "/v1/grants", tok, map[string]any{"holder": holder, "generation": 1, "customer": "acme", "meter": "tokens", "amount": "1"})
		}
		for range 2 {
			if r := grant(gw1, "gw1"); r.status != 201 {
				t.Fatalf("%d %s", r.status, r.body)
			}
		}
		r := grant(gw1, "gw1")
		r.problem(t, 429, api.TypeRateLimited)
		if s, err := strconv.Atoi(r.header.Get("Retry-After")); err != nil || s < 60 {
			t.Fatalf("Retry-After %q, want about 100", r.header.Get("Retry-After"))
		}
		if r := grant(gw2, "gw2"); r.status != 201 {
			t.Fatalf("another gateway: %d %s", r.status, r.body)
		}
	})
}
