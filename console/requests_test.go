package console_test

import (
	"net/http"
	"net/url"
	"slices"
	"strings"
	"testing"

	"github.com/tally-ledger/tally/api"
	"github.com/tally-ledger/tally/console"
)

// TestPagesClipWhatTheyEchoOfTheRequest: a 404 page names the customer,
// period or page asked for, clipped to the longest id (128 characters)
// with an ellipsis: a 10,000-character id is not sent back whole, to the
// admin or to a customer. The sign-in form does not carry a 10,000-character
// next back either.
func TestPagesClipWhatTheyEchoOfTheRequest(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	f.calendar("acme", "UTC")
	long := strings.Repeat("x", 10_000)
	admin, acme := f.client(), f.client()
	f.signInHTTP(admin, adminToken)
	f.signInHTTP(acme, f.customerToken("acme"))
	for _, tc := range []struct {
		name string
		c    *http.Client
		path string
	}{
		{"an unknown customer, to the admin", admin, "/console/customers/" + long},
		{"another customer, to a customer", acme, "/console/customers/" + long},
		{"a statement of an unknown customer", admin, "/console/customers/" + long + "/periods/2026-11-01"},
		{"a statement of an unknown period", admin, "/console/customers/acme/periods/" + long},
		{"a customer page of an unknown period", admin, "/console/customers/acme?period=" + long},
		{"a customer's own page of an unknown period", acme, "/console/customers/acme?period=" + long},
	} {
		res := f.get(tc.c, tc.path)
		if res.status != http.StatusNotFound {
			t.Errorf("%s: %d, want 404", tc.name, res.status)
		}
		if strings.Contains(res.body, strings.Repeat("x", 129)) || !strings.Contains(res.body, strings.Repeat("x", 127)+"…") {
			t.Errorf("%s: the page does not clip what it echoes to 128 characters (%d bytes)", tc.name, len(res.body))
		}
	}
	res := f.get(f.client(), "/console/sign-in?next="+url.QueryEscape("/console/customers/"+long))
	if res.status != http.StatusOK || strings.Contains(res.body, long) {
		t.Errorf("the sign-in page with a 10,000-character next: %d, next %d bytes", res.status, len(hidden(t, res.body, "next")))
	}
}

// TestHeadIsAnsweredAsGet: HEAD on a console page, an asset or a page
// that does not exist answers as GET does (status, Content-Type, where a
// redirect goes), without a body; signed out, a page's HEAD is sent to
// sign in as its GET is.
func TestHeadIsAnsweredAsGet(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	f.calendar("acme", "UTC")
	admin := f.client()
	f.signInHTTP(admin, adminToken)
	head := func(c *http.Client, path string) httpPage {
		t.Helper()
		req, _ := http.NewRequest("HEAD", f.srv.URL+path, nil)
		return f.send(c, req)
	}
	for _, tc := range []struct {
		c      *http.Client
		who    string
		path   string
		status int
	}{
		{f.client(), "signed out", "/console/sign-in", 200},
		{f.client(), "signed out", "/console/", 303},
		{f.client(), "signed out", "/console", 301},
		{f.client(), "signed out", "/console/assets/console.css", 200},
		{f.client(), "signed out", "/console/assets/favicon.svg", 200},
		{f.client(), "signed out", "/console/no-such-page", 404},
		{admin, "the admin", "/console/", 200},
		{admin, "the admin", "/console/customers", 200},
		{admin, "the admin", "/console/customers/acme", 200},
		{admin, "the admin", "/console/customers/acme/periods/2026-11-01", 200},
		{admin, "the admin", "/console/customers/nobody", 404},
		{admin, "the admin", "/console/reconciliations", 200},
		{admin, "the admin", "/console/dead-letters", 200},
		{admin, "the admin", "/console/alerts", 200},
	} {
		get, h := f.get(tc.c, tc.path), head(tc.c, tc.path)
		if get.status != tc.status || h.status != tc.status {
			t.Errorf("%s, %s: GET %d, HEAD %d, want %d", tc.who, tc.path, get.status, h.status, tc.status)
		}
		if h.body != "" {
			t.Errorf("%s, HEAD %s has a body", tc.who, tc.path)
		}
		for _, k := range []string{"Content-Type", "Location", "Content-Security-Policy"} {
			if g, hv := get.header.Get(k), h.header.Get(k); g != hv {
				t.Errorf("%s, %s: %s GET %q, HEAD %q", tc.who, tc.path, k, g, hv)
			}
		}
	}
}

// TestFormsFromElsewhereDoNotUseUpSignIns: sign-in forms that fail the
// CSRF check (sent from another site, or without the form's value) are
// refused 403 and do not count against the address's sign-in limit: a
// page on another site cannot lock a user out of signing in. Real
// attempts still do.
func TestFormsFromElsewhereDoNotUseUpSignIns(t *testing.T) {
	t.Parallel()
	f := newFixtureWith(t, false, nil, func(c *console.Config) { c.SignInsPerToken, c.SignInsPerAddress = 1000, 3 })
	c := f.client()
	csrf := hidden(t, f.get(c, "/console/sign-in").body, "csrf")
	for i := range 10 {
		form := url.Values{"token": {"tly_" + strings.Repeat("A", 43)}, "next": {"/console/"}}
		site := "cross-site"
		if i%2 == 1 {
			site = "same-origin" // without the form's CSRF value
		} else {
			form.Set("csrf", csrf)
		}
		if res := f.post(c, "/console/sign-in", form, "Sec-Fetch-Site", site); res.status != http.StatusForbidden {
			t.Fatalf("forged form %d (%s): %d, want 403", i, site, res.status)
		}
	}
	if res := f.signInStatus(f.client(), adminToken); res.status != http.StatusSeeOther {
		t.Fatalf("a real sign-in after ten forged forms: %d, want 303", res.status)
	}
	for i := range 2 {
		if res := f.signInStatus(f.client(), "tly_"+strings.Repeat("B", 43)); res.status != http.StatusUnauthorized {
			t.Fatalf("wrong token %d: %d, want 401", i, res.status)
		}
	}
	if res := f.signInStatus(f.client(), adminToken); res.status != http.StatusTooManyRequests {
		t.Fatalf("a fourth real sign-in from the address: %d, want 429", res.status)
	}
}

// TestFormsFromElsewhereDoNotUseUpTheTokensRate: a signed-in viewer's
// forms that fail the CSRF check (a sibling site's page posting with the
// session cookie, or a form without its value) are refused 403 and take
// nothing from the token's per-token limit, which its REST requests share.
func TestFormsFromElsewhereDoNotUseUpTheTokensRate(t *testing.T) {
	t.Parallel()
	f := newFixtureWith(t, false, func(c *api.Config) { c.TokenRate, c.TokenBurst = 0.01, 5 }, nil)
	f.calendar("acme", "UTC")
	tok := f.customerToken("acme")
	c := f.client()
	f.signInHTTP(c, tok) // 1 of the burst
	for i := range 10 {
		form, site := url.Values{"csrf": {"forged"}}, "same-origin"
		if i%2 == 0 {
			form, site = url.Values{}, "same-site"
		}
		if res := f.post(c, "/console/sign-out", form, "Sec-Fetch-Site", site); res.status != http.StatusForbidden {
			t.Fatalf("forged form %d (%s): %d, want 403", i, site, res.status)
		}
	}
	for i := range 4 {
		req, _ := http.NewRequest("GET", f.srv.URL+"/v1/customers/acme", nil)
		req.Header.Set("Authorization", "Bearer "+tok)
		if res := f.send(f.client(), req); res.status != 200 {
			t.Fatalf("REST request %d after ten forged forms: %d, want 200 (4 of the burst left)", i, res.status)
		}
	}
}

// TestAssetsAreServedOnlyByName: the stylesheet and the icon are served,
// to GET and HEAD; the assets directory is the console's 404 page, not a
// listing of its files, however it is spelt; another method is 405.
func TestAssetsAreServedOnlyByName(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	c := f.client()
	for _, p := range []string{"/console/assets/console.css", "/console/assets/favicon.svg"} {
		if res := f.get(c, p); res.status != 200 || res.header.Get("Cache-Control") != "public, max-age=300" {
			t.Errorf("%s: %d, Cache-Control %q", p, res.status, res.header.Get("Cache-Control"))
		}
	}
	for _, p := range []string{"/console/assets/", "/console/assets", "/console/assets//", "/console/assets/./",
		"/console/assets/index.html", "/console/assets/nope.css", "/console/assets/console.css/"} {
		res := f.get(c, p)
		if strings.Contains(res.body, `<a href="favicon.svg">`) || strings.Contains(res.body, "<pre>") {
			t.Errorf("%s lists the assets: %d\n%s", p, res.status, res.body)
		}
		if res.status != http.StatusNotFound && res.status != http.StatusMovedPermanently {
			t.Errorf("%s: %d, want 404", p, res.status)
		}
		if res.status == http.StatusNotFound && !strings.Contains(res.body, "There is no console page at this address.") {
			t.Errorf("%s: not the console's 404 page:\n%s", p, res.body)
		}
	}
	res := f.post(c, "/console/assets/console.css", url.Values{}, "Sec-Fetch-Site", "same-origin")
	if res.status != http.StatusMethodNotAllowed {
		t.Errorf("POST /console/assets/console.css: %d, want 405", res.status)
	}
}

// TestConsole405HasAllow: the console's 405 page lists in Allow what the
// page takes (RFC 9110 §15.5.6), a made-up method included; an address no
// page serves is the 404 page whatever the method.
func TestConsole405HasAllow(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	c := f.client()
	for _, tt := range []struct {
		method, path string
		allow        []string
	}{
		{"POST", "/console/customers", []string{"GET", "HEAD"}},
		{"DELETE", "/console/sign-in", []string{"GET", "HEAD", "POST"}},
		{"POST", "/console/assets/console.css", []string{"GET", "HEAD"}},
		{"GET", "/console/sign-out", []string{"POST"}},
		{"FROB", "/console/customers/acme", []string{"GET", "HEAD"}},
	} {
		req, _ := http.NewRequest(tt.method, f.srv.URL+tt.path, nil)
		req.Header.Set("Sec-Fetch-Site", "same-origin")
		res := f.send(c, req)
		if res.status != http.StatusMethodNotAllowed || !slices.Equal(res.header.Values("Allow"), tt.allow) {
			t.Errorf("%s %s: %d, Allow %v, want 405 with %v", tt.method, tt.path, res.status, res.header.Values("Allow"), tt.allow)
		}
	}
	for _, m := range []string{"POST", "FROB"} {
		req, _ := http.NewRequest(m, f.srv.URL+"/console/no-such-page", nil)
		req.Header.Set("Sec-Fetch-Site", "same-origin")
		if res := f.send(c, req); res.status != http.StatusNotFound || res.header.Values("Allow") != nil {
			t.Errorf("%s /console/no-such-page: %d, Allow %v, want 404", m, res.status, res.header.Values("Allow"))
		}
	}
}
