package api_test

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"os"
	"regexp"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"
	"unicode/utf8"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/tally-ledger/tally/api"
	"github.com/tally-ledger/tally/internal/pgtest"
)

// seriesCount is how many series reg holds.
func seriesCount(t *testing.T, reg *prometheus.Registry) int {
	t.Helper()
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	n := 0
	for _, mf := range mfs {
		n += len(mf.GetMetric())
	}
	return n
}

// TestMethodNamesAddNoSeries: a client may send any token as a method;
// metrics name the standard ones and "other", so 10k made-up methods add
// no series beyond the first.
func TestMethodNamesAddNoSeries(t *testing.T) {
	t.Parallel()
	reg := prometheus.NewRegistry()
	f := newFixtureWith(t, func(c *api.Config) { c.Registry = reg; c.AddressRate = -1 })
	send := func(method, path string) int {
		req := mustRequest(t, method, f.srv.URL+path, "")
		res, err := f.srv.Client().Do(req)
		if err != nil {
			t.Fatal(err)
		}
		res.Body.Close()
		return res.StatusCode
	}
	for _, p := range []string{"/", "/v1/adjustments", "/healthz"} {
		send("ZZFIRST", p)
	}
	before := seriesCount(t, reg)
	for i := range 10_000 {
		if st := send(fmt.Sprintf("Z%dQ", i), []string{"/", "/v1/adjustments", "/healthz"}[i%3]); st == 200 {
			t.Fatalf("made-up method answered 200")
		}
	}
	if after := seriesCount(t, reg); after != before {
		t.Fatalf("10k made-up methods added %d series", after-before)
	}
	m := f.do("GET", "/metrics", adminToken, nil)
	if !strings.Contains(string(m.body), `method="other"`) || strings.Contains(string(m.body), "Z1Q") {
		t.Fatalf("metrics do not label made-up methods \"other\":\n%s", m.body)
	}
}

var requestIDPattern = regexp.MustCompile(`^[0-9a-f]{24}$`)

// TestRequestIDs: ids are random (no host name, no counter); a client's id
// is logged in its own field and never becomes the request's id.
func TestRequestIDs(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	seen := map[string]bool{}
	host, _ := os.Hostname()
	for range 50 {
		id := f.do("GET", "/healthz", "", nil).header.Get("X-Request-Id")
		if !requestIDPattern.MatchString(id) || seen[id] || (host != "" && strings.Contains(id, host)) {
			t.Fatalf("request id %q: want 24 random hex digits, never repeated", id)
		}
		seen[id] = true
	}
	req := mustRequest(t, "GET", f.srv.URL+"/healthz", "")
	req.Header.Set("X-Request-Id", "trace-123")
	r := f.send(req)
	id := r.header.Get("X-Request-Id")
	if id == "trace-123" || !requestIDPattern.MatchString(id) {
		t.Fatalf("client's id adopted: %q", id)
	}
	// A problem names the server's id, never the client's.
	req = mustRequest(t, "GET", f.srv.URL+"/v1/customers/acme", "")
	req.Header.Set("X-Request-Id", "trace-456")
	p := f.send(req).problem(t, 401, api.TypeUnauthorized)
	if p.RequestID == "trace-456" || !requestIDPattern.MatchString(p.RequestID) {
		t.Fatalf("problem request_id %q", p.RequestID)
	}
	// A client id that is not a short token is not logged at all.
	req = mustRequest(t, "GET", f.srv.URL+"/healthz", "")
	req.Header.Set("X-Request-Id", "evil\" id with spaces "+strings.Repeat("x", 100))
	evil := f.send(req).header.Get("X-Request-Id")
	var logged, evilLogged bool
	for _, line := range strings.Split(f.logs.String(), "\n") {
		var e map[string]any
		if json.Unmarshal([]byte(line), &e) != nil || e["msg"] != "http request" {
			continue
		}
		if e["request_id"] == id {
			logged = e["client_request_id"] == "trace-123"
		}
		if e["request_id"] == evil {
			evilLogged = true
			if _, ok := e["client_request_id"]; ok {
				t.Errorf("an invalid client id was logged: %v", e)
			}
		}
	}
	if !logged || !evilLogged {
		t.Fatalf("access log lacks client_request_id trace-123 under request %s:\n%s", id, f.logs.String())
	}
}

// TestSecureHeaders: every response carries the headers a JSON API sends,
// and a problem never echoes markup from the request.
func TestSecureHeaders(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	acme := f.token("acme")
	f.do("PUT", "/v1/customers/acme", adminToken, map[string]any{"cadence": "monthly"})
	for _, tt := range []struct {
		method, path, token string
		status              int
	}{
		{"GET", "/healthz", "", 200},
		{"GET", "/readyz", "", 200},
		{"GET", "/openapi.json", "", 200},
		{"GET", "/v1/customers/acme", acme, 200},
		{"GET", "/v1/customers/acme", "", 401},
		{"DELETE", "/v1/adjustments", adminToken, 405},
		{"GET", "/nowhere", "", 404},
	} {
		r := f.do(tt.method, tt.path, tt.token, nil)
		if r.status != tt.status {
			t.Fatalf("%s %s: %d, want %d: %s", tt.method, tt.path, r.status, tt.status, r.body)
		}
		for h, want := range map[string]string{
			"X-Content-Type-Options":  "nosniff",
			"X-Frame-Options":         "DENY",
			"Content-Security-Policy": "default-src 'none'; frame-ancestors 'none'",
			"Referrer-Policy":         "no-referrer",
		} {
			if got := r.header.Get(h); got != want {
				t.Errorf("%s %s: %s = %q, want %q", tt.method, tt.path, h, got, want)
			}
		}
		cc := r.header.Get("Cache-Control")
		if tt.path == "/openapi.json" && !strings.HasPrefix(cc, "public") || tt.path != "/openapi.json" && cc != "no-store" {
			t.Errorf("%s %s: Cache-Control %q", tt.method, tt.path, cc)
		}
	}
	for _, path := range []string{"/%3Cscript%3Ealert(1)%3C/script%3E", "/v1/customers/%3Cimg%20src=x%3E/usage"} {
		r := f.do("GET", path, adminToken, nil)
		if r.status != 404 && r.status != 400 {
			t.Fatalf("%s: %d %s", path, r.status, r.body)
		}
		if bytes.ContainsAny(r.body, "<>") {
			t.Fatalf("%s: the problem echoes markup: %s", path, r.body)
		}
	}
	req := mustRequest(t, "X&Y", f.srv.URL+"/v1/adjustments", "")
	if r := f.send(req); r.status != 405 || bytes.ContainsAny(r.body, "&") {
		t.Fatalf("a method echoed raw: %d %s", r.status, r.body)
	}
}

// queryCounter counts the statements sent through a pool whose SQL
// contains a word.
type queryCounter struct {
	words map[string]*atomic.Int64
}

func (q *queryCounter) TraceQueryStart(ctx context.Context, _ *pgx.Conn, d pgx.TraceQueryStartData) context.Context {
	for w, n := range q.words {
		if strings.Contains(d.SQL, w) {
			n.Add(1)
		}
	}
	return ctx
}

func (q *queryCounter) TraceQueryEnd(context.Context, *pgx.Conn, pgx.TraceQueryEndData) {}

// countingPool is a second pool on f's database whose queries naming
// any of words are counted.
func countingPool(t *testing.T, words ...string) (*pgxpool.Pool, map[string]*atomic.Int64) {
	t.Helper()
	base := pgtest.New(t)
	cfg := base.Config()
	qc := &queryCounter{words: map[string]*atomic.Int64{}}
	for _, w := range words {
		qc.words[w] = new(atomic.Int64)
	}
	cfg.ConnConfig.Tracer = qc
	pool, err := pgxpool.NewWithConfig(context.Background(), cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pool.Close)
	return pool, qc.words
}

// TestTokenChecksCostNoQueryTwice: a token not shaped like a customer
// token costs no query; a well-formed unknown one costs one, and
// repeating it costs none; a valid token still works.
func TestTokenChecksCostNoQueryTwice(t *testing.T) {
	t.Parallel()
	pool, n := countingPool(t, "api_tokens")
	f := newFixtureWith(t, func(c *api.Config) { c.Pool = pool })
	f.pool = pool
	acme := f.token("acme")
	f.do("PUT", "/v1/customers/acme", adminToken, map[string]any{"cadence": "monthly"})
	queries := func() int64 { return n["api_tokens"].Load() }
	path := "/v1/customers/acme"
	for _, bad := range []string{"tly_short", "tly_" + strings.Repeat("A", 42) + "!", "tly_" + strings.Repeat("A", 44), "tly_" + strings.Repeat("A", 4000)} {
		before := queries()
		f.do("GET", path, bad, nil).problem(t, 401, api.TypeUnauthorized)
		if d := queries() - before; d != 0 {
			t.Errorf("malformed token %.20q cost %d queries", bad, d)
		}
	}
	unknown := "tly_" + strings.Repeat("B", 43)
	before := queries()
	f.do("GET", path, unknown, nil).problem(t, 401, api.TypeUnauthorized)
	if d := queries() - before; d != 1 {
		t.Fatalf("a well-formed unknown token cost %d queries, want 1", d)
	}
	for range 20 {
		f.do("GET", path, unknown, nil).problem(t, 401, api.TypeUnauthorized)
	}
	if d := queries() - before; d != 1 {
		t.Fatalf("repeating an unknown token cost %d more queries, want 0", d-1)
	}
	if r := f.do("GET", path, acme, nil); r.status != 200 {
		t.Fatalf("valid token: %d %s", r.status, r.body)
	}
}

// TestReadyzAnswerReused: a flood of /readyz asks Postgres about once a
// second, not twice per probe.
func TestReadyzAnswerReused(t *testing.T) {
	t.Parallel()
	pool, n := countingPool(t, "goose_db_version")
	f := newFixtureWith(t, func(c *api.Config) { c.Pool = pool })
	start := time.Now()
	if r := f.do("GET", "/readyz", "", nil); r.status != 200 {
		t.Fatalf("readyz: %d %s", r.status, r.body)
	}
	perCheck := n["goose_db_version"].Load() // the statements of one check
	if perCheck == 0 {
		t.Fatal("readyz did not read the schema version")
	}
	const probes = 200
	for range probes {
		if r := f.do("GET", "/readyz", "", nil); r.status != 200 {
			t.Fatalf("readyz: %d %s", r.status, r.body)
		}
	}
	// At most one check per started second, plus the first (and one for
	// slack); without reuse it would be one per probe.
	checks := int64(time.Since(start)/time.Second) + 2
	if got := n["goose_db_version"].Load(); got > perCheck*checks {
		t.Fatalf("%d probes in %s read the schema version %d times, want at most %d (%d per check)",
			probes+1, time.Since(start).Round(time.Millisecond), got, perCheck*checks, perCheck)
	}
}

// TestOverloadAnswers503: with MaxInFlight requests being served, one more
// is answered 503 with Retry-After at once; probes still answer. The
// request in flight is one whose work waits (on a row lock the test
// holds): a body still arriving holds no slot (TestATricklingBodyHoldsNoSlot).
func TestOverloadAnswers503(t *testing.T) {
	t.Parallel()
	// The address limit off: the polling below must not spend the burst the
	// request in flight needs on a slow machine.
	f := newFixtureWith(t, func(c *api.Config) { c.MaxInFlight, c.AddressRate = 1, -1 })
	f.do("PUT", "/v1/customers/acme", adminToken, map[string]any{"cadence": "monthly"})
	ctx := context.Background()
	tx, err := f.pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer tx.Rollback(ctx)
	if _, err := tx.Exec(ctx, `SELECT 1 FROM customers WHERE id = 'acme' FOR UPDATE`); err != nil {
		t.Fatal(err)
	}
	// send starts the request that waits on the lock; it is in flight once
	// Postgres shows it waiting (if a poll held the one slot as it arrived,
	// it was shed, and is sent again).
	held := make(chan response, 1)
	send := func() {
		go func() {
			// Not f.do: a failure must not call t.Fatal off the test's goroutine.
			req := mustRequest(t, "PUT", f.srv.URL+"/v1/customers/acme", `{"cadence":"monthly","anchor_day":2}`)
			req.Header.Set("Authorization", "Bearer "+adminToken)
			req.Header.Set("Content-Type", "application/json")
			res, err := f.srv.Client().Do(req)
			if err != nil {
				held <- response{status: -1, body: []byte(err.Error())}
				return
			}
			defer res.Body.Close()
			b, _ := io.ReadAll(res.Body)
			held <- response{status: res.StatusCode, body: b}
		}()
	}
	send()
	for deadline := time.Now().Add(30 * time.Second); ; time.Sleep(10 * time.Millisecond) {
		var waiting bool
		if err := f.pool.QueryRow(ctx, `SELECT EXISTS (SELECT 1 FROM pg_stat_activity WHERE datname = current_database() AND wait_event_type = 'Lock')`).Scan(&waiting); err != nil {
			t.Fatal(err)
		}
		if waiting {
			break
		}
		select {
		case res := <-held:
			if res.status != 503 {
				t.Fatalf("the request meant to wait on the lock answered: %d %s", res.status, res.body)
			}
			send()
		default:
		}
		if time.Now().After(deadline) {
			t.Fatal("the request never waited on the lock")
		}
	}
	r := f.do("GET", "/v1/customers/acme", adminToken, nil)
	r.problem(t, 503, api.TypeOverloaded)
	if s, err := strconv.Atoi(r.header.Get("Retry-After")); err != nil || s < 1 {
		t.Fatalf("Retry-After %q", r.header.Get("Retry-After"))
	}
	for _, p := range []string{"/healthz", "/readyz"} {
		for _, m := range []string{"GET", "HEAD"} {
			if r := f.do(m, p, "", nil); r.status != 200 {
				t.Fatalf("%s %s while overloaded: %d", m, p, r.status)
			}
		}
	}
	if err := tx.Rollback(ctx); err != nil {
		t.Fatal(err)
	}
	if res := <-held; res.status != 200 && res.status != 201 {
		t.Fatalf("the request in flight: %d %s", res.status, res.body)
	}
	if r := f.do("GET", "/v1/customers/acme", adminToken, nil); r.status != 200 {
		t.Fatalf("after the load: %d %s", r.status, r.body)
	}
}

// TestRateLimits: per client address (before authentication) and per
// customer token, each answered 429 with Retry-After; the admin token
// has no per-token limit and is never refused by the address's; probes
// are never limited.
func TestRateLimits(t *testing.T) {
	t.Parallel()
	t.Run("address", func(t *testing.T) {
		t.Parallel()
		// 0.01/s: a used token comes back after 100s, longer than the test.
		f := newFixtureWith(t, func(c *api.Config) { c.AddressRate, c.AddressBurst = 0.01, 3 })
		for i := range 3 {
			if r := f.do("GET", "/v1/customers/acme", "tly_"+strings.Repeat("C", 43), nil); r.status != 401 {
				t.Fatalf("request %d: %d", i, r.status)
			}
		}
		for _, tok := range []string{"", "tly_" + strings.Repeat("D", 43), f.token("acme")} {
			r := f.do("GET", "/v1/customers/acme", tok, nil)
			r.problem(t, 429, api.TypeRateLimited)
			if s, err := strconv.Atoi(r.header.Get("Retry-After")); err != nil || s < 60 {
				t.Fatalf("Retry-After %q, want about 100", r.header.Get("Retry-After"))
			}
		}
		// acme exists: the customer token above refers to it.
		if r := f.do("GET", "/v1/customers/acme", adminToken, nil); r.status != 200 {
			t.Fatalf("the admin over the address's rate: %d %s", r.status, r.body)
		}
		for _, p := range []string{"/healthz", "/readyz"} {
			for _, m := range []string{"GET", "HEAD"} {
				if r := f.do(m, p, "", nil); r.status != 200 {
					t.Fatalf("%s %s over the rate: %d", m, p, r.status)
				}
			}
		}
	})
	t.Run("token", func(t *testing.T) {
		t.Parallel()
		f := newFixtureWith(t, func(c *api.Config) { c.AddressRate, c.TokenRate, c.TokenBurst = -1, 0.01, 2 })
		f.do("PUT", "/v1/customers/acme", adminToken, map[string]any{"cadence": "monthly"})
		acme, acme2 := f.token("acme"), f.token("acme")
		for range 2 {
			if r := f.do("GET", "/v1/customers/acme", acme, nil); r.status != 200 {
				t.Fatalf("%d %s", r.status, r.body)
			}
		}
		r := f.do("GET", "/v1/customers/acme", acme, nil)
		r.problem(t, 429, api.TypeRateLimited)
		if r.header.Get("Retry-After") == "" {
			t.Fatal("no Retry-After")
		}
		if r := f.do("GET", "/v1/customers/acme", acme2, nil); r.status != 200 {
			t.Fatalf("another token: %d", r.status)
		}
		for range 10 {
			if r := f.do("GET", "/v1/customers/acme", adminToken, nil); r.status != 200 {
				t.Fatalf("admin: %d", r.status)
			}
		}
	})
}

// TestGrantPathLogsOnlyWhatGoesWrong: a busy grant path answers thousands
// of grants a second, so a granted, renewed or released grant is not an
// Info line of the access log (its counters and latency are metrics); a
// refused one is.
func TestGrantPathLogsOnlyWhatGoesWrong(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	if r := f.do("PUT", "/v1/customers/acme/quotas/calls", adminToken, map[string]any{"limit": "10", "admission": "exact"}); r.status != 201 {
		t.Fatalf("PUT exact rule: %d %s", r.status, r.body)
	}
	gw := f.gatewayToken("gw")
	g := f.do("POST", "/v1/grants", gw, map[string]any{"holder": "gw", "generation": 1, "customer": "acme", "meter": "calls", "amount": "4"})
	if g.status != 201 {
		t.Fatalf("grant: %d %s", g.status, g.body)
	}
	id := g.json(t)["id"].(string)
	report := map[string]any{"holder": "gw", "generation": 1, "spent": "1"}
	quiet := []string{g.header.Get("X-Request-Id"),
		f.do("POST", "/v1/grants/"+id+"/renew", gw, report).header.Get("X-Request-Id"),
		f.do("POST", "/v1/grants/"+id+"/release", gw, report).header.Get("X-Request-Id")}
	refused := f.do("POST", "/v1/grants", gw, map[string]any{"holder": "gw", "generation": 1, "customer": "acme", "meter": "calls", "amount": "100"})
	if refused.status != 409 {
		t.Fatalf("a grant above the limit: %d %s", refused.status, refused.body)
	}
	logged := map[string]bool{}
	for _, line := range strings.Split(f.logs.String(), "\n") {
		var e map[string]any
		if json.Unmarshal([]byte(line), &e) == nil && e["msg"] == "http request" {
			logged[e["request_id"].(string)] = true
		}
	}
	for i, id := range quiet {
		if logged[id] {
			t.Errorf("request %d of grant, renew, release (%s) logged at Info", i, id)
		}
	}
	if !logged[refused.header.Get("X-Request-Id")] {
		t.Errorf("the refused grant was not logged:\n%s", f.logs.String())
	}
}

// Headers over 16 KiB are refused as 431 problem+json, as every other
// refusal, not net/http's plain text (which, past its slack, it still
// answers for headers over 64 KiB).
func TestHeadersOverTheLimitAreAProblem(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	req, err := http.NewRequest("GET", f.srv.URL+"/v1/customers/acme", nil)
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Authorization", "Bearer "+adminToken)
	req.Header.Set("X-Padding", strings.Repeat("a", 17000))
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	body, _ := io.ReadAll(resp.Body)
	if resp.StatusCode != http.StatusRequestHeaderFieldsTooLarge || resp.Header.Get("Content-Type") != "application/problem+json" ||
		!strings.Contains(string(body), "urn:tally:problem:headers-too-large") {
		t.Fatalf("17,000-byte header: %d %s %s", resp.StatusCode, resp.Header.Get("Content-Type"), body)
	}
}

// TestAccessLogClipsRequestInput: the access log records at most a bounded
// part of what a request sent, as valid UTF-8: a 10,000-character path (sent
// by anyone, no token needed) does not make a 10,000-character line.
func TestAccessLogClipsRequestInput(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	long := "/" + strings.Repeat("a", 10_000) + "%FF"
	id := f.do("GET", long, "", nil).header.Get("X-Request-Id")
	var path string
	for _, line := range strings.Split(f.logs.String(), "\n") {
		var e map[string]any
		if json.Unmarshal([]byte(line), &e) == nil && e["msg"] == "http request" && e["request_id"] == id {
			path, _ = e["path"].(string)
		}
	}
	if n := utf8.RuneCountInString(path); n == 0 || n > 256 || !utf8.ValidString(path) || !strings.HasPrefix(path, "/aaa") {
		t.Fatalf("access log path of a 10,000-character path: %d characters, valid UTF-8 %v (want 1-256, valid)", n, utf8.ValidString(path))
	}
}
