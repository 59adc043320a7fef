package console_test

import (
	"encoding/json"
	"net/http"
	"net/url"
	"strings"
	"testing"
	"time"

	"github.com/go-chi/chi/v5"

	"github.com/tally-ledger/tally/api"
	"github.com/tally-ledger/tally/console"
	"github.com/tally-ledger/tally/tokens"
)

// pageAccess is who may see a console route.
type pageAccess int

const (
	open         pageAccess = iota // anyone
	signedIn                       // any session
	adminPage                      // the admin's session
	adminHome                      // the admin's; a customer is sent to its own page
	customerPage                   // the admin's, or the path's customer's own
)

// pageRow is one console route: its method and pattern as the router has
// them, who may use it, its path ({c}: the side's customer, {dead}: a
// stored dead letter) and form ("" for a GET; the session's CSRF token is
// added), and the status an allowed viewer gets.
type pageRow struct {
	route  string
	access pageAccess
	path   string
	form   string
	ok     int
}

// pageRows has one row per console route: TestConsoleAuthorizationMatrix
// fails when the router has a route without one.
var pageRows = []pageRow{
	{"GET /console/assets/*", open, "/console/assets/console.css", "", 200},
	{"GET /console/sign-in", open, "/console/sign-in", "", 200},
	{"POST /console/sign-in", open, "/console/sign-in", "token=x", 403}, // no sign-in CSRF value: refused for all
	{"POST /console/sign-out", signedIn, "/console/sign-out", "x=1", 303},
	{"GET /console/", adminHome, "/console/", "", 200},
	{"GET /console/customers", adminHome, "/console/customers", "", 200},
	{"GET /console/customers/{customer}", customerPage, "/console/customers/{c}", "", 200},
	{"GET /console/customers/{customer}/periods/{period}", customerPage, "/console/customers/{c}/periods/2026-11-01", "", 200},
	{"GET /console/reconciliations", adminPage, "/console/reconciliations", "", 200},
	{"GET /console/reconciliations/{id}", adminPage, "/console/reconciliations/{rec}", "", 200},
	{"GET /console/dead-letters", adminPage, "/console/dead-letters", "", 200},
	{"GET /console/dead-letters/{id}", adminPage, "/console/dead-letters/{dead}", "", 200},
	{"POST /console/dead-letters/{id}/replay", adminPage, "/console/dead-letters/{dead}/replay", "confirm=no", 400},
	{"GET /console/alerts", adminPage, "/console/alerts", "", 200},
}

// TestConsoleAuthorizationMatrix: every console route × every kind of
// viewer (no session, a made-up session cookie, a session whose token was
// revoked, the admin, two customers) × its own and another customer's
// pages answers as docs/console.md says, and every route has a row.
func TestConsoleAuthorizationMatrix(t *testing.T) {
	t.Parallel()
	// Limits off: this is about who may see what, not how often.
	f := newFixtureWith(t, false, func(c *api.Config) { c.AddressRate, c.TokenRate = -1, -1 },
		func(c *console.Config) { c.SignInsPerToken, c.SignInsPerAddress = -1, -1 })
	c, err := console.New(console.Config{API: f.api, Pool: f.pool, Clock: func() time.Time { return f.now }})
	if err != nil {
		t.Fatal(err)
	}
	routes, _ := console.Routes(c)
	rows := map[string]bool{}
	for _, row := range pageRows {
		rows[row.route] = true
	}
	var missing []string
	_ = chi.Walk(routes, func(method, route string, _ http.Handler, _ ...func(http.Handler) http.Handler) error {
		route = strings.ReplaceAll(route, "/*/", "/")
		if !rows[method+" "+route] {
			missing = append(missing, method+" "+route)
		}
		return nil
	})
	if len(missing) > 0 {
		t.Fatalf("console routes without a row in pageRows: %v", missing)
	}

	f.calendar("acme", "UTC")
	f.calendar("globex", "UTC")
	dead := f.deadLetter("bad_json", "", "unexpected end of JSON", "acme", []byte("x"))
	req, _ := http.NewRequest("POST", f.srv.URL+"/v1/reconciliations", strings.NewReader(`{"period":"2026-10-01"}`))
	req.Header.Set("Authorization", "Bearer "+adminToken)
	req.Header.Set("Content-Type", "application/json")
	run := f.send(f.client(), req)
	if run.status != 201 {
		t.Fatalf("a reconciliation: %d %s", run.status, run.body)
	}
	var created struct{ ID string }
	if err := json.Unmarshal([]byte(run.body), &created); err != nil {
		t.Fatal(err)
	}
	rec := created.ID
	type viewer struct {
		name     string
		token    string
		client   *http.Client
		admin    bool
		customer string
		out      bool // no live session
	}
	signed := func(token string) *http.Client {
		cl := f.client()
		f.signInHTTP(cl, token)
		return cl
	}
	forged := f.client()
	u, _ := url.Parse(f.srv.URL + "/console/")
	forged.Jar.SetCookies(u, []*http.Cookie{{Name: "tally_console", Value: strings.Repeat("A", 52), Path: "/console/"}})
	revokedTok, revokedSecret, err := tokens.Create(f.ctx(), f.pool, "acme", "revoked", f.now)
	if err != nil {
		t.Fatal(err)
	}
	revoked := signed(revokedSecret)
	if _, err := tokens.Revoke(f.ctx(), f.pool, revokedTok.ID, f.now); err != nil {
		t.Fatal(err)
	}
	acme, globex := f.customerToken("acme"), f.customerToken("globex")
	viewers := []viewer{
		{name: "no session", client: f.client(), out: true},
		{name: "made-up session", client: forged, out: true},
		{name: "revoked", client: revoked, out: true},
		{name: "admin", token: adminToken, client: signed(adminToken), admin: true},
		{name: "customer acme", token: acme, client: signed(acme), customer: "acme"},
		{name: "customer globex", token: globex, client: signed(globex), customer: "globex"},
	}
	// A session's CSRF token, from any page it may see.
	csrf := func(v viewer) string {
		if v.out {
			return "none"
		}
		p := "/console/"
		if !v.admin {
			p = "/console/customers/" + v.customer
		}
		return hidden(t, f.get(v.client, p).body, "csrf")
	}
	cells := 0
	for _, row := range pageRows {
		method, _, _ := strings.Cut(row.route, " ")
		for _, v := range viewers {
			for _, side := range []string{"acme", "globex"} {
				path := strings.NewReplacer("{c}", side, "{dead}", dead.String(), "{rec}", rec).Replace(row.path)
				cl := v.client
				if row.route == "POST /console/sign-out" && !v.out {
					cl = signed(v.token) // a session of its own to end
				}
				v := v
				v.client = cl
				var res httpPage
				if method == http.MethodGet {
					res = f.get(v.client, path)
				} else {
					form, _ := url.ParseQuery(row.form)
					form.Set("csrf", csrf(v))
					res = f.post(v.client, path, form, "Sec-Fetch-Site", "same-origin")
				}
				want := row.ok
				switch {
				case row.access == open:
				case v.out && method == http.MethodGet:
					want = http.StatusSeeOther // to the sign-in page
				case v.out:
					want = http.StatusForbidden // signed out: the form is refused
				case row.access == adminPage && !v.admin:
					want = http.StatusForbidden
				case row.access == adminHome && !v.admin:
					want = http.StatusSeeOther
					if loc := res.header.Get("Location"); loc != "/console/customers/"+v.customer {
						t.Errorf("%s as %s: to %q, want its own page", row.route, v.name, loc)
					}
				case row.access == customerPage && !v.admin && v.customer != side:
					want = http.StatusNotFound
				}
				if res.status != want || (want == http.StatusSeeOther && v.out && !strings.HasPrefix(res.header.Get("Location"), "/console/sign-in")) {
					t.Errorf("%s as %s on %s: %d (Location %q), want %d", row.route, v.name, side, res.status, res.header.Get("Location"), want)
				}
				cells++
			}
		}
	}
	t.Logf("%d console routes × %d viewers × 2 customers: %d cells", len(pageRows), len(viewers), cells)
}
