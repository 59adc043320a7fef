package console_test

import (
	"bufio"
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/tally-ledger/tally/api"
	"github.com/tally-ledger/tally/tokens"
)

// TestTricklingClientsDoNotSlowGrants: 200 connections without a token
// send the console's sign-in form (and grant requests with a made-up
// token) a byte at a time, reconnecting a second after they are answered,
// while 50 gateways take grants. No grant is refused, and the grants' p99
// stays within 3× of an unloaded run measured in the same test: a
// trickling body holds none of the in-flight slots the grant path needs.
// Under the default settings the address may send 8 bodies at once and
// the rest are refused 429 at once; without that bound all 200 are held
// trickling, and grants still do not notice.
func TestTricklingClientsDoNotSlowGrants(t *testing.T) {
	t.Run("defaults", func(t *testing.T) { tricklingClientsDoNotSlowGrants(t, nil, 1) })
	t.Run("all-held", func(t *testing.T) {
		// No bound per address, and a body timeout longer than the test:
		// every connection stays open, trickling, while grants are taken.
		tricklingClientsDoNotSlowGrants(t, func(c *api.Config) { c.AddressBodies, c.BodyTimeout = -1, time.Minute }, 190)
	})
}

// tricklingClientsDoNotSlowGrants runs the attack against an API
// configured by configure; at least held attacking connections must be
// open at once while the gateways take grants.
func tricklingClientsDoNotSlowGrants(t *testing.T, configure func(*api.Config), held int64) {
	f := newFixtureWith(t, false, configure, nil)
	admin := f.client()
	put, _ := http.NewRequest("PUT", f.srv.URL+"/v1/customers/acme/quotas/tokens",
		strings.NewReader(`{"limit": "1000000000", "admission": "exact"}`))
	put.Header.Set("Authorization", "Bearer "+adminToken)
	put.Header.Set("Content-Type", "application/json")
	if res := f.send(admin, put); res.status != 201 {
		t.Fatalf("exact rule: %d %s", res.status, res.body)
	}
	const gateways, perGateway = 50, 10
	toks := make([]string, gateways)
	for i := range toks {
		_, secret, err := tokens.CreateGateway(f.ctx(), f.pool, fmt.Sprintf("gw%d", i), "test", f.now)
		if err != nil {
			t.Fatal(err)
		}
		toks[i] = secret
	}
	client := &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: gateways}}
	defer client.CloseIdleConnections()
	// grants has every gateway take perGateway grants one after another,
	// and returns the p99 of their latencies and every answer that was not
	// 201.
	grants := func() (time.Duration, []string) {
		var mu sync.Mutex
		var took []time.Duration
		var failed []string
		var wg sync.WaitGroup
		for i := range gateways {
			wg.Go(func() {
				for range perGateway {
					body, _ := json.Marshal(map[string]any{"holder": fmt.Sprintf("gw%d", i), "generation": 1,
						"customer": "acme", "meter": "tokens", "amount": "1", "ttl": "30s"})
					req, _ := http.NewRequest("POST", f.srv.URL+"/v1/grants", bytes.NewReader(body))
					req.Header.Set("Authorization", "Bearer "+toks[i])
					req.Header.Set("Content-Type", "application/json")
					start := time.Now()
					res, err := client.Do(req)
					var b []byte
					if err == nil {
						b, _ = io.ReadAll(res.Body)
						res.Body.Close()
					}
					d := time.Since(start)
					mu.Lock()
					took = append(took, d)
					if err != nil {
						failed = append(failed, err.Error())
					} else if res.StatusCode != 201 {
						failed = append(failed, fmt.Sprintf("%d %s", res.StatusCode, b))
					}
					mu.Unlock()
				}
			})
		}
		wg.Wait()
		slices.Sort(took)
		return took[len(took)*99/100], failed
	}
	grants() // warm: connections, caches, the gateways' first requests

	// The attack: each connection sends headers announcing an 8000-byte
	// body, then a byte every 500 ms; answered or cut, it connects again
	// after a second.
	var dials, open atomic.Int64
	made := "tly_" + strings.Repeat("Z", 43)
	heads := []string{
		"POST /console/sign-in HTTP/1.1\r\nHost: tally\r\nContent-Type: application/x-www-form-urlencoded\r\n",
		"POST /console/sign-in HTTP/1.1\r\nHost: tally\r\nContent-Type: application/x-www-form-urlencoded\r\n",
		"POST /console/sign-in HTTP/1.1\r\nHost: tally\r\nContent-Type: application/x-www-form-urlencoded\r\n",
		"POST /v1/grants HTTP/1.1\r\nHost: tally\r\nContent-Type: application/json\r\nAuthorization: Bearer " + made + "\r\n",
	}
	attack := func(head string, stop <-chan struct{}) {
		for {
			select {
			case <-stop:
				return
			default:
			}
			c, err := net.Dial("tcp", strings.TrimPrefix(f.srv.URL, "http://"))
			if err != nil {
				t.Errorf("attacker: %v", err)
				return
			}
			dials.Add(1)
			open.Add(1)
			answered := make(chan struct{})
			go func() {
				defer close(answered)
				if res, err := http.ReadResponse(bufio.NewReader(c), nil); err == nil {
					res.Body.Close()
				}
			}()
			fmt.Fprintf(c, "%sContent-Length: 8000\r\n\r\n", head)
			tick := time.NewTicker(500 * time.Millisecond)
		trickle:
			for range 8000 {
				select {
				case <-stop:
					break trickle
				case <-answered:
					break trickle
				case <-tick.C:
					if _, err := c.Write([]byte(" ")); err != nil {
						break trickle
					}
				}
			}
			tick.Stop()
			c.Close()
			<-answered
			open.Add(-1)
			select {
			case <-stop:
				return
			case <-time.After(time.Second):
			}
		}
	}
	// start begins the attack and returns once 200 connections were made;
	// the function it returns ends it.
	start := func() func() {
		stop := make(chan struct{})
		var wg sync.WaitGroup
		from := dials.Load()
		for i := range 200 {
			wg.Go(func() { attack(heads[i%len(heads)], stop) })
		}
		end := func() { close(stop); wg.Wait() }
		for deadline := time.Now().Add(10 * time.Second); dials.Load()-from < 200; time.Sleep(10 * time.Millisecond) {
			if time.Now().After(deadline) {
				end()
				t.Fatalf("only %d attacking connections after 10s", dials.Load()-from)
			}
		}
		time.Sleep(500 * time.Millisecond) // bodies trickling in
		return end
	}

	// Timings on a shared machine are noisy: an unloaded and a loaded run
	// side by side, up to three times; any refusal fails at once.
	var rounds []string
	for round := range 3 {
		base, failed := grants()
		if len(failed) > 0 {
			t.Fatalf("round %d, unloaded: %d grants refused, e.g. %s", round, len(failed), failed[0])
		}
		end := start()
		peak := make(chan int64)
		stopPeak := make(chan struct{})
		go func() { // the most attacking connections open at once while grants are taken
			var n int64
			for {
				n = max(n, open.Load())
				select {
				case <-stopPeak:
					peak <- n
					return
				case <-time.After(5 * time.Millisecond):
				}
			}
		}()
		loaded, failed := grants()
		close(stopPeak)
		opened := <-peak
		end()
		if len(failed) > 0 {
			t.Fatalf("round %d, with %d attacking connections open: %d of %d grants refused, e.g. %s",
				round, opened, len(failed), gateways*perGateway, failed[0])
		}
		if opened < held {
			t.Fatalf("round %d: at most %d attacking connections open while the grants were taken, want at least %d", round, opened, held)
		}
		rounds = append(rounds, fmt.Sprintf("p99 %s unloaded, %s with %d attacking connections open (%.2f×)",
			base.Round(time.Microsecond), loaded.Round(time.Microsecond), opened, float64(loaded)/float64(base)))
		if loaded <= 3*base {
			t.Logf("grants: %s; %d attacking connections made", rounds[len(rounds)-1], dials.Load())
			return
		}
	}
	t.Fatalf("grant p99 more than 3× the unloaded one in every round: %s", strings.Join(rounds, "; "))
}
