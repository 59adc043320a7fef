package api_test

import (
	"bufio"
	"fmt"
	"net"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/tally-ledger/tally/api"
)

// trickle opens a raw connection and sends a request's headers with a
// Content-Length of size, and then one byte of its body every interval
// until stop is closed or the server stops reading: a client too slow on
// purpose (a '{' and then spaces). It returns the connection.
func trickle(t *testing.T, srvURL, head string, size int, interval time.Duration, stop <-chan struct{}) net.Conn {
	t.Helper()
	c, err := net.Dial("tcp", strings.TrimPrefix(srvURL, "http://"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	if _, err := fmt.Fprintf(c, "%sContent-Length: %d\r\n\r\n", head, size); err != nil {
		t.Fatal(err)
	}
	go func() {
		tick := time.NewTicker(interval)
		defer tick.Stop()
		for i := range size {
			select {
			case <-stop:
				return
			case <-tick.C:
			}
			b := []byte(" ") // JSON and form decoders read on through spaces
			if i == 0 {
				b[0] = '{'
			}
			if _, err := c.Write(b); err != nil {
				return
			}
		}
	}()
	return c
}

// TestATricklingBodyHoldsNoSlot: a client that sends its body a byte at a
// time (here a gateway's, whose bodies are read) holds none of the
// MaxInFlight slots while it does, and is answered 408 once BodyTimeout
// has passed, not when the server's ReadTimeout does.
func TestATricklingBodyHoldsNoSlot(t *testing.T) {
	t.Parallel()
	f := newFixtureWith(t, func(c *api.Config) { c.MaxInFlight, c.BodyTimeout = 1, time.Second })
	f.do("PUT", "/v1/customers/acme", adminToken, map[string]any{"cadence": "monthly"})
	stop := make(chan struct{})
	defer close(stop)
	start := time.Now()
	slow := trickle(t, f.srv.URL, "POST /v1/grants HTTP/1.1\r\nHost: tally\r\nContent-Type: application/json\r\n"+
		"Authorization: Bearer "+f.gatewayToken("gw1")+"\r\n", 8000, 50*time.Millisecond, stop)
	time.Sleep(200 * time.Millisecond) // the server has taken it in
	for i := range 5 {
		if r := f.do("GET", "/v1/customers/acme", adminToken, nil); r.status != 200 {
			t.Fatalf("request %d while a body trickles in: %d %s", i, r.status, r.body)
		}
	}
	_ = slow.SetReadDeadline(time.Now().Add(20 * time.Second))
	res, err := http.ReadResponse(bufio.NewReader(slow), nil)
	if err != nil {
		t.Fatalf("the trickling request got no answer: %v", err)
	}
	res.Body.Close()
	if took := time.Since(start); res.StatusCode != http.StatusRequestTimeout || took > 8*time.Second {
		t.Fatalf("the trickling request: %d after %s, want 408 after about 1s", res.StatusCode, took.Round(time.Millisecond))
	}
}

// TestBodiesFromOneAddressAreBounded: an address may have a few request
// bodies arriving at once without the admin or a known gateway token; one
// more is refused 429 at once, while the admin's requests go on.
func TestBodiesFromOneAddressAreBounded(t *testing.T) {
	t.Parallel()
	f := newFixtureWith(t, func(c *api.Config) { c.AddressBodies = 3 })
	stop := make(chan struct{})
	defer close(stop)
	head := "POST /v1/grants HTTP/1.1\r\nHost: tally\r\nContent-Type: application/json\r\nAuthorization: Bearer tly_" + strings.Repeat("A", 43) + "\r\n"
	for range 3 {
		trickle(t, f.srv.URL, head, 8000, 100*time.Millisecond, stop)
	}
	time.Sleep(200 * time.Millisecond)
	fourth := trickle(t, f.srv.URL, head, 8000, 100*time.Millisecond, stop)
	_ = fourth.SetReadDeadline(time.Now().Add(20 * time.Second))
	res, err := http.ReadResponse(bufio.NewReader(fourth), nil)
	if err != nil {
		t.Fatalf("no answer to a fourth body: %v", err)
	}
	res.Body.Close()
	if res.StatusCode != http.StatusTooManyRequests || res.Header.Get("Retry-After") == "" {
		t.Fatalf("a fourth body from one address: %d, want 429 with Retry-After", res.StatusCode)
	}
	if r := f.do("PUT", "/v1/customers/acme", adminToken, map[string]any{"cadence": "monthly"}); r.status != 200 && r.status != 201 {
		t.Fatalf("the admin while the address is at its bound: %d %s", r.status, r.body)
	}
}
