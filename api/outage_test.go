package api_test

import (
	"context"
	"net/url"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/tally-ledger/tally/api"
	"github.com/tally-ledger/tally/internal/faultproxy"
)

// proxiedPool is a pool on f's database through a fault proxy.
func proxiedPool(t *testing.T, dbURL string) (*pgxpool.Pool, *faultproxy.Proxy) {
	t.Helper()
	u, err := url.Parse(dbURL)
	if err != nil {
		t.Fatal(err)
	}
	p, err := faultproxy.Start(u.Host)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = p.Close() })
	u.Host = p.Addr()
	cfg, err := pgxpool.ParseConfig(u.String())
	if err != nil {
		t.Fatal(err)
	}
	cfg.ConnConfig.ConnectTimeout = time.Second
	pool, err := pgxpool.NewWithConfig(context.Background(), cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pool.Close)
	return pool, p
}

// While Postgres is unreachable (every connection reset, new ones refused)
// the API answers grants, quotas, usage and the ingest status with 503
// unavailable and Retry-After, not 500: gateways and load balancers back off
// and retry. Once the database is back, the same requests succeed.
func TestDatabaseOutageAnswers503WithRetryAfter(t *testing.T) {
	t.Parallel()
	var proxy *faultproxy.Proxy
	f := newFixtureWith(t, func(c *api.Config) {
		var pool *pgxpool.Pool
		pool, proxy = proxiedPool(t, poolURL(t, c.Pool))
		c.Pool = pool
	})
	if r := f.do("PUT", "/v1/customers/acme/quotas/tokens", adminToken, map[string]any{"limit": "100", "admission": "exact"}); r.status != 201 {
		t.Fatalf("quota: %d %s", r.status, r.body)
	}
	gw := f.gatewayToken("gw1")
	grant := func() response {
		return f.do("POST", "/v1/grants", gw, map[string]any{"holder": "gw1", "generation": 1, "customer": "acme",
			"meter": "tokens", "amount": "1", "ttl": "30s"})
	}
	if r := grant(); r.status != 201 {
		t.Fatalf("grant before the outage: %d %s", r.status, r.body)
	}

	proxy.Reset()
	for _, req := range []struct {
		name string
		do   func() response
	}{
		{"grant", grant},
		{"quotas", func() response { return f.do("GET", "/v1/customers/acme/quotas", adminToken, nil) }},
		{"usage", func() response { return f.do("GET", "/v1/customers/other/usage?meter=tokens", adminToken, nil) }},
		{"ingest status", func() response { return f.do("GET", "/v1/ingest/status", adminToken, nil) }},
	} {
		r := req.do()
		p := r.problem(t, 503, api.TypeUnavailable)
		if ra := r.header.Get("Retry-After"); ra == "" || strings.Trim(ra, "0123456789") != "" {
			t.Errorf("%s during the outage: Retry-After %q, want whole seconds", req.name, ra)
		}
		if !strings.Contains(p.Detail, "database") {
			t.Errorf("%s during the outage: detail %q does not say the database is unavailable", req.name, p.Detail)
		}
	}

	proxy.Pass()
	if err := eventuallyOK(10*time.Second, func() bool { return grant().status == 201 }); err != nil {
		t.Fatalf("grant after the outage: %v", err)
	}
}

func eventuallyOK(d time.Duration, f func() bool) error {
	deadline := time.Now().Add(d)
	for !f() {
		if time.Now().After(deadline) {
			return context.DeadlineExceeded
		}
		time.Sleep(100 * time.Millisecond)
	}
	return nil
}

// poolURL is the connection URL of pool's database.
func poolURL(t *testing.T, pool *pgxpool.Pool) string {
	t.Helper()
	cc := pool.Config().ConnConfig
	return (&url.URL{Scheme: "postgres", User: url.User(cc.User), Host: cc.Host + ":" + strconv.Itoa(int(cc.Port)),
		Path: "/" + cc.Database, RawQuery: "sslmode=disable"}).String()
}
