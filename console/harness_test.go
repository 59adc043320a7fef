package console_test

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/http/cookiejar"
	"net/http/httptest"
	"net/url"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/chromedp/chromedp"
	"github.com/google/uuid"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/shopspring/decimal"

	"github.com/tally-ledger/tally/api"
	"github.com/tally-ledger/tally/console"
	"github.com/tally-ledger/tally/internal/ledgertest"
	"github.com/tally-ledger/tally/internal/pgtest"
	"github.com/tally-ledger/tally/internal/testrun"
	"github.com/tally-ledger/tally/ledger"
	"github.com/tally-ledger/tally/periods"
	"github.com/tally-ledger/tally/quota"
	"github.com/tally-ledger/tally/tokens"
)

const adminToken = "admin-token-for-console-tests-0123456789"

// fixture is the API and the console of one process over their own
// database, served over HTTP, on a fixed clock.
type fixture struct {
	t      testing.TB
	pool   *pgxpool.Pool
	ledger *ledger.Ledger
	api    *api.API
	srv    *httptest.Server
	logs   *testrun.Buffer
	now    time.Time

	streams *ledgertest.Streams // customer/meter → its one stream
}

var testNow = time.Date(2026, 11, 20, 12, 0, 0, 0, time.UTC)

func newFixture(t *testing.T) *fixture {
	return newFixtureTLS(t, false)
}

func newFixtureTLS(t *testing.T, tls bool) *fixture {
	return newFixtureWith(t, tls, nil, nil)
}

// newFixtureWith lets a test change the API's and the console's
// configuration.
func newFixtureWith(t testing.TB, tls bool, configureAPI func(*api.Config), configure func(*console.Config)) *fixture {
	t.Helper()
	f := &fixture{t: t, pool: pgtest.New(t), logs: testrun.Logs(t), now: testNow}
	clock := func() time.Time { return f.now }
	log := slog.New(slog.NewJSONHandler(f.logs, nil))
	l, err := ledger.New(ledger.Config{Clock: clock})
	if err != nil {
		t.Fatal(err)
	}
	f.ledger = l
	f.streams = ledgertest.New(f.pool, l)
	// Caches off: without api.Run nothing would tell them about the
	// tests' writes and revocations.
	apiCfg := api.Config{Pool: f.pool, Ledger: l, AdminToken: adminToken, Clock: clock, Logger: log,
		Registry: prometheus.NewRegistry(), UsageCacheTTL: -1, TokenCacheTTL: -1}
	if configureAPI != nil {
		configureAPI(&apiCfg)
	}
	h, err := api.New(apiCfg)
	if err != nil {
		t.Fatal(err)
	}
	f.api = h
	cfg := console.Config{API: h, Pool: f.pool, Clock: clock, Logger: log, Registerer: prometheus.NewRegistry()}
	if configure != nil {
		configure(&cfg)
	}
	c, err := console.New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	if tls {
		f.srv = httptest.NewTLSServer(c.Beside(h))
	} else {
		f.srv = httptest.NewServer(c.Beside(h))
	}
	t.Cleanup(f.srv.Close)
	return f
}

func (f *fixture) ctx() context.Context { return context.Background() }

// calendar gives customer a monthly calendar in zone.
func (f *fixture) calendar(customer, zone string) {
	f.t.Helper()
	if _, _, err := (periods.Store{}).SetCalendar(f.ctx(), f.pool, customer,
		periods.Calendar{Cadence: periods.Monthly, AnchorDay: 1, AnchorTime: "00:00", Zone: zone}); err != nil {
		f.t.Fatal(err)
	}
}

// usage books qty for customer/meter at t through the ledger.
func (f *fixture) usage(customer, meter string, t time.Time, qty string) {
	f.t.Helper()
	f.streams.Use(f.t, customer, meter, t, decimal.RequireFromString(qty))
}

// quota sets customer's limit on meter.
func (f *fixture) quota(customer, meter, limit string) {
	f.t.Helper()
	if _, err := quota.PutRuleDB(f.ctx(), f.pool, quota.RuleInput{Customer: customer, Meter: meter,
		Limit: decimal.RequireFromString(limit), EffectiveAt: f.now.Add(-30 * 24 * time.Hour), Actor: "test",
		Reason: "operator note <i>not for customers</i>"}); err != nil {
		f.t.Fatal(err)
	}
}

// deadLetter stores a dead letter with key and raw bytes and returns its id.
func (f *fixture) deadLetter(reason, field, detail, key string, raw []byte) uuid.UUID {
	f.t.Helper()
	id := uuid.Must(uuid.NewV7())
	if _, err := f.pool.Exec(f.ctx(), `INSERT INTO dead_letters (id, topic, partition, "offset", reason, field, detail, key, raw, created_at)
		VALUES ($1, 'tally.meter-batches', 0, (SELECT count(*) FROM dead_letters), $2, nullif($3, ''), $4, $5, $6, $7)`,
		id, reason, field, detail, key, raw, f.now.Add(-time.Hour)); err != nil {
		f.t.Fatal(err)
	}
	return id
}

func (f *fixture) customerToken(customer string) string {
	f.t.Helper()
	_, secret, err := tokens.Create(f.ctx(), f.pool, customer, "console test", f.now)
	if err != nil {
		f.t.Fatal(err)
	}
	return secret
}

// rest GETs a REST path with token and decodes the JSON answer into v.
func (f *fixture) rest(path, token string, v any) {
	f.t.Helper()
	req, _ := http.NewRequest("GET", f.srv.URL+path, nil)
	req.Header.Set("Authorization", "Bearer "+token)
	res, err := f.srv.Client().Do(req)
	if err != nil {
		f.t.Fatal(err)
	}
	defer res.Body.Close()
	b, _ := io.ReadAll(res.Body)
	if res.StatusCode != 200 {
		f.t.Fatalf("GET %s: %d %s", path, res.StatusCode, b)
	}
	if err := json.Unmarshal(b, v); err != nil {
		f.t.Fatalf("GET %s: %v", path, err)
	}
}

// client is an HTTP client with its own cookie jar that does not follow
// redirects (tests read them).
func (f *fixture) client() *http.Client {
	jar, _ := cookiejar.New(nil)
	c := *f.srv.Client()
	c.Jar = jar
	c.CheckRedirect = func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }
	return &c
}

type httpPage struct {
	status int
	header http.Header
	body   string
}

func (f *fixture) get(c *http.Client, path string, header ...string) httpPage {
	f.t.Helper()
	req, _ := http.NewRequest("GET", f.srv.URL+path, nil)
	for i := 0; i+1 < len(header); i += 2 {
		req.Header.Set(header[i], header[i+1])
	}
	return f.send(c, req)
}

func (f *fixture) post(c *http.Client, path string, form url.Values, header ...string) httpPage {
	f.t.Helper()
	req, _ := http.NewRequest("POST", f.srv.URL+path, strings.NewReader(form.Encode()))
	req.Header.Set("Content-Type", "application/x-www-form-urlencoded")
	for i := 0; i+1 < len(header); i += 2 {
		req.Header.Set(header[i], header[i+1])
	}
	return f.send(c, req)
}

func (f *fixture) send(c *http.Client, req *http.Request) httpPage {
	f.t.Helper()
	res, err := c.Do(req)
	if err != nil {
		f.t.Fatal(err)
	}
	defer res.Body.Close()
	b, _ := io.ReadAll(res.Body)
	return httpPage{status: res.StatusCode, header: res.Header, body: string(b)}
}

// hidden is the value of the hidden input name in an HTML page.
func hidden(t testing.TB, body, name string) string {
	t.Helper()
	marker := `name="` + name + `" value="`
	i := strings.Index(body, marker)
	if i < 0 {
		t.Fatalf("no hidden %s in the page:\n%s", name, body)
	}
	rest := body[i+len(marker):]
	return rest[:strings.IndexByte(rest, '"')]
}

// signInHTTP signs in c with token as a browser would and returns the
// session's CSRF token (from the landing page).
func (f *fixture) signInHTTP(c *http.Client, token string) httpPage {
	f.t.Helper()
	form := f.get(c, "/console/sign-in")
	res := f.post(c, "/console/sign-in", url.Values{"csrf": {hidden(f.t, form.body, "csrf")}, "token": {token},
		"next": {"/console/"}}, "Sec-Fetch-Site", "same-origin")
	if res.status != http.StatusSeeOther {
		f.t.Fatalf("sign-in: %d %s", res.status, res.body)
	}
	return res
}

// The browser: one headless Chromium for the package, started by the
// first test that needs it; each test gets a tab in a browser context of
// its own (its own cookies).
var browser struct {
	once   sync.Once
	ctx    context.Context
	cancel func()
	err    error
	shots  string // screenshots go here
}

// chromiumPath is Debian's chromium; TALLY_CHROMIUM names another.
func chromiumPath() string {
	if p := os.Getenv("TALLY_CHROMIUM"); p != "" {
		return p
	}
	return "/usr/bin/chromium"
}

func startBrowser() {
	dir, err := os.MkdirTemp("", "tally-console-chromium-")
	if err != nil {
		browser.err = err
		return
	}
	browser.shots, err = os.MkdirTemp("", "tally-console-screenshots-")
	if err != nil {
		browser.err = err
		return
	}
	alloc, cancelAlloc := chromedp.NewExecAllocator(context.Background(),
		chromedp.ExecPath(chromiumPath()),
		chromedp.Headless, chromedp.NoSandbox, chromedp.DisableGPU, chromedp.NoFirstRun,
		chromedp.Flag("disable-background-networking", true),
		chromedp.Flag("disable-component-update", true),
		chromedp.Flag("disable-sync", true),
		chromedp.Flag("disable-dev-shm-usage", true),
		chromedp.UserDataDir(dir),
		chromedp.WindowSize(1280, 900),
	)
	ctx, cancelCtx := chromedp.NewContext(alloc)
	browser.ctx = ctx
	browser.cancel = func() {
		cancelCtx()
		cancelAlloc()
		_ = os.RemoveAll(dir)
	}
	start, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	done := make(chan error, 1)
	go func() { done <- chromedp.Do(ctx) }() // starts the browser; no timeout on its own context
	select {
	case browser.err = <-done:
	case <-start.Done():
		browser.err = fmt.Errorf("chromium did not start in 60s")
	}
	if browser.err != nil {
		browser.err = fmt.Errorf("start %s: %w (Debian: apt-get install chromium; or set TALLY_CHROMIUM)", chromiumPath(), browser.err)
	}
}

func TestMain(m *testing.M) {
	code := m.Run()
	if browser.cancel != nil {
		browser.cancel()
	}
	os.Exit(code)
}

// tab is a new tab in a fresh browser context (no cookies), for one test.
// A test that needs the browser fails when it cannot start it.
func tab(t *testing.T) context.Context {
	t.Helper()
	browser.once.Do(startBrowser)
	if browser.err != nil {
		t.Fatalf("the browser tests need Chromium: %v", browser.err)
	}
	ctx, cancel := chromedp.NewContext(browser.ctx, chromedp.WithNewBrowserContext())
	t.Cleanup(cancel)
	if err := chromedp.Do(ctx); err != nil { // opens the tab
		t.Fatalf("open a tab: %v", err)
	}
	tctx, cancelT := context.WithTimeout(ctx, 90*time.Second)
	t.Cleanup(cancelT)
	return tctx
}

// do runs browser actions or fails the test.
func do(t *testing.T, ctx context.Context, steps ...chromedp.Action[chromedp.Void]) {
	t.Helper()
	if err := chromedp.Do(ctx, steps...); err != nil {
		t.Fatalf("browser: %v", err)
	}
}

// run runs one browser action that returns a value.
func run[T any](t *testing.T, ctx context.Context, a chromedp.Action[T]) T {
	t.Helper()
	v, err := chromedp.Run(ctx, a)
	if err != nil {
		t.Fatalf("browser: %v", err)
	}
	return v
}

// open navigates to path and returns the HTTP status of the page.
func (f *fixture) open(t *testing.T, ctx context.Context, path string) int64 {
	t.Helper()
	res := run(t, ctx, chromedp.NavigateResponse(f.srv.URL+path))
	return res.Status
}

// signIn signs in through the sign-in form and returns where it landed.
func (f *fixture) signIn(t *testing.T, ctx context.Context, token string) string {
	t.Helper()
	if s := f.open(t, ctx, "/console/"); s != 200 {
		t.Fatalf("sign-in page: status %d", s)
	}
	if loc := run(t, ctx, chromedp.Location()); !strings.Contains(loc, "/console/sign-in") {
		t.Fatalf("signed out, /console/ went to %s, not the sign-in page", loc)
	}
	accessible(t, ctx)
	do(t, ctx, chromedp.SendKeys(chromedp.CSS("#token"), token))
	res, err := chromedp.RunResponse(ctx, chromedp.Click(chromedp.CSS(".signin button")))
	if err != nil {
		t.Fatalf("sign in: %v", err)
	}
	if res.Status != 200 {
		t.Fatalf("after sign-in: status %d at %s", res.Status, res.URL)
	}
	return run(t, ctx, chromedp.Location())
}

// screenshot saves the page as name.png in the screenshots directory.
func screenshot(t *testing.T, ctx context.Context, name string) {
	t.Helper()
	png := run(t, ctx, chromedp.FullScreenshot(100))
	path := filepath.Join(browser.shots, name+".png")
	if err := os.WriteFile(path, png, 0o644); err != nil {
		t.Fatal(err)
	}
	t.Logf("screenshot: %s", path)
}

// text is the visible text of the first element matching css.
func text(t *testing.T, ctx context.Context, css string) string {
	t.Helper()
	return strings.TrimSpace(run(t, ctx, chromedp.Text(chromedp.CSS(css))))
}

// eval evaluates a JavaScript expression in the page.
func eval[T any](t *testing.T, ctx context.Context, expr string) T {
	t.Helper()
	return run(t, ctx, chromedp.Evaluate[T](expr))
}
