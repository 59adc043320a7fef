package api_test

import (
	"context"
	"math"
	"net/http"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/tally-ledger/tally/api"
	"github.com/tally-ledger/tally/internal/pgtest"
	"github.com/tally-ledger/tally/ledger"
	"github.com/tally-ledger/tally/tokens"
)

func TestAuthentication(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	f.usage("acme", "api_calls", date("2026-11-20T10:00:00Z"), "1")
	acme := f.token("acme")
	revoked := f.token("acme")
	toks, err := tokens.List(context.Background(), f.pool, "acme")
	if err != nil || len(toks) != 2 {
		t.Fatalf("list: %v, %v", toks, err)
	}
	if _, err := tokens.Revoke(context.Background(), f.pool, toks[1].ID, f.clock()); err != nil {
		t.Fatal(err)
	}
	path := "/v1/customers/acme/usage"
	for _, tt := range []struct {
		name, header string
	}{
		{"no header", ""},
		{"basic auth", "Basic YWRtaW46YWRtaW4="},
		{"empty bearer", "Bearer "},
		{"wrong admin token", "Bearer " + adminToken + "x"},
		{"admin token prefix", "Bearer " + adminToken[:len(adminToken)-1]},
		{"made-up customer token", "Bearer tly_" + strings.Repeat("A", 43)},
		{"revoked token", "Bearer " + revoked},
		{"token without scheme", acme},
		{"huge token", "Bearer tly_" + strings.Repeat("A", 4000)},
	} {
		t.Run(tt.name, func(t *testing.T) {
			req := mustRequest(t, "GET", f.srv.URL+path, "")
			if tt.header != "" {
				req.Header.Set("Authorization", tt.header)
			}
			r := f.send(req)
			r.problem(t, 401, "urn:tally:problem:unauthorized")
			if !strings.HasPrefix(r.header.Get("WWW-Authenticate"), "Bearer") {
				t.Fatalf("WWW-Authenticate = %q", r.header.Get("WWW-Authenticate"))
			}
		})
	}
	// The scheme is case-insensitive (RFC 9110).
	req := mustRequest(t, "GET", f.srv.URL+path, "")
	req.Header.Set("Authorization", "bearer "+acme)
	if r := f.send(req); r.status != 200 {
		t.Fatalf("lower-case scheme: %d %s", r.status, r.body)
	}
	// Two Authorization headers are ambiguous (RFC 6750 §3.1: one way of
	// sending one token): refused whichever comes first, never read as the
	// first one alone, which a proxy taking the last would see otherwise.
	for _, pair := range [][2]string{{acme, adminToken}, {adminToken, acme}, {acme, acme}} {
		for _, p := range []string{path, "/metrics"} {
			req := mustRequest(t, "GET", f.srv.URL+p, "")
			req.Header.Add("Authorization", "Bearer "+pair[0])
			req.Header.Add("Authorization", "Bearer "+pair[1])
			pr := f.send(req).problem(t, 401, "urn:tally:problem:unauthorized")
			if !strings.Contains(pr.Detail, "one Authorization header") {
				t.Errorf("two Authorization headers on %s: %q, want it to say to send one", p, pr.Detail)
			}
		}
	}
	// Writes and the unauthenticated endpoints.
	f.do("POST", "/v1/adjustments", "", map[string]any{}).problem(t, 401, "urn:tally:problem:unauthorized")
	f.do("PUT", "/v1/customers/acme", "", map[string]any{"cadence": "monthly"}).problem(t, 401, "urn:tally:problem:unauthorized")
	f.do("GET", "/metrics", "", nil).problem(t, 401, "urn:tally:problem:unauthorized")
	f.do("GET", "/v1/nowhere", "", nil).problem(t, 401, "urn:tally:problem:unauthorized")
	for _, p := range []string{"/healthz", "/readyz", "/openapi.json"} {
		if r := f.do("GET", p, "", nil); r.status != 200 {
			t.Errorf("%s without a token: %d", p, r.status)
		}
	}
}

// TestTenantIsolation: customer A's token against B's data and against writes.
func TestTenantIsolation(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	f.usage("acme", "api_calls", date("2026-11-20T10:00:00Z"), "1")
	f.usage("globex", "api_calls", date("2026-11-20T10:00:00Z"), "2")
	acme := f.token("acme")

	if r := f.do("GET", "/v1/customers/acme/usage", acme, nil); r.status != 200 {
		t.Fatalf("own usage: %d %s", r.status, r.body)
	}
	if r := f.do("GET", "/v1/customers/acme", acme, nil); r.status != 200 {
		t.Fatalf("own calendar: %d %s", r.status, r.body)
	}
	// Another customer's data looks exactly like a customer that does not exist.
	for _, path := range []string{"/v1/customers/%s/usage", "/v1/customers/%s/usage?meter=api_calls&period=previous", "/v1/customers/%s"} {
		other := f.do("GET", strings.Replace(path, "%s", "globex", 1), acme, nil).problem(t, 404, "urn:tally:problem:not-found")
		none := f.do("GET", strings.Replace(path, "%s", "nobody", 1), acme, nil).problem(t, 404, "urn:tally:problem:not-found")
		if strings.Replace(other.Detail, "globex", "X", 1) != strings.Replace(none.Detail, "nobody", "X", 1) {
			t.Errorf("%s: 404 for another customer (%q) differs from an unknown one (%q)", path, other.Detail, none.Detail)
		}
	}
	// Customer tokens cannot write, for themselves or anyone else.
	adj := map[string]any{"operation_id": "0193e0a1-7c00-7d4e-9a51-3c2f9b7e4a10", "customer": "acme", "meter": "api_calls", "quantity": "-100", "reason": "r", "actor": "a"}
	f.do("POST", "/v1/adjustments", acme, adj).problem(t, 403, "urn:tally:problem:forbidden")
	adj["customer"] = "globex"
	f.do("POST", "/v1/adjustments", acme, adj).problem(t, 403, "urn:tally:problem:forbidden")
	f.do("PUT", "/v1/customers/acme", acme, map[string]any{"cadence": "daily"}).problem(t, 403, "urn:tally:problem:forbidden")
	f.do("PUT", "/v1/customers/globex", acme, map[string]any{"cadence": "daily"}).problem(t, 403, "urn:tally:problem:forbidden")
	f.do("GET", "/metrics", acme, nil).problem(t, 403, "urn:tally:problem:forbidden")
	var n int
	_ = f.pool.QueryRow(context.Background(), `SELECT count(*) FROM entries`).Scan(&n)
	if n != 0 {
		t.Fatalf("a customer token booked %d entries", n)
	}
	// globex's usage is untouched and readable by the admin.
	if u := f.do("GET", "/v1/customers/globex/usage?meter=api_calls", adminToken, nil).json(t); u["total"] != "2" {
		t.Fatalf("globex usage: %v", u)
	}
}

func TestConfigValidate(t *testing.T) {
	t.Parallel()
	pool := pgtest.New(t)
	l, _ := ledger.New(ledger.Config{})
	for _, tt := range []struct {
		cfg  api.Config
		want []string
	}{
		{api.Config{}, []string{"Pool is required", "Ledger is required", "admin token is required"}},
		{api.Config{Pool: pool, Ledger: l, AdminToken: "short"}, []string{"at least 32 characters"}},
		{api.Config{Pool: pool, Ledger: l, AdminToken: adminToken, Grace: -1}, []string{"grace"}},
		{api.Config{Pool: pool, Ledger: l, AdminToken: adminToken, ReconcileTimeout: -1}, []string{"limits must not be negative"}},
	} {
		_, err := api.New(tt.cfg)
		for _, w := range tt.want {
			if err == nil || !strings.Contains(err.Error(), w) {
				t.Errorf("New(%+v) = %v, want %q", tt.cfg, err, w)
			}
		}
	}
	if _, err := api.New(api.Config{Pool: pool, Ledger: l, AdminToken: adminToken, Registry: prometheus.NewRegistry()}); err != nil {
		t.Fatal(err)
	}
	srv := api.NewServer("127.0.0.1:0", http.NotFoundHandler())
	if srv.ReadHeaderTimeout == 0 || srv.MaxHeaderBytes == 0 || srv.IdleTimeout == 0 || srv.WriteTimeout == 0 {
		t.Fatalf("server limits: %+v", srv)
	}
}

// TestConfigRefusesNonFiniteRates: a rate of NaN or ±Inf is refused by New
// naming its field, not handed to the rate limiter (0 is the default, a
// negative rate turns the limit off).
func TestConfigRefusesNonFiniteRates(t *testing.T) {
	t.Parallel()
	pool := pgtest.New(t)
	l, _ := ledger.New(ledger.Config{})
	for _, v := range []float64{math.NaN(), math.Inf(1), math.Inf(-1)} {
		for field, set := range map[string]func(*api.Config){
			"AddressRate": func(c *api.Config) { c.AddressRate = v },
			"TokenRate":   func(c *api.Config) { c.TokenRate = v },
			"GatewayRate": func(c *api.Config) { c.GatewayRate = v },
		} {
			cfg := api.Config{Pool: pool, Ledger: l, AdminToken: adminToken, Registry: prometheus.NewRegistry()}
			set(&cfg)
			if _, err := api.New(cfg); err == nil || !strings.Contains(err.Error(), field) {
				t.Errorf("New with %s %v: %v, want an error naming %s", field, v, err, field)
			}
		}
	}
}

// TestRevocation: a revoked token stops working at once when the token
// cache is off; with the cache on, as soon as the API hears of the
// revocation (Postgres notifies it), however long TokenCacheTTL is.
func TestRevocation(t *testing.T) {
	t.Parallel()
	for _, tt := range []struct {
		ttl       time.Duration
		afterword int // right after the revocation; 0: either
	}{{-1, 401}, {time.Hour, 0}, {time.Nanosecond, 0}} {
		f := newFixtureWith(t, func(c *api.Config) { c.TokenCacheTTL = tt.ttl })
		f.usage("acme", "api_calls", date("2026-11-20T10:00:00Z"), "1")
		tok := f.token("acme")
		if r := f.do("GET", "/v1/customers/acme", tok, nil); r.status != 200 {
			t.Fatalf("before revoke: %d", r.status)
		}
		toks, _ := tokens.List(context.Background(), f.pool, "acme")
		if _, err := tokens.Revoke(context.Background(), f.pool, toks[0].ID, f.clock()); err != nil {
			t.Fatal(err)
		}
		if r := f.do("GET", "/v1/customers/acme", tok, nil); tt.afterword != 0 && r.status != tt.afterword {
			t.Fatalf("TokenCacheTTL %s: after revoke %d, want %d", tt.ttl, r.status, tt.afterword)
		}
		f.sync()
		if r := f.do("GET", "/v1/customers/acme", tok, nil); r.status != 401 {
			t.Fatalf("TokenCacheTTL %s: once the revocation was heard %d, want 401", tt.ttl, r.status)
		}
	}
}

// TestRevokedGatewayTokenLosesItsTrust: a gateway token this process has
// verified is spared the per-address limits; revoked, it is not, on every
// route (not only those that check a token), in this process and in
// another that had verified it too.
func TestRevokedGatewayTokenLosesItsTrust(t *testing.T) {
	t.Parallel()
	// 0.01/s: a used request comes back after 100s, longer than the test.
	limited := func(c *api.Config) { c.AddressRate, c.AddressBurst = 0.01, 3 }
	f := newFixtureWith(t, limited)
	peer := f.peer(limited, nil)
	r := f.do("POST", "/v1/tokens", adminToken, map[string]any{"gateway": "gw"})
	gw, _ := r.json(t)["secret"].(string)
	id, _ := r.json(t)["id"].(string)
	for _, p := range []*fixture{f, peer} {
		// Its first request is not known to come from a gateway (one of the
		// burst of 3); after it, the gateway is spared the address's limit.
		for i := range 5 {
			if r := p.do("GET", "/v1/customers/acme/grants", gw, nil); r.status != 404 {
				t.Fatalf("the gateway token's request %d: %d %s", i, r.status, r.body)
			}
			if r := p.do("GET", "/openapi.json", gw, nil); r.status != 200 {
				t.Fatalf("the gateway token's request %d for /openapi.json: %d %s", i, r.status, r.body)
			}
		}
	}
	f.do("POST", "/v1/tokens/"+id+"/revoke", adminToken, nil)
	f.sync()
	peer.sync()
	for name, p := range map[string]*fixture{"the process that revoked it": f, "another process": peer} {
		// Two requests left of the address's burst, then 429: the revoked
		// token is a stranger's.
		var statuses []int
		for range 4 {
			statuses = append(statuses, p.do("GET", "/openapi.json", gw, nil).status)
		}
		if !slices.Equal(statuses, []int{200, 200, 429, 429}) {
			t.Errorf("%s: a revoked gateway token's requests for /openapi.json answered %v, want [200 200 429 429] (the address's limit)", name, statuses)
		}
	}
}
