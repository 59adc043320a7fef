package api_test

import (
	"net/http"
	"slices"
	"testing"
)

// HEAD is answered wherever GET is, with GET's status and headers and no
// body: load balancers health-check with HEAD, and a 405 marked the node
// down. It goes through GET's checks (a /v1 route without a token is 401)
// and a path without GET still answers 405, listing what it allows.
func TestHeadWhereverGet(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	f.usage("acme", "calls", date("2026-11-20T10:00:00Z"), "5")
	for _, c := range []struct {
		path, token string
		status      int
	}{
		{"/healthz", "", 200},
		{"/readyz", "", 0}, // whatever GET answers
		{"/openapi.json", "", 200},
		{"/metrics", adminToken, 200},
		{"/v1/customers/acme", adminToken, 200},
		{"/v1/customers/acme/usage?meter=calls", adminToken, 200},
		{"/v1/customers/acme/usage?metre=calls", adminToken, 400},
		{"/v1/customers/nobody", adminToken, 404},
		{"/v1/customers/acme", "", 401},
		{"/v1/meters", adminToken, 200},
	} {
		get := f.do("GET", c.path, c.token, nil)
		head := f.do("HEAD", c.path, c.token, nil)
		want := c.status
		if want == 0 {
			want = get.status
		}
		if get.status != want || head.status != want {
			t.Errorf("%s: GET %d, HEAD %d, want %d: %s", c.path, get.status, head.status, want, head.body)
		}
		if len(head.body) != 0 {
			t.Errorf("HEAD %s has a body: %s", c.path, head.body)
		}
		if g, h := get.header.Get("Content-Type"), head.header.Get("Content-Type"); g != h {
			t.Errorf("%s: Content-Type GET %q, HEAD %q", c.path, g, h)
		}
	}
	r := f.do("HEAD", "/v1/adjustments", adminToken, nil)
	if r.status != http.StatusMethodNotAllowed || !slices.Equal(r.header.Values("Allow"), []string{"POST"}) {
		t.Errorf("HEAD /v1/adjustments: %d, Allow %v", r.status, r.header.Values("Allow"))
	}
	r = f.do("DELETE", "/healthz", "", nil)
	if r.status != http.StatusMethodNotAllowed || !slices.Equal(r.header.Values("Allow"), []string{"GET", "HEAD"}) {
		t.Errorf("DELETE /healthz: %d, Allow %v", r.status, r.header.Values("Allow"))
	}
}

// TestEvery405HasAllow: a 405 lists in Allow what the path takes (RFC 9110
// §15.5.6), a made-up method included; a path no route serves is 404
// whatever the method, never a 405 allowing nothing.
func TestEvery405HasAllow(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	for _, c := range []struct {
		method, path string
		allow        []string
	}{
		{"DELETE", "/openapi.json", []string{"GET", "HEAD"}},
		{"OPTIONS", "/healthz", []string{"GET", "HEAD"}},
		{"FROB", "/healthz", []string{"GET", "HEAD"}},
		{"PATCH", "/v1/alerts/a", []string{"GET", "HEAD", "PUT", "DELETE"}},
		{"FROB", "/v1/alerts/a", []string{"GET", "HEAD", "PUT", "DELETE"}},
	} {
		r := f.do(c.method, c.path, adminToken, nil)
		if r.status != http.StatusMethodNotAllowed || !slices.Equal(r.header.Values("Allow"), c.allow) {
			t.Errorf("%s %s: %d, Allow %v, want 405 with %v", c.method, c.path, r.status, r.header.Values("Allow"), c.allow)
		}
	}
	for _, m := range []string{"GET", "DELETE", "FROB"} {
		r := f.do(m, "/no-such-path", adminToken, nil)
		if r.status != http.StatusNotFound || r.header.Values("Allow") != nil {
			t.Errorf("%s /no-such-path: %d, Allow %v, want 404", m, r.status, r.header.Values("Allow"))
		}
	}
}
