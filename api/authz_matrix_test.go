package api_test

import (
	"context"
	"fmt"
	"net/http"
	"slices"
	"strings"
	"testing"

	"github.com/go-chi/chi/v5"
	"github.com/google/uuid"

	"github.com/tally-ledger/tally/api"
	"github.com/tally-ledger/tally/tokens"
)

// access is who may use a route.
type access int

const (
	public       access = iota // anyone, with any token or none
	adminOnly                  // the admin token
	customerRead               // the admin, or the path's customer's own token (another's is a 404)
	holderWrite                // the admin, or the gateway token of the holder the request names
)

// authzRow is one route of the authorization matrix: its method and
// pattern as the router has them, who may use it, the request (path and
// JSON body, "" for none) and the statuses an allowed caller gets.
// Placeholders: {c} the side's customer, {h} its holder, {grant} a live
// grant of {h} issued for the request, {uuid} a fresh id, {dead} a stored
// dead letter, {rec} a reconciliation run, {token} the id of a fresh
// customer token of {c}.
type authzRow struct {
	route  string
	access access
	path   string
	body   string
	ok     []int
}

func is(statuses ...int) []int { return statuses }

// authzRows has one row per route: TestAuthorizationMatrix fails when the
// router has a route without one. Adding a route: add its row here.
var authzRows = []authzRow{
	{"GET /healthz", public, "/healthz", "", is(200)},
	{"GET /readyz", public, "/readyz", "", is(200, 503)},
	{"GET /openapi.json", public, "/openapi.json", "", is(200)},
	{"GET /metrics", adminOnly, "/metrics", "", is(200)},
	{"GET /v1/customers/{customer}", customerRead, "/v1/customers/{c}", "", is(200)},
	{"PUT /v1/customers/{customer}", adminOnly, "/v1/customers/{c}", `{"cadence":"monthly"}`, is(200)},
	{"GET /v1/customers/{customer}/usage", customerRead, "/v1/customers/{c}/usage", "", is(200)},
	{"POST /v1/adjustments", adminOnly, "/v1/adjustments",
		`{"operation_id":"{uuid}","customer":"{c}","meter":"tokens","quantity":"1","reason":"matrix","actor":"test"}`, is(201)},
	{"GET /v1/customers/{customer}/periods", customerRead, "/v1/customers/{c}/periods", "", is(200)},
	{"GET /v1/customers/{customer}/periods/{period}/statement", customerRead, "/v1/customers/{c}/periods/2026-11-01/statement", "", is(200)},
	{"POST /v1/customers/{customer}/periods/{period}/close", adminOnly, "/v1/customers/{c}/periods/2026-11-01/close", "", is(409)},
	{"GET /v1/customers/{customer}/quotas", customerRead, "/v1/customers/{c}/quotas", "", is(200)},
	{"PUT /v1/customers/{customer}/quotas/{meter}", adminOnly, "/v1/customers/{c}/quotas/calls", `{"limit":"10"}`, is(200, 201)},
	{"GET /v1/customers/{customer}/grants", customerRead, "/v1/customers/{c}/grants", "", is(200)},
	{"GET /v1/customers/{customer}/budgets", customerRead, "/v1/customers/{c}/budgets", "", is(200)},
	{"GET /v1/customers/{customer}/rate-budgets", customerRead, "/v1/customers/{c}/rate-budgets", "", is(200)},
	{"POST /v1/grants", holderWrite, "/v1/grants",
		`{"holder":"{h}","generation":1,"customer":"{c}","meter":"tokens","amount":"1"}`, is(201)},
	{"POST /v1/grants/{id}/renew", holderWrite, "/v1/grants/{grant}/renew", `{"holder":"{h}","generation":1,"spent":"0"}`, is(200)},
	{"POST /v1/grants/{id}/release", holderWrite, "/v1/grants/{grant}/release", `{"holder":"{h}","generation":1,"spent":"1"}`, is(200)},
	{"POST /v1/grants/release", holderWrite, "/v1/grants/release",
		`{"holder":"{h}","releases":[{"grant":"{grant}","generation":1,"spent":"1"}]}`, is(200)},
	{"POST /v1/grants/debits", holderWrite, "/v1/grants/debits",
		`{"id":"{uuid}","holder":"{h}","generation":1,"customer":"{c}","meter":"tokens","amount":"1"}`, is(201)},
	{"POST /v1/bypasses", holderWrite, "/v1/bypasses", `{"holder":"{h}","generation":1,"report_id":"{uuid}","items":[{"customer":"{c}",` +
		`"meter":"tokens","amount":"1","admissions":1,"first_at":"2026-11-20T11:00:00Z","last_at":"2026-11-20T11:00:00Z"}]}`, is(200)},
	{"GET /v1/ingest/status", adminOnly, "/v1/ingest/status", "", is(200)},
	{"GET /v1/dead-letters", adminOnly, "/v1/dead-letters", "", is(200)},
	{"GET /v1/dead-letters/{id}", adminOnly, "/v1/dead-letters/{dead}", "", is(200)},
	{"POST /v1/dead-letters/{id}/replay", adminOnly, "/v1/dead-letters/{dead}/replay", "", is(200)},
	{"GET /v1/reconciliations", adminOnly, "/v1/reconciliations", "", is(200)},
	{"GET /v1/reconciliations/{id}", adminOnly, "/v1/reconciliations/{rec}", "", is(200)},
	{"POST /v1/reconciliations", adminOnly, "/v1/reconciliations", `{"period":"2026-10-01","customer":"{c}"}`, is(201)},
	{"GET /v1/pools", adminOnly, "/v1/pools", "", is(200)},
	{"GET /v1/pools/{name}", adminOnly, "/v1/pools/plan", "", is(200)},
	{"PUT /v1/pools/{name}", adminOnly, "/v1/pools/plan", `{"members":["acme","globex"]}`, is(200)},
	{"PUT /v1/pools/{name}/quotas/{meter}", adminOnly, "/v1/pools/plan/quotas/calls", `{"limit":"100"}`, is(200, 201)},
	{"PUT /v1/global/quotas/{meter}", adminOnly, "/v1/global/quotas/calls", `{"limit":"1000"}`, is(200, 201)},
	{"POST /v1/holders/{holder}/retire", adminOnly, "/v1/holders/retiree/retire", "", is(200)},
	{"GET /v1/tokens", adminOnly, "/v1/tokens", "", is(200)},
	{"POST /v1/tokens", adminOnly, "/v1/tokens", `{"customer":"{c}","description":"matrix"}`, is(201)},
	{"POST /v1/tokens/{id}/revoke", adminOnly, "/v1/tokens/{token}/revoke", "", is(200)},
	{"GET /v1/webhooks", adminOnly, "/v1/webhooks", "", is(200)},
	{"PUT /v1/webhooks/{name}", adminOnly, "/v1/webhooks/ops", `{"url":"https://hooks.example.com/tally"}`, is(200, 201)},
	{"GET /v1/webhooks/{name}", adminOnly, "/v1/webhooks/ops", "", is(200)},
	{"POST /v1/webhooks/{name}/rotate-secret", adminOnly, "/v1/webhooks/ops/rotate-secret", "", is(200)},
	{"GET /v1/alerts", adminOnly, "/v1/alerts", "", is(200)},
	{"PUT /v1/alerts/{name}", adminOnly, "/v1/alerts/watch",
		`{"subject":"customer:{c}","meter":"calls","thresholds":[{"percent":"80"}],"endpoints":["ops"]}`, is(200, 201)},
	{"GET /v1/alerts/{name}", adminOnly, "/v1/alerts/watch", "", is(200)},
	{"DELETE /v1/alerts/{name}", adminOnly, "/v1/alerts/watch", "", is(204, 404)},
	{"GET /v1/alert-events", adminOnly, "/v1/alert-events?state=failed", "", is(200)},
	{"POST /v1/alert-events/{id}/redeliver", adminOnly, "/v1/alert-events/{uuid}/redeliver", "", is(404)},
	{"DELETE /v1/webhooks/{name}", adminOnly, "/v1/webhooks/gone", "", is(404)},
	{"GET /v1/meters", adminOnly, "/v1/meters", "", is(200)},
	{"PUT /v1/meters/{meter}", adminOnly, "/v1/meters/seats", `{"kind":"gauge","unit":"seat"}`, is(200)},
	{"GET /v1/meters/{meter}", adminOnly, "/v1/meters/seats", "", is(200)},
}

// matrixCaller is one kind of caller.
type matrixCaller struct {
	name     string
	token    string
	admin    bool
	bad      bool   // no token, or one that is malformed, unknown or revoked: 401 past the public routes
	customer string // a customer token's
	gateway  string // a gateway token's
}

// matrixSide is one set of resources: a customer and the holder that
// serves it. Each caller is tried against both, its own and another's.
type matrixSide struct{ customer, holder string }

// want is what caller gets from row on side: 0 for "allowed" (one of
// row.ok), else the refusal's status.
func (row authzRow) want(c matrixCaller, s matrixSide) int {
	switch {
	case row.access == public:
		return 0
	case c.bad:
		return http.StatusUnauthorized
	case c.admin:
		return 0
	}
	switch row.access {
	case customerRead:
		if c.customer == s.customer {
			return 0
		}
		return http.StatusNotFound // another customer's answers like an unknown one
	case holderWrite:
		if c.gateway != "" && c.gateway == s.holder {
			return 0
		}
		return http.StatusForbidden
	default:
		return http.StatusForbidden
	}
}

// TestAuthorizationMatrix: every route × every kind of caller (no token,
// malformed, unknown, revoked, admin, two customers, two gateways) × its
// own and another's resources answers as docs/design.md §7 and
// docs/gateways-exact.md say, and every route of the router has a row.
func TestAuthorizationMatrix(t *testing.T) {
	t.Parallel()
	// Limits off: this is about who may do what, not how often.
	f := newFixtureWith(t, func(c *api.Config) { c.AddressRate, c.TokenRate, c.GatewayRate = -1, -1, -1 })

	// The routes the router has, each with exactly one row.
	routes, ok := api.Routes(f.h)
	if !ok {
		t.Fatal("the API's handler is not a chi router")
	}
	rows := map[string]authzRow{}
	for _, row := range authzRows {
		if _, dup := rows[row.route]; dup {
			t.Fatalf("two rows for %s", row.route)
		}
		rows[row.route] = row
	}
	var missing, served []string
	_ = chi.Walk(routes, func(method, route string, _ http.Handler, _ ...func(http.Handler) http.Handler) error {
		route = strings.ReplaceAll(route, "/*/", "/")
		key := method + " " + route
		served = append(served, key)
		if _, ok := rows[key]; !ok {
			missing = append(missing, key)
		}
		return nil
	})
	if len(missing) > 0 {
		t.Fatalf("routes without a row in authzRows (add one: who may call it, and a request): %v", missing)
	}
	for key := range rows {
		if !slices.Contains(served, key) {
			t.Errorf("a row for %s, which the router does not serve", key)
		}
	}

	// The resources each side has.
	ctx := context.Background()
	for _, c := range []string{"acme", "globex"} {
		f.do("PUT", "/v1/customers/"+c, adminToken, map[string]any{"cadence": "monthly"})
		f.do("PUT", "/v1/customers/"+c+"/quotas/tokens", adminToken, map[string]any{"limit": "1000000000", "admission": "exact"})
	}
	f.do("PUT", "/v1/pools/plan", adminToken, map[string]any{"members": []string{"acme"}})
	f.do("POST", "/v1/grants", adminToken, map[string]any{"holder": "retiree", "generation": 1, "customer": "acme", "meter": "tokens", "amount": "1"})
	dead := uuid.Must(uuid.NewV7())
	f.exec(`INSERT INTO dead_letters (id, topic, partition, "offset", reason, detail, key, raw, created_at) VALUES
		($1, 'tally.meter-batches', 0, 7, 'bad_json', 'unexpected end of JSON', 'acme', 'x', '2026-11-20T11:00:00Z')`, dead)
	rec := f.do("POST", "/v1/reconciliations", adminToken, map[string]any{"period": "2026-10-01"}).json(t)["id"].(string)
	revokedID, revoked, err := tokens.Create(ctx, f.pool, "acme", "revoked", f.clock())
	if err != nil {
		t.Fatal(err)
	}
	if _, err := tokens.Revoke(ctx, f.pool, revokedID.ID, f.clock()); err != nil {
		t.Fatal(err)
	}
	callers := []matrixCaller{
		{name: "no token", bad: true},
		{name: "malformed", token: "not-a-token", bad: true},
		{name: "unknown", token: "tly_" + strings.Repeat("U", 43), bad: true},
		{name: "revoked", token: revoked, bad: true},
		{name: "admin", token: adminToken, admin: true},
		{name: "customer acme", token: f.token("acme"), customer: "acme"},
		{name: "customer globex", token: f.token("globex"), customer: "globex"},
		{name: "gateway gw1", token: f.gatewayToken("gw1"), gateway: "gw1"},
		{name: "gateway gw2", token: f.gatewayToken("gw2"), gateway: "gw2"},
	}
	sides := []matrixSide{{"acme", "gw1"}, {"globex", "gw2"}}
	fill := func(s string, side matrixSide) string {
		if strings.Contains(s, "{grant}") {
			r := f.do("POST", "/v1/grants", adminToken, map[string]any{"holder": side.holder, "generation": 1,
				"customer": side.customer, "meter": "tokens", "amount": "1"})
			if r.status != 201 {
				t.Fatalf("a grant for the matrix: %d %s", r.status, r.body)
			}
			s = strings.ReplaceAll(s, "{grant}", r.json(t)["id"].(string))
		}
		if strings.Contains(s, "{token}") {
			tok, _, err := tokens.Create(ctx, f.pool, side.customer, "matrix", f.clock())
			if err != nil {
				t.Fatal(err)
			}
			s = strings.ReplaceAll(s, "{token}", tok.ID.String())
		}
		return strings.NewReplacer("{c}", side.customer, "{h}", side.holder, "{uuid}", uuid.NewString(),
			"{dead}", dead.String(), "{rec}", rec).Replace(s)
	}
	cells, wrong := 0, 0
	for _, row := range authzRows {
		method, _, _ := strings.Cut(row.route, " ")
		for _, c := range callers {
			for _, side := range sides {
				var body any
				if row.body != "" {
					body = fill(row.body, side)
				}
				r := f.do(method, fill(row.path, side), c.token, body)
				cells++
				want := row.want(c, side)
				if (want == 0 && !slices.Contains(row.ok, r.status)) || (want != 0 && r.status != want) {
					wrong++
					w := fmt.Sprint(want)
					if want == 0 {
						w = fmt.Sprint(row.ok)
					}
					t.Errorf("%s as %s on %s's resources: %d, want %s: %s", row.route, c.name, side.customer, r.status, w, r.body)
				}
			}
		}
	}
	// A gateway naming itself on another holder's grant is not its holder.
	for _, row := range authzRows {
		if !strings.Contains(row.path, "{grant}") {
			continue
		}
		method, _, _ := strings.Cut(row.route, " ")
		// As gw1, naming itself, on a grant of gw2's.
		path, body := fill(row.path, sides[1]), fill(strings.ReplaceAll(row.body, "{h}", "gw1"), sides[0])
		f.do(method, path, callers[7].token, body).problem(t, 409, api.TypeNotHolder)
		cells++
	}
	t.Logf("%d routes × %d callers × %d sides, and grants of another holder: %d cells, %d wrong",
		len(authzRows), len(callers), len(sides), cells, wrong)
}
