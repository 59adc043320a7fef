package console_test

import (
	"fmt"
	"html"
	"net/http"
	"net/url"
	"strings"
	"testing"
	"time"

	"github.com/shopspring/decimal"

	"github.com/tally-ledger/tally/admission"
	"github.com/tally-ledger/tally/api"
	"github.com/tally-ledger/tally/console"
	"github.com/tally-ledger/tally/quota"
	"github.com/tally-ledger/tally/tokens"
)

func sessionCookie(t *testing.T, res httpPage) *http.Cookie {
	t.Helper()
	for _, c := range (&http.Response{Header: res.header}).Cookies() {
		if c.Name == "tally_console" {
			return c
		}
	}
	t.Fatalf("no session cookie in %v", res.header["Set-Cookie"])
	return nil
}

func TestSessionCookieIsHttpOnlyStrictAndSecureOverTLS(t *testing.T) {
	t.Parallel()
	for _, tls := range []bool{false, true} {
		f := newFixtureTLS(t, tls)
		c := f.client()
		ck := sessionCookie(t, f.signInHTTP(c, adminToken))
		if !ck.HttpOnly || ck.SameSite != http.SameSiteStrictMode || ck.Secure != tls || ck.Path != "/console/" || ck.MaxAge <= 0 {
			t.Fatalf("TLS %v: session cookie %+v, want HttpOnly, SameSite=Strict, Secure only over TLS, Path /console/", tls, ck)
		}
		if len(ck.Value) < 40 {
			t.Fatalf("session id %q is too short to be unguessable", ck.Value)
		}
	}
	// Behind a proxy that terminates TLS: Secure on plain HTTP too.
	f := newFixtureWith(t, false, nil, func(c *console.Config) { c.SecureCookies = true })
	c := f.client()
	csrf := hidden(t, f.get(c, "/console/sign-in").body, "csrf")
	res := f.post(c, "/console/sign-in", url.Values{"csrf": {csrf}, "token": {adminToken}})
	if ck := sessionCookie(t, res); !ck.Secure {
		t.Fatalf("SecureCookies: session cookie %+v is not Secure", ck)
	}
}

func TestEveryPageSetsAContentSecurityPolicy(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	f.demo()
	c := f.client()
	check := func(path string, res httpPage) {
		t.Helper()
		csp := res.header.Get("Content-Security-Policy")
		if !strings.Contains(csp, "default-src 'none'") || strings.Contains(csp, "unsafe") || !strings.Contains(csp, "frame-ancestors 'none'") {
			t.Fatalf("%s (%d): Content-Security-Policy %q", path, res.status, csp)
		}
		if res.header.Get("X-Content-Type-Options") != "nosniff" {
			t.Fatalf("%s: no nosniff", path)
		}
	}
	for _, p := range []string{"/console/sign-in", "/console/", "/console/assets/console.css", "/console/no-such-page"} {
		check(p, f.get(c, p))
	}
	f.signInHTTP(c, adminToken)
	for p, want := range map[string]int{"/console/": 200, "/console/customers": 200, "/console/customers/acme": 200,
		"/console/customers/acme/periods/2026-11-01": 200, "/console/customers/nobody": 404, "/console/reconciliations": 200,
		"/console/dead-letters": 200, "/console/no-such-page": 404} {
		res := f.get(c, p)
		if res.status != want {
			t.Fatalf("%s: %d, want %d: %s", p, res.status, want, res.body)
		}
		check(p, res)
	}
	// The API beside it is untouched.
	if res := f.get(c, "/v1/customers/acme"); res.status != 401 || res.header.Get("Content-Type") != "application/problem+json" {
		t.Fatalf("/v1 without a token: %d %s", res.status, res.header.Get("Content-Type"))
	}
}

func TestSignInRefusesForgedFormsAndBadTokens(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	_, gateway, err := tokens.CreateGateway(f.ctx(), f.pool, "gw-1", "test", f.now)
	if err != nil {
		t.Fatal(err)
	}
	c := f.client()
	csrf := hidden(t, f.get(c, "/console/sign-in").body, "csrf")
	for _, tc := range []struct {
		name   string
		form   url.Values
		site   string
		status int
		says   string
	}{
		{"no CSRF token", url.Values{"token": {adminToken}}, "same-origin", 403, "CSRF"},
		{"a forged CSRF token", url.Values{"token": {adminToken}, "csrf": {"forged"}}, "same-origin", 403, "CSRF"},
		{"sent from another site", url.Values{"token": {adminToken}, "csrf": {csrf}}, "cross-site", 403, "another site"},
		{"an unknown token", url.Values{"token": {"tly_" + strings.Repeat("A", 43)}, "csrf": {csrf}}, "same-origin", 401, "unknown or revoked"},
		{"the admin token, almost", url.Values{"token": {adminToken + "x"}, "csrf": {csrf}}, "same-origin", 401, "unknown or revoked"},
		{"a gateway token", url.Values{"token": {gateway}, "csrf": {csrf}}, "same-origin", 401, "gateway token cannot sign in"},
		{"no token", url.Values{"csrf": {csrf}}, "same-origin", 400, "Enter a token"},
	} {
		res := f.post(c, "/console/sign-in", tc.form, "Sec-Fetch-Site", tc.site)
		if res.status != tc.status || !strings.Contains(res.body, tc.says) {
			t.Errorf("%s: %d, want %d saying %q:\n%s", tc.name, res.status, tc.status, tc.says, res.body)
		}
		for _, ck := range (&http.Response{Header: res.header}).Cookies() {
			if ck.Name == "tally_console" && ck.Value != "" {
				t.Errorf("%s: a session cookie was set", tc.name)
			}
		}
	}
	// A token never comes back in the page.
	res := f.post(c, "/console/sign-in", url.Values{"token": {"tly_secret-that-was-wrong"}, "csrf": {csrf}}, "Sec-Fetch-Site", "same-origin")
	if strings.Contains(res.body, "secret-that-was-wrong") {
		t.Fatal("the sign-in page echoes the token")
	}
}

func TestSignInGoesBackOnlyToTheConsole(t *testing.T) {
	t.Parallel()
	// Limits off: a sign-in per case, more than an address's burst.
	f := newFixtureWith(t, false, func(c *api.Config) { c.AddressRate = -1 },
		func(c *console.Config) { c.SignInsPerToken, c.SignInsPerAddress = -1, -1 })
	for next, want := range map[string]string{
		"/console/dead-letters":        "/console/dead-letters",
		"/console":                     "/console/", // the session cookie's path is /console/
		"//evil.example/x":             "/console/",
		"https://evil.example/console": "/console/",
		"/console//evil.example":       "/console/",
		"/console/\\evil.example":      "/console/",
		// Cleaned before the prefix is checked: dot segments never leave
		// the console, raw or escaped.
		"/console/../v1/ingest/status":     "/console/",
		"/console/%2e%2e/v1/ingest/status": "/console/",
		"/console/./../../v1/x":            "/console/",
		"/console/customers/../":           "/console/",
		"/console/customers/./acme?x=1":    "/console/customers/acme?x=1",
	} {
		c := f.client()
		csrf := hidden(t, f.get(c, "/console/sign-in").body, "csrf")
		res := f.post(c, "/console/sign-in", url.Values{"token": {adminToken}, "csrf": {csrf}, "next": {next}})
		if res.status != http.StatusSeeOther || res.header.Get("Location") != want {
			t.Errorf("next %q: %d to %q, want %q", next, res.status, res.header.Get("Location"), want)
		}
	}
}

func TestRevokingTheTokenEndsItsSessions(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	f.demo()
	tok, secret, err := tokens.Create(f.ctx(), f.pool, "acme", "test", f.now)
	if err != nil {
		t.Fatal(err)
	}
	c := f.client()
	if loc := f.signInHTTP(c, secret).header.Get("Location"); loc != "/console/customers/acme" {
		t.Fatalf("a customer lands on %q", loc)
	}
	if res := f.get(c, "/console/customers/acme"); res.status != 200 {
		t.Fatalf("signed in: %d", res.status)
	}
	if _, err := tokens.Revoke(f.ctx(), f.pool, tok.ID, f.now); err != nil {
		t.Fatal(err)
	}
	res := f.get(c, "/console/customers/acme")
	if res.status != http.StatusSeeOther || !strings.HasPrefix(res.header.Get("Location"), "/console/sign-in") {
		t.Fatalf("after revocation: %d %q, want the sign-in page", res.status, res.header.Get("Location"))
	}
	// And a form sent with the old session is refused, not redirected.
	if res := f.post(c, "/console/sign-out", url.Values{}); res.status != 403 {
		t.Fatalf("POST with an ended session: %d", res.status)
	}
}

func TestTheConsoleIsBehindTheAPIsGuard(t *testing.T) {
	t.Parallel()
	f := newFixtureWith(t, false, func(c *api.Config) { c.AddressRate = 1 }, nil) // bursts of 2
	c := f.client()
	var statuses []int
	for range 4 {
		statuses = append(statuses, f.get(c, "/console/sign-in").status)
	}
	if statuses[0] != 200 || statuses[3] != http.StatusTooManyRequests {
		t.Fatalf("statuses %v: want 200 first, then 429 once the address is over its rate", statuses)
	}
	// Logged like the API's requests, with a fixed route label.
	if logs := f.logs.String(); !strings.Contains(logs, `"path":"/console/sign-in","route":"/console","status":200`) {
		t.Fatalf("no access log line for the console:\n%s", logs)
	}
}

// TestTheGuardsRefusalsCarryTheConsolesHeaders: the API's guard answers
// some console requests itself (an address over its rate, a body too
// large); those answers carry the console's headers like every other.
func TestTheGuardsRefusalsCarryTheConsolesHeaders(t *testing.T) {
	t.Parallel()
	f := newFixtureWith(t, false, func(c *api.Config) { c.AddressRate, c.MaxBodyBytes = 1, 100 }, nil) // bursts of 2
	c := f.client()
	check := func(what string, res httpPage, status int) {
		t.Helper()
		if res.status != status {
			t.Fatalf("%s: %d, want %d: %s", what, res.status, status, res.body)
		}
		for h, want := range map[string]string{"Content-Security-Policy": contentSecurityPolicy,
			"X-Content-Type-Options": "nosniff", "X-Frame-Options": "DENY", "Cache-Control": "no-store"} {
			if got := res.header.Get(h); got != want {
				t.Errorf("%s (%d): %s %q, want %q", what, res.status, h, got, want)
			}
		}
	}
	check("a form body over the API's bound", f.post(c, "/console/sign-in", url.Values{"token": {strings.Repeat("a", 200)}}), http.StatusRequestEntityTooLarge)
	var res httpPage
	for range 4 {
		res = f.get(c, "/console/sign-in")
	}
	check("an address over its rate", res, http.StatusTooManyRequests)
}

const contentSecurityPolicy = "default-src 'none'; style-src 'self'; img-src 'self'; form-action 'self'; " +
	"frame-ancestors 'none'; base-uri 'none'"

func TestCustomerPageShowsBudgetsAndLiveGrants(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	f.calendar("acme", "UTC")
	if _, err := quota.PutRuleDB(f.ctx(), f.pool, quota.RuleInput{Customer: "acme", Meter: "llm_tokens",
		Limit: decimal.RequireFromString("1000000"), Admission: quota.Exact, EffectiveAt: f.now.Add(-time.Hour), Actor: "test"}); err != nil {
		t.Fatal(err)
	}
	store, err := admission.New(f.pool, admission.Config{Now: func() time.Time { return f.now }})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := store.Issue(f.ctx(), admission.IssueRequest{Holder: "gw-eu-1", Generation: 1, Customer: "acme", Meter: "llm_tokens",
		Amount: decimal.RequireFromString("25000.5"), TTL: time.Minute}); err != nil {
		t.Fatal(err)
	}
	c := f.client()
	f.signInHTTP(c, f.customerToken("acme"))
	res := f.get(c, "/console/customers/acme")
	if res.status != 200 {
		t.Fatalf("customer page: %d %s", res.status, res.body)
	}
	for _, want := range []string{
		`<td>llm_tokens</td><td>2026-11-01</td><td class="n">1,000,000</td><td class="n">25,000.5</td><td class="n">974,999.5</td><td class="n">25,000.5</td>`,
		`<td><code>gw-eu-1</code></td><td class="n">25,000.5</td><td class="n">0</td>`,
	} {
		if !strings.Contains(res.body, want) {
			t.Fatalf("the page lacks %s:\n%s", want, res.body)
		}
	}
}

// An exact budget whose rule changed since its last grant shows what its
// period consumed under the version in force, as the next grant finds
// it: the page showed the consumed of the last grant beside the new
// limit, and so more available than there was.
func TestCustomerPageShowsABudgetAsTheRuleInForceFindsIt(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	f.calendar("acme", "UTC")
	clock := func() time.Time { return f.now }
	rule := func(limit string, effective time.Time) {
		t.Helper()
		if _, err := quota.PutRuleDBClock(f.ctx(), f.pool, quota.RuleInput{Customer: "acme", Meter: "llm_tokens",
			Limit: decimal.RequireFromString(limit), Admission: quota.Exact, EffectiveAt: effective, Actor: "test"}, clock); err != nil {
			t.Fatal(err)
		}
	}
	rule("1000", f.now.Add(-time.Hour))
	store, err := admission.New(f.pool, admission.Config{Now: clock})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := store.Issue(f.ctx(), admission.IssueRequest{Holder: "gw-eu-1", Generation: 1, Customer: "acme", Meter: "llm_tokens",
		Amount: decimal.RequireFromString("100"), TTL: time.Hour}); err != nil {
		t.Fatal(err)
	}
	// 300 metered that no grant admitted, then a higher limit.
	f.usage("acme", "llm_tokens", f.now.Add(-time.Minute), "300")
	rule("2000", f.now)
	c := f.client()
	f.signInHTTP(c, f.customerToken("acme"))
	res := f.get(c, "/console/customers/acme")
	if res.status != 200 {
		t.Fatalf("customer page: %d %s", res.status, res.body)
	}
	want := `<td>llm_tokens</td><td>2026-11-01</td><td class="n">2,000</td><td class="n">400</td><td class="n">1,600</td><td class="n">100</td>`
	if !strings.Contains(res.body, want) {
		t.Fatalf("the page lacks %s:\n%s", want, res.body)
	}
}

// A run lists at most a bound of findings of each kind and counts the
// rest in one summary finding: the run's page counts a kind's findings
// with those the summary stands for, and says when its amount is of the
// findings listed only.
func TestReconciliationPageCountsFindingsNotListed(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	id := "019a3c8e-7a40-7000-8000-0000000000f2"
	for _, q := range []string{
		`INSERT INTO reconciliation_runs (id, period, status, started_at, finished_at)
		 VALUES ($1, '2026-10-01', 'discrepancies', '2026-11-20T02:30:00Z', '2026-11-20T02:31:00Z')`,
		`INSERT INTO reconciliation_findings (run_id, n, kind, severity, customer, meter, stream, amount, detail, omitted) VALUES
		 ($1, 0, 'stream_total_mismatch', 'discrepancy', 'acme', 'api_calls', 'gw/1', 1, 'listed', NULL),
		 ($1, 1, 'open_gap', 'notice', 'acme', 'api_calls', 'gw/1', 2, 'listed', NULL),
		 ($1, 2, 'stream_total_mismatch', 'discrepancy', NULL, NULL, NULL, NULL, '12345 more stream_total_mismatch findings (discrepancy) not listed', 12345)`,
	} {
		if _, err := f.pool.Exec(f.ctx(), q, id); err != nil {
			t.Fatal(err)
		}
	}
	c := f.client()
	f.signInHTTP(c, adminToken)
	res := f.get(c, "/console/reconciliations/"+id)
	if res.status != 200 {
		t.Fatalf("run page: %d %s", res.status, res.body)
	}
	for _, want := range []string{
		`<td>discrepancy</td><td>stream_total_mismatch</td><td class="n">12,346</td><td class="n">1 (of those listed)</td>`,
		`<td>notice</td><td>open_gap</td><td class="n">1</td><td class="n">2</td>`,
	} {
		if !strings.Contains(res.body, want) {
			t.Fatalf("the page lacks %s:\n%s", want, res.body)
		}
	}
}

// TestCustomersNextPageContinuesAfterIdsWithColons: customer ids may hold
// ':' ("tenant:42"); the list's "Next page" link carries the last id of
// the page exactly, so the next page starts after it instead of at the
// beginning again.
func TestCustomersNextPageContinuesAfterIdsWithColons(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	for i := range 201 { // a page is 200
		f.calendar(fmt.Sprintf("tenant:%03d", i), "UTC")
	}
	c := f.client()
	f.signInHTTP(c, adminToken)
	first := f.get(c, "/console/customers")
	i := strings.Index(first.body, `href="/console/customers?after=`)
	if first.status != 200 || i < 0 {
		t.Fatalf("first page: %d, no next page link:\n%s", first.status, first.body)
	}
	link := first.body[i+len(`href="`):]
	link = html.UnescapeString(link[:strings.IndexByte(link, '"')])
	second := f.get(c, link)
	if second.status != 200 || !strings.Contains(second.body, ">tenant:200<") || strings.Contains(second.body, ">tenant:000<") {
		t.Fatalf("next page %s: %d, want only tenant:200:\n%s", link, second.status, second.body)
	}
}

// TestConsoleWithoutTheSlashIsTheConsole: /console (as typed, without the
// slash) leads a signed-in browser to the overview, not back to the
// sign-in page: the session cookie's path is /console/, which a browser
// does not send for /console.
func TestConsoleWithoutTheSlashIsTheConsole(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	f.calendar("acme", "UTC")
	for _, token := range []string{adminToken, f.customerToken("acme")} {
		c := f.client()
		c.CheckRedirect = nil // follow, as a browser does
		res := f.get(c, "/console")
		if res.status != 200 || !strings.Contains(res.body, `name="token"`) {
			t.Fatalf("signed out, /console: %d, want the sign-in form:\n%s", res.status, res.body)
		}
		res = f.post(c, "/console/sign-in", url.Values{"csrf": {hidden(t, res.body, "csrf")}, "token": {token},
			"next": {hidden(t, res.body, "next")}}, "Sec-Fetch-Site", "same-origin")
		if res.status != 200 || strings.Contains(res.body, `name="token"`) || !strings.Contains(res.body, "Sign out") {
			t.Fatalf("signed in from /console: %d, want a console page:\n%s", res.status, res.body)
		}
		if res := f.get(c, "/console"); res.status != 200 || strings.Contains(res.body, `name="token"`) {
			t.Fatalf("signed in, /console: %d, want a console page:\n%s", res.status, res.body)
		}
	}
}
