package api_test

import (
	"bytes"
	"encoding/json"
	"log/slog"
	"net"
	"net/http"
	"slices"
	"sort"
	"strings"
	"testing"

	"github.com/go-chi/chi/v5"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/tally-ledger/tally/api"
	"github.com/tally-ledger/tally/internal/pgtest"
	"github.com/tally-ledger/tally/ledger"
)

// TestOpenAPICoversRoutes: every route of the router is documented and
// every documented operation is a route.
func TestOpenAPICoversRoutes(t *testing.T) {
	t.Parallel()
	doc, _ := openapiDoc(t)
	if !strings.HasPrefix(doc.OpenAPI, "3.1") {
		t.Fatalf("openapi %q, want 3.1", doc.OpenAPI)
	}
	l, _ := ledger.New(ledger.Config{})
	h, err := api.New(api.Config{Pool: pgtest.New(t), Ledger: l, AdminToken: adminToken, Logger: slog.New(slog.DiscardHandler)})
	if err != nil {
		t.Fatal(err)
	}
	routes, ok := api.Routes(h)
	if !ok {
		t.Fatalf("the handler %T is not a chi router", h)
	}
	var served []string
	err = chi.Walk(routes, func(method, route string, _ http.Handler, _ ...func(http.Handler) http.Handler) error {
		served = append(served, method+" "+strings.TrimSuffix(route, "/"))
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	var documented []string
	for path, item := range doc.Paths.Map() {
		for method := range item.Operations() {
			documented = append(documented, method+" "+path)
		}
	}
	sort.Strings(served)
	sort.Strings(documented)
	for _, s := range served {
		if !slices.Contains(documented, s) {
			t.Errorf("route %s is not in openapi.json", s)
		}
	}
	for _, d := range documented {
		if !slices.Contains(served, d) {
			t.Errorf("openapi.json documents %s, which is not a route", d)
		}
	}
	if len(served) < 8 {
		t.Fatalf("walked only %v", served)
	}
}

// TestOpenAPIServed: /openapi.json is the embedded document, valid JSON.
func TestOpenAPIServed(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	r := f.do("GET", "/openapi.json", "", nil)
	if r.status != 200 || !bytes.Equal(r.body, api.OpenAPI()) || !json.Valid(r.body) {
		t.Fatalf("%d, %d bytes", r.status, len(r.body))
	}
}

func TestHealthReadyMetricsAndLogs(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	if m := f.do("GET", "/healthz", "", nil).json(t); m["status"] != "ok" {
		t.Fatalf("healthz %v", m)
	}
	if m := f.do("GET", "/readyz", "", nil).json(t); m["status"] != "ready" || m["schema_version"] == nil {
		t.Fatalf("readyz %v", m)
	}
	f.usage("acme", "api_calls", date("2026-11-20T10:00:00Z"), "1")
	r := f.do("GET", "/v1/customers/acme/usage", adminToken, nil)
	id := r.header.Get("X-Request-Id")
	if id == "" {
		t.Fatal("no X-Request-Id")
	}
	f.do("GET", "/v1/customers/nobody/usage", adminToken, nil)
	m := f.do("GET", "/metrics", adminToken, nil)
	if m.status != 200 {
		t.Fatalf("metrics: %d %s", m.status, m.body)
	}
	for _, want := range []string{
		`tally_http_requests_total{method="GET",route="/v1/customers/{customer}/usage",status="200"} 1`,
		`tally_http_requests_total{method="GET",route="/v1/customers/{customer}/usage",status="404"} 1`,
		`tally_http_request_duration_seconds_bucket{method="GET",route="/v1/customers/{customer}/usage",le="`,
	} {
		if !strings.Contains(string(m.body), want) {
			t.Errorf("metrics lack %s", want)
		}
	}
	if strings.Contains(string(m.body), "acme") || strings.Contains(string(m.body), "nobody") {
		t.Error("metrics hold customer ids")
	}
	// One access log line per request, with its request id; never the token.
	var found bool
	for _, line := range strings.Split(f.logs.String(), "\n") {
		if line == "" {
			continue
		}
		var e map[string]any
		if err := json.Unmarshal([]byte(line), &e); err != nil {
			t.Fatalf("log line %q: %v", line, err)
		}
		if e["msg"] == "http request" && e["request_id"] == id {
			found = e["route"] == "/v1/customers/{customer}/usage" && e["status"] == float64(200)
		}
	}
	if !found {
		t.Errorf("no access log line for request %s:\n%s", id, f.logs.String())
	}
	if strings.Contains(f.logs.String(), adminToken) {
		t.Error("the admin token is in the logs")
	}
}

func TestReadyzMigrationsPending(t *testing.T) {
	t.Parallel()
	pool := pgtest.New(t)
	if _, err := pool.Exec(t.Context(), `DELETE FROM goose_db_version WHERE version_id = (SELECT max(version_id) FROM goose_db_version)`); err != nil {
		t.Fatal(err)
	}
	l, _ := ledger.New(ledger.Config{})
	h, err := api.New(api.Config{Pool: pool, Ledger: l, AdminToken: adminToken, Registry: prometheus.NewRegistry()})
	if err != nil {
		t.Fatal(err)
	}
	f := &fixture{t: t, srv: newServer(t, h)}
	p := f.do("GET", "/readyz", "", nil).problem(t, 503, "urn:tally:problem:not-ready")
	if !strings.Contains(p.Detail, "tally migrate") {
		t.Fatalf("detail %q", p.Detail)
	}
}

func TestRoutingProblems(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	r := f.do("DELETE", "/v1/adjustments", adminToken, nil)
	r.problem(t, 405, "urn:tally:problem:method-not-allowed")
	if got := r.header.Values("Allow"); !slices.Equal(got, []string{"POST"}) {
		t.Fatalf("Allow = %v", got)
	}
	r = f.do("DELETE", "/v1/customers/acme", adminToken, nil)
	r.problem(t, 405, "urn:tally:problem:method-not-allowed")
	if got := r.header.Values("Allow"); !slices.Equal(got, []string{"GET", "HEAD", "PUT"}) {
		t.Fatalf("Allow = %v", got)
	}
	f.do("GET", "/v1/customers/acme/usage/extra", adminToken, nil).problem(t, 404, "urn:tally:problem:not-found")
	f.do("GET", "/nowhere", "", nil).problem(t, 404, "urn:tally:problem:not-found")
	// A header block far over the limit (past 4 × MaxHeaderBytes, which
	// NewServer lets through for the handler to answer) is refused by
	// net/http itself.
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	srv := api.NewServer(ln.Addr().String(), http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {}))
	go srv.Serve(ln)
	t.Cleanup(func() { srv.Close() })
	req := mustRequest(t, "GET", "http://"+ln.Addr().String()+"/healthz", "")
	req.Header.Set("X-Big", strings.Repeat("x", 80<<10))
	res, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	res.Body.Close()
	if res.StatusCode != http.StatusRequestHeaderFieldsTooLarge {
		t.Fatalf("80 KiB header: %d", res.StatusCode)
	}
}
