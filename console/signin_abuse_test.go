package console_test

import (
	"math"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"testing"

	"github.com/tally-ledger/tally/console"
)

// signInStatus signs c in with token, as a browser would, and returns the
// answer to the form (303 when signed in).
func (f *fixture) signInStatus(c *http.Client, token string) httpPage {
	f.t.Helper()
	form := f.get(c, "/console/sign-in")
	return f.post(c, "/console/sign-in", url.Values{"csrf": {hidden(f.t, form.body, "csrf")}, "token": {token},
		"next": {"/console/"}}, "Sec-Fetch-Site", "same-origin")
}

// TestOneTokensSignInsNeverEndAnothersSessions: the session table is
// full of one customer token's sessions, and more of its sign-ins end
// only its own oldest; the admin's session lives on. When the table is
// full, a sign-in is refused rather than ending anyone's session.
func TestOneTokensSignInsNeverEndAnothersSessions(t *testing.T) {
	t.Parallel()
	f := newFixtureWith(t, false, nil, func(c *console.Config) { c.MaxSessions, c.MaxSessionsPerToken = 4, 2 })
	f.calendar("acme", "UTC")
	admin := f.client()
	f.signInHTTP(admin, adminToken)
	acme := f.customerToken("acme")
	var clients []*http.Client
	for i := range 6 {
		c := f.client()
		if res := f.signInStatus(c, acme); res.status != http.StatusSeeOther {
			t.Fatalf("sign-in %d: %d %s", i, res.status, res.body)
		}
		clients = append(clients, c)
	}
	if res := f.get(admin, "/console/"); res.status != 200 {
		t.Fatalf("the admin after a customer's sign-ins: %d", res.status)
	}
	for i, c := range clients {
		want := http.StatusSeeOther // ended: sent to sign in
		if i >= 4 {
			want = 200 // the token's two newest
		}
		if res := f.get(c, "/console/customers/acme"); res.status != want {
			t.Fatalf("customer session %d: %d, want %d", i, res.status, want)
		}
	}
	// 3 sessions; one more token fills the table; the next is refused.
	second := f.customerToken("acme")
	if res := f.signInStatus(f.client(), second); res.status != http.StatusSeeOther {
		t.Fatalf("a second token: %d %s", res.status, res.body)
	}
	res := f.signInStatus(f.client(), f.customerToken("acme"))
	if res.status != http.StatusServiceUnavailable || res.header.Get("Retry-After") == "" {
		t.Fatalf("a sign-in with the table full: %d, want 503 with Retry-After", res.status)
	}
	if res := f.get(admin, "/console/"); res.status != 200 {
		t.Fatalf("the admin with the table full: %d", res.status)
	}
}

// TestSignInsAreLimitedPerTokenAndAddress: sign-ins with one token, right
// or wrong, are limited per token; sign-ins from one address are limited
// per address; both answer 429 with Retry-After, and another token signs
// in while one is over its limit.
func TestSignInsAreLimitedPerTokenAndAddress(t *testing.T) {
	t.Parallel()
	t.Run("token", func(t *testing.T) {
		t.Parallel()
		f := newFixtureWith(t, false, nil, func(c *console.Config) { c.SignInsPerToken, c.SignInsPerAddress = 3, 1000 })
		acme := f.customerToken("acme")
		for i := range 3 {
			if res := f.signInStatus(f.client(), acme); res.status != http.StatusSeeOther {
				t.Fatalf("sign-in %d: %d", i, res.status)
			}
		}
		res := f.signInStatus(f.client(), acme)
		if s, err := strconv.Atoi(res.header.Get("Retry-After")); res.status != http.StatusTooManyRequests || err != nil || s < 1 {
			t.Fatalf("a fourth sign-in with one token: %d, Retry-After %q", res.status, res.header.Get("Retry-After"))
		}
		if res := f.signInStatus(f.client(), f.customerToken("acme")); res.status != http.StatusSeeOther {
			t.Fatalf("another token: %d", res.status)
		}
	})
	t.Run("address", func(t *testing.T) {
		t.Parallel()
		f := newFixtureWith(t, false, nil, func(c *console.Config) { c.SignInsPerToken, c.SignInsPerAddress = 1000, 3 })
		for i := range 3 {
			if res := f.signInStatus(f.client(), "tly_"+strings.Repeat(strconv.Itoa(i), 43)); res.status != http.StatusUnauthorized {
				t.Fatalf("sign-in %d with a made-up token: %d", i, res.status)
			}
		}
		if res := f.signInStatus(f.client(), adminToken); res.status != http.StatusTooManyRequests || res.header.Get("Retry-After") == "" {
			t.Fatalf("a fourth sign-in from one address: %d, want 429", res.status)
		}
	})
}

// TestTheServerChoosesTheSignInCSRFValue: a sign-in cookie the client
// planted (one the server did not issue) is replaced, and a form carrying
// the planted value is refused.
func TestTheServerChoosesTheSignInCSRFValue(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	planted := strings.Repeat("A", 26)
	u, _ := url.Parse(f.srv.URL + "/console/sign-in")
	c := f.client()
	c.Jar.SetCookies(u, []*http.Cookie{{Name: "tally_console_sign_in", Value: planted, Path: "/console/sign-in"}})
	if got := hidden(t, f.get(c, "/console/sign-in").body, "csrf"); got == planted {
		t.Fatal("the sign-in page took the client's cookie as its CSRF value")
	}
	c2 := f.client()
	c2.Jar.SetCookies(u, []*http.Cookie{{Name: "tally_console_sign_in", Value: planted, Path: "/console/sign-in"}})
	res := f.post(c2, "/console/sign-in", url.Values{"csrf": {planted}, "token": {adminToken}, "next": {"/console/"}})
	if res.status != http.StatusForbidden {
		t.Fatalf("a sign-in with a planted CSRF value: %d, want 403", res.status)
	}
}

// TestSignInRatesMustBeFinite: a sign-in rate of NaN or ±Inf is refused by
// New naming its field, not handed to the rate limiter (0 is the default,
// a negative rate turns the limit off).
func TestSignInRatesMustBeFinite(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	for _, v := range []float64{math.NaN(), math.Inf(1), math.Inf(-1)} {
		for field, set := range map[string]func(*console.Config){
			"SignInsPerToken":   func(c *console.Config) { c.SignInsPerToken = v },
			"SignInsPerAddress": func(c *console.Config) { c.SignInsPerAddress = v },
		} {
			cfg := console.Config{API: f.api, Pool: f.pool}
			set(&cfg)
			if _, err := console.New(cfg); err == nil || !strings.Contains(err.Error(), field) {
				t.Errorf("New with %s %v: %v, want an error naming %s", field, v, err, field)
			}
		}
	}
}
