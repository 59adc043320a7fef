package api_test

import (
	"bytes"
	"context"
	"encoding/json"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/getkin/kin-openapi/openapi3"
	"github.com/getkin/kin-openapi/openapi3filter"
	"github.com/getkin/kin-openapi/routers"
	"github.com/getkin/kin-openapi/routers/gorillamux"
	"github.com/google/uuid"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/tally-ledger/tally/amount"
	"github.com/tally-ledger/tally/api"
	"github.com/tally-ledger/tally/internal/ledgertest"
	"github.com/tally-ledger/tally/internal/pgtest"
	"github.com/tally-ledger/tally/internal/testrun"
	"github.com/tally-ledger/tally/ledger"
	"github.com/tally-ledger/tally/tokens"
)

const adminToken = "admin-token-for-tests-0123456789abcdef"

// fixture is the API on a real HTTP server over its own database, with a
// settable clock shared by the ledger and the API. Every response a test
// reads through do() is validated against openapi.json.
type fixture struct {
	t      *testing.T
	pool   *pgxpool.Pool
	ledger *ledger.Ledger
	srv    *httptest.Server
	h      *api.API
	logs   *testrun.Buffer

	mu  sync.Mutex
	now time.Time

	streams *ledgertest.Streams // customer/meter → its one stream

	synced chan string // the API's listener handled this sync notification

	clockOf *fixture // a peer's: the clock of the fixture it runs beside
}

func newFixture(t *testing.T) *fixture {
	t.Helper()
	return newFixtureWith(t, nil)
}

// newFixtureWith lets a test change the API's configuration.
func newFixtureWith(t *testing.T, configure func(*api.Config)) *fixture {
	t.Helper()
	return newFixtureAPI(t, configure, nil)
}

// newFixtureAPI also lets a test change the API before it runs.
func newFixtureAPI(t *testing.T, configure func(*api.Config), prepare func(*api.API)) *fixture {
	t.Helper()
	f := &fixture{t: t, pool: pgtest.New(t), now: time.Date(2026, 11, 20, 12, 0, 0, 0, time.UTC),
		logs: testrun.Logs(t)}
	l, err := ledger.New(ledger.Config{Clock: f.clock})
	if err != nil {
		t.Fatal(err)
	}
	f.ledger = l
	f.streams = ledgertest.New(f.pool, l)
	f.start(configure, prepare)
	return f
}

// peer is another API process on f's database, with its own cache and
// listener, sharing f's clock and ledger.
func (f *fixture) peer(configure func(*api.Config), prepare func(*api.API)) *fixture {
	f.t.Helper()
	p := &fixture{t: f.t, pool: f.pool, ledger: f.ledger, streams: f.streams, logs: testrun.Logs(f.t), now: f.clock()}
	p.clockOf = f
	p.start(configure, prepare)
	return p
}

// start runs the API of f over f.pool.
func (f *fixture) start(configure func(*api.Config), prepare func(*api.API)) {
	t := f.t
	t.Helper()
	cfg := api.Config{
		Pool: f.pool, Ledger: f.ledger, AdminToken: adminToken, Clock: f.clock,
		Logger:   slog.New(slog.NewJSONHandler(f.logs, nil)),
		Registry: prometheus.NewRegistry(),
	}
	if configure != nil {
		configure(&cfg)
	}
	h, err := api.New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	// The usage cache is on, kept coherent by Postgres's notifications:
	// tests write behind the API's back (f.usage, f.exec) and then wait
	// until the API has heard of the write (f.sync), as any reader after
	// a notification's short delay would.
	f.synced = make(chan string, 16)
	api.OnUsageSync(h, func(s string) {
		select { // never block the listener: sync sends again
		case f.synced <- s:
		default:
		}
	})
	f.h = h
	api.PingEvery(h, 100*time.Millisecond)
	// Probes often, and a lease long enough that a loaded machine does not
	// turn the cache off under tests that count its hits.
	api.ListenerTimings(h, 200*time.Millisecond, 20*time.Second, time.Minute)
	if prepare != nil {
		prepare(h)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- h.Run(ctx) }()
	t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("api.Run: %v", err)
		}
	})
	for deadline := time.Now().Add(10 * time.Second); !api.UsageWatchUp(h); time.Sleep(time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatal("the API's usage listener did not start")
		}
	}
	f.srv = httptest.NewServer(h)
	t.Cleanup(f.srv.Close)
}

func (f *fixture) clock() time.Time {
	if f.clockOf != nil {
		return f.clockOf.clock()
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.now
}

func (f *fixture) setNow(t time.Time) {
	f.mu.Lock()
	f.now = t
	f.mu.Unlock()
}

// usage books qty of usage for customer/meter at t through the ledger.
func (f *fixture) usage(customer, meter string, t time.Time, qty string) {
	f.t.Helper()
	f.streams.Use(f.t, customer, meter, t, amount.MustParse(qty))
	f.sync()
}

// sync waits until the API's usage listener has handled every commit so
// far (a notification sent now arrives after them). It sends again while
// waiting: one sent while the listener reconnects is never heard.
func (f *fixture) sync() {
	f.t.Helper()
	token := uuid.NewString()
	timeout := time.After(10 * time.Second)
	for {
		if _, err := f.pool.Exec(context.Background(), `SELECT pg_notify('tally_api_cache', json_build_object('sync', $1::text)::text)`, token); err != nil {
			f.t.Fatalf("sync: %v", err)
		}
		again := time.After(200 * time.Millisecond)
	wait:
		for {
			select {
			case s := <-f.synced:
				if s == token {
					return
				}
			case <-again:
				break wait
			case <-timeout:
				f.t.Fatal("sync: the API's usage listener did not answer in 10s")
			}
		}
	}
}

func (f *fixture) exec(sql string, args ...any) {
	f.t.Helper()
	if _, err := f.pool.Exec(context.Background(), sql, args...); err != nil {
		f.t.Fatalf("%s: %v", sql, err)
	}
	f.sync()
}

// putPool creates the pool name with members through the API.
func (f *fixture) putPool(name string, members ...string) {
	f.t.Helper()
	if r := f.do("PUT", "/v1/pools/"+name, adminToken, map[string]any{"members": members}); r.status != 201 {
		f.t.Fatalf("pool %s: %d %s", name, r.status, r.body)
	}
}

// token creates a customer token.
func (f *fixture) token(customer string) string {
	f.t.Helper()
	_, secret, err := tokens.Create(context.Background(), f.pool, customer, "test", f.clock())
	if err != nil {
		f.t.Fatal(err)
	}
	return secret
}

type response struct {
	status int
	header http.Header
	body   []byte
}

func (r response) json(t *testing.T) map[string]any {
	t.Helper()
	var m map[string]any
	if err := json.Unmarshal(r.body, &m); err != nil {
		t.Fatalf("response is not a JSON object: %v\n%s", err, r.body)
	}
	return m
}

// problem checks that r is a problem+json with the status and type, and
// returns it.
func (r response) problem(t *testing.T, status int, typ string) api.Problem {
	t.Helper()
	if r.status != status {
		t.Fatalf("status %d, want %d: %s", r.status, status, r.body)
	}
	if ct := r.header.Get("Content-Type"); ct != "application/problem+json" {
		t.Fatalf("Content-Type %q, want application/problem+json", ct)
	}
	var p api.Problem
	dec := json.NewDecoder(bytes.NewReader(r.body))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&p); err != nil {
		t.Fatalf("problem: %v: %s", err, r.body)
	}
	if p.Type != typ || p.Status != status || p.Title == "" || p.RequestID == "" {
		t.Fatalf("problem %+v, want type %s status %d with a title and request_id", p, typ, status)
	}
	return p
}

// fieldProblem checks that r is a 400 invalid-request naming field
// alone, with a detail that contains about.
func (r response) fieldProblem(t *testing.T, field, about string) {
	t.Helper()
	p := r.problem(t, 400, api.TypeInvalidRequest)
	if len(p.Errors) != 1 || p.Errors[0].Field != field || !strings.Contains(p.Errors[0].Detail, about) {
		t.Errorf("errors %+v, want %s: …%s…", p.Errors, field, about)
	}
}

// fields lists the problem's fields at fault.
func fields(p api.Problem) []string {
	var out []string
	for _, e := range p.Errors {
		out = append(out, e.Field)
	}
	return out
}

// do sends a request (body: nil, a string, or a value to encode as JSON)
// with the token ("" for none) and validates the response against the
// OpenAPI document when the path is documented.
func (f *fixture) do(method, path, token string, body any) response {
	f.t.Helper()
	var rd io.Reader
	switch b := body.(type) {
	case nil:
	case string:
		rd = strings.NewReader(b)
	case []byte:
		rd = bytes.NewReader(b)
	default:
		j, err := json.Marshal(b)
		if err != nil {
			f.t.Fatal(err)
		}
		rd = bytes.NewReader(j)
	}
	req, err := http.NewRequest(method, f.srv.URL+path, rd)
	if err != nil {
		f.t.Fatal(err)
	}
	if body != nil {
		req.Header.Set("Content-Type", "application/json")
	}
	if token != "" {
		req.Header.Set("Authorization", "Bearer "+token)
	}
	return f.send(req)
}

func (f *fixture) send(req *http.Request) response {
	f.t.Helper()
	res, err := f.srv.Client().Do(req)
	if err != nil {
		f.t.Fatalf("%s %s: %v", req.Method, req.URL, err)
	}
	defer res.Body.Close()
	b, err := io.ReadAll(res.Body)
	if err != nil {
		f.t.Fatal(err)
	}
	r := response{status: res.StatusCode, header: res.Header, body: b}
	validateResponse(f.t, req, r)
	return r
}

var (
	docOnce   sync.Once
	docRouter routers.Router
	docValue  *openapi3.T
	docErr    error
)

func openapiDoc(t testing.TB) (*openapi3.T, routers.Router) {
	t.Helper()
	docOnce.Do(func() {
		loader := openapi3.NewLoader()
		docValue, docErr = loader.LoadFromData(api.OpenAPI())
		if docErr != nil {
			return
		}
		if docErr = docValue.Validate(loader.Context); docErr != nil {
			return
		}
		docRouter, docErr = gorillamux.NewRouter(docValue)
	})
	if docErr != nil {
		t.Fatalf("openapi.json: %v", docErr)
	}
	return docValue, docRouter
}

// validateResponse checks a real response against openapi.json: status
// documented (or the default problem), content type and body schema.
func validateResponse(t testing.TB, req *http.Request, r response) {
	t.Helper()
	_, router := openapiDoc(t)
	vreq := req.Clone(context.Background())
	vreq.Body = http.NoBody
	route, params, err := router.FindRoute(vreq)
	if err != nil {
		return // an undocumented path (tests of 404 and 405)
	}
	opts := &openapi3filter.Options{IncludeResponseStatus: true, MultiError: true,
		AuthenticationFunc: openapi3filter.NoopAuthenticationFunc}
	in := &openapi3filter.ResponseValidationInput{
		RequestValidationInput: &openapi3filter.RequestValidationInput{Request: vreq, PathParams: params, Route: route, Options: opts},
		Status:                 r.status,
		Header:                 r.header,
		Body:                   io.NopCloser(bytes.NewReader(r.body)),
		Options:                opts,
	}
	if err := openapi3filter.ValidateResponse(context.Background(), in); err != nil {
		t.Errorf("%s %s → %d does not match openapi.json: %v\nbody: %s", req.Method, req.URL.Path, r.status, err, r.body)
	}
}

func date(s string) time.Time {
	t, err := time.Parse(time.RFC3339, s)
	if err != nil {
		panic(err)
	}
	return t
}

func mustRequest(t testing.TB, method, url, body string) *http.Request {
	t.Helper()
	req, err := http.NewRequest(method, url, strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	return req
}

func ioNopCloser(r io.Reader) io.ReadCloser { return io.NopCloser(r) }

func newServer(t testing.TB, h http.Handler) *httptest.Server {
	s := httptest.NewServer(h)
	t.Cleanup(s.Close)
	return s
}
