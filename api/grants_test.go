package api_test

import (
	"context"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/tally-ledger/tally/api"
	"github.com/tally-ledger/tally/tokens"
)

func (f *fixture) gatewayToken(gateway string) string {
	f.t.Helper()
	_, secret, err := tokens.CreateGateway(context.Background(), f.pool, gateway, "test", f.clock())
	if err != nil {
		f.t.Fatal(err)
	}
	return secret
}

func TestGrants(t *testing.T) {
	t.Parallel()
	f := newFixture(t) // now: 2026-11-20T12:00Z
	const problem = "urn:tally:problem:"
	if r := f.do("PUT", "/v1/customers/acme/quotas/tokens", adminToken, map[string]any{"limit": "100", "admission": "exact"}); r.status != 201 ||
		r.json(t)["admission"] != "exact" || r.json(t)["on_unreachable"] != "deny" {
		t.Fatalf("exact rule: %d %s", r.status, r.body)
	}
	gw1, gw2, cust := f.gatewayToken("gw1"), f.gatewayToken("gw2"), f.token("acme")
	grant := func(tok, holder string, gen int, amount string) response {
		return f.do("POST", "/v1/grants", tok, map[string]any{"holder": holder, "generation": gen, "customer": "acme",
			"meter": "tokens", "amount": amount, "ttl": "30s"})
	}

	r := grant(gw1, "gw1", 1, "60")
	g := r.json(t)
	if r.status != 201 || g["amount"] != "60" || g["available"] != "40" || g["spent"] != "0" || g["valid_until"] != "2026-11-20T12:00:30Z" ||
		g["reclaim_at"] != "2026-11-20T12:00:35Z" || g["state"] != "live" || g["period"] != "2026-11-01" {
		t.Fatalf("grant: %d %s", r.status, r.body)
	}
	id := g["id"].(string)

	// A gateway token manages only its own holder; customer tokens none.
	grant(gw1, "gw2", 1, "1").problem(t, 403, problem+"forbidden")
	grant(cust, "gw1", 1, "1").problem(t, 403, problem+"forbidden")

	p := grant(gw2, "gw2", 1, "50").problem(t, 409, problem+"budget-exhausted")
	if p.Binding != "customer:acme/tokens" || p.Available != "40" || p.RetryAfter == nil || *p.RetryAfter != 35 {
		t.Fatalf("refusal: %+v", p)
	}
	if r := f.do("POST", "/v1/grants", gw2, map[string]any{"holder": "gw2", "generation": 1, "customer": "acme",
		"meter": "tokens", "amount": "50", "min_amount": "40"}); r.status != 201 || r.json(t)["amount"] != "40" {
		t.Fatalf("min_amount: %d %s", r.status, r.body)
	}

	f.setNow(f.clock().Add(10 * time.Second))
	if r := f.do("POST", "/v1/grants/"+id+"/renew", gw1, map[string]any{"holder": "gw1", "generation": 1, "spent": "10", "ttl": "30s"}); r.status != 200 ||
		r.json(t)["valid_until"] != "2026-11-20T12:00:40Z" || r.json(t)["spent"] != "10" {
		t.Fatalf("renew: %d %s", r.status, r.body)
	}
	f.do("POST", "/v1/grants/"+id+"/release", gw2, map[string]any{"holder": "gw2", "generation": 1, "spent": "20"}).problem(t, 409, problem+"not-holder")
	p = f.do("POST", "/v1/grants/"+id+"/release", gw1, map[string]any{"holder": "gw1", "generation": 1, "spent": "5"}).problem(t, 400, problem+"invalid-request")
	if got := strings.Join(fields(p), ","); got != "spent" {
		t.Fatalf("spent backwards: %+v", p)
	}
	if r := f.do("POST", "/v1/grants/"+id+"/release", gw1, map[string]any{"holder": "gw1", "generation": 1, "spent": "20"}); r.status != 200 ||
		r.json(t)["state"] != "ended" || r.json(t)["end_reason"] != "released" {
		t.Fatalf("release: %d %s", r.status, r.body)
	}
	f.do("POST", "/v1/grants/"+id+"/renew", gw1, map[string]any{"holder": "gw1", "generation": 1, "spent": "20"}).problem(t, 409, problem+"grant-ended")

	// A restarted holder: its older generation is refused.
	r = grant(gw1, "gw1", 2, "10")
	if r.status != 201 {
		t.Fatalf("generation 2: %d %s", r.status, r.body)
	}
	f.do("POST", "/v1/grants/"+r.json(t)["id"].(string)+"/renew", gw1, map[string]any{"holder": "gw1", "generation": 1, "spent": "0"}).
		problem(t, 409, problem+"stale-generation")
	grant(gw1, "gw1", 1, "1").problem(t, 409, problem+"stale-generation")

	if r := f.do("POST", "/v1/bypasses", gw2, map[string]any{"holder": "gw2", "generation": 1, "report_id": "r1",
		"items": []map[string]any{{"customer": "acme", "meter": "tokens", "amount": "3", "admissions": 3,
			"first_at": "2026-11-20T11:00:00Z", "last_at": "2026-11-20T11:01:00Z"}}}); r.status != 200 {
		t.Fatalf("bypasses: %d %s", r.status, r.body)
	}

	// Listings, readable by the customer's token. The released grant's
	// unspent 40 went back to the budget: nothing is stranded.
	r = f.do("GET", "/v1/customers/acme/budgets", cust, nil)
	b := asSlice(r.json(t)["items"])
	if r.status != 200 || len(b) != 1 {
		t.Fatalf("budgets: %d %s", r.status, r.body)
	}
	bud := b[0].(map[string]any)
	if bud["limit"] != "100" || bud["consumed"] != "70" || bud["live"] != "50" || bud["stranded"] != "0" ||
		bud["bypassed"] != "3" || bud["available"] != "30" {
		t.Fatalf("budget: %s", r.body)
	}
	if r := f.do("GET", "/v1/customers/acme/grants?state=live", cust, nil); r.status != 200 || len(asSlice(r.json(t)["items"])) != 2 {
		t.Fatalf("live grants: %d %s", r.status, r.body)
	}
	r = f.do("GET", "/v1/customers/acme/grants?state=ended&limit=1", adminToken, nil)
	if items := asSlice(r.json(t)["items"]); r.status != 200 || len(items) != 1 || items[0].(map[string]any)["id"] != id {
		t.Fatalf("ended grants: %d %s", r.status, r.body)
	}
	r = f.do("GET", "/v1/customers/acme/grants?limit=2", adminToken, nil)
	next := r.json(t)["next_cursor"].(string)
	r = f.do("GET", "/v1/customers/acme/grants?limit=2&cursor="+next, adminToken, nil)
	if items := asSlice(r.json(t)["items"]); r.status != 200 || len(items) != 1 || r.json(t)["next_cursor"] != "" {
		t.Fatalf("second page: %d %s", r.status, r.body)
	}
	f.do("GET", "/v1/customers/acme/grants?state=gone", adminToken, nil).problem(t, 400, problem+"invalid-request")
	f.do("GET", "/v1/customers/acme/grants", f.token("globex"), nil).problem(t, 404, problem+"not-found")
	f.do("GET", "/v1/customers/acme/budgets", gw1, nil).problem(t, 404, problem+"not-found")

	// Lagged rules are not served by grants.
	f.do("PUT", "/v1/customers/acme/quotas/calls", adminToken, map[string]any{"limit": "5"})
	// The problem says which (the admit SDK then answers from decisions,
	// or admits: no rule, no quota).
	p = f.do("POST", "/v1/grants", adminToken, map[string]any{"holder": "gw1", "generation": 2, "customer": "acme",
		"meter": "calls", "amount": "1"}).problem(t, 409, problem+"not-exact")
	if p.Admission != "lagged" {
		t.Fatalf("not-exact for a lagged rule: admission %q", p.Admission)
	}
	p = f.do("POST", "/v1/grants", adminToken, map[string]any{"holder": "gw1", "generation": 2, "customer": "acme",
		"meter": "no-rule", "amount": "1"}).problem(t, 409, problem+"not-exact")
	if p.Admission != "none" {
		t.Fatalf("not-exact without a rule: admission %q", p.Admission)
	}
	p = f.do("POST", "/v1/grants", adminToken, map[string]any{"holder": "g w", "generation": 0, "customer": "acme",
		"meter": "calls", "amount": "-1", "ttl": "2h"}).problem(t, 400, problem+"invalid-request")
	if got := strings.Join(fields(p), ","); got != "holder,generation,amount,ttl" {
		t.Fatalf("fields %s", got)
	}
}

// Config.MaxSkew sets reclaim_at = valid_until + MaxSkew; a grant is not
// reclaimed before (its capacity stays taken), and is once it passes.
// Out of bounds, the API does not start.
func TestGrantMaxSkewConfigured(t *testing.T) {
	t.Parallel()
	f := newFixtureWith(t, func(c *api.Config) { c.MaxSkew = 40 * time.Second })
	f.do("PUT", "/v1/customers/acme/quotas/tokens", adminToken, map[string]any{"limit": "100", "admission": "exact"})
	grant := func(holder string) response {
		return f.do("POST", "/v1/grants", adminToken, map[string]any{"holder": holder, "generation": 1, "customer": "acme",
			"meter": "tokens", "amount": "100", "ttl": "30s"})
	}
	if g := grant("gw1").json(t); g["valid_until"] != "2026-11-20T12:00:30Z" || g["reclaim_at"] != "2026-11-20T12:01:10Z" {
		t.Fatalf("grant: %v", g)
	}
	live := func() int {
		return len(asSlice(f.do("GET", "/v1/customers/acme/grants?state=live", adminToken, nil).json(t)["items"]))
	}
	f.setNow(f.clock().Add(69 * time.Second)) // past valid_until + the default 5 s, within 40 s
	if p := grant("gw2").problem(t, 409, "urn:tally:problem:budget-exhausted"); p.RetryAfter == nil || *p.RetryAfter != 1 || live() != 1 {
		t.Fatalf("before reclaim_at: %+v, %d live", p, live())
	}
	f.setNow(f.clock().Add(time.Second))
	if live() != 0 {
		t.Fatalf("a grant is live at its reclaim_at")
	}
	for _, d := range []time.Duration{500 * time.Millisecond, 11 * time.Minute} {
		_, err := api.New(api.Config{Pool: f.pool, Ledger: f.ledger, AdminToken: adminToken, MaxSkew: d})
		if err == nil || !strings.Contains(err.Error(), "max_skew") {
			t.Errorf("MaxSkew %s: %v", d, err)
		}
	}
}

// A grant's answer says what the budgets it drew from have left after it:
// the smallest limit − consumed, here the pool's; a renew's answer does not.
func TestGrantAnswerSaysWhatIsLeft(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	f.exactInPool("x", "100", "p", "50")
	gw := f.gatewayToken("gw")
	grant := func(amount string) map[string]any {
		t.Helper()
		r := f.do("POST", "/v1/grants", gw, map[string]any{"holder": "gw", "generation": 1, "customer": "x", "meter": "calls",
			"amount": amount, "min_amount": "1"})
		if r.status != 201 {
			t.Fatalf("grant %s: %d %s", amount, r.status, r.body)
		}
		return r.json(t)
	}
	g := grant("20.5")
	if g["available"] != "29.5" {
		t.Fatalf("after 20.5 of the pool's 50: %v", g)
	}
	if g := grant("40"); g["amount"] != "29.5" || g["available"] != "0" {
		t.Fatalf("the rest of the pool: %v", g)
	}
	r := f.do("POST", "/v1/grants/"+g["id"].(string)+"/renew", gw, map[string]any{"holder": "gw", "generation": 1, "spent": "1"})
	if _, ok := r.json(t)["available"]; r.status != 200 || ok {
		t.Fatalf("renew: %d %s", r.status, r.body)
	}
}

// A gateway route refused for its token says which token it takes: a
// gateway token (tally tokens create --gateway H), not only "a customer
// token".
func TestGrantRoutes401NamesGatewayTokens(t *testing.T) {
	f := newFixture(t)
	for _, tok := range []string{"", "no-such-token"} {
		for _, path := range []string{"/v1/grants", "/v1/bypasses", "/v1/grants/00000000-0000-0000-0000-000000000000/release"} {
			p := f.do("POST", path, tok, map[string]any{}).problem(t, 401, "urn:tally:problem:unauthorized")
			if !strings.Contains(p.Detail, "gateway token") || !strings.Contains(p.Detail, "--gateway") {
				t.Errorf("POST %s with token %q: %q does not name gateway tokens", path, tok, p.Detail)
			}
		}
	}
}

// An admin route refused to a gateway token says what a gateway token
// may do, not that it is a customer token.
func TestAdminRoute403ToAGatewayTokenSaysSo(t *testing.T) {
	f := newFixture(t)
	p := f.do("POST", "/v1/holders/gw1/retire", f.gatewayToken("gw1"), nil).problem(t, 403, "urn:tally:problem:forbidden")
	if strings.Contains(p.Detail, "customer token") || !strings.Contains(p.Detail, "gateway token") || !strings.Contains(p.Detail, "admin token") {
		t.Errorf("403 to a gateway token: %q, want it to say what a gateway token may do and that this needs the admin token", p.Detail)
	}
}

// A duration given as zero is refused on its field, as one out of range
// is: a grant's or a renewal's ttl "0s" (or 0) was silently the default
// 30 s, a release's "0s" passed as if no ttl were given, and a pool's or
// the global rate rule's max_skew "0s" was silently the deployment's.
// Left out or null, each keeps its default.
func TestZeroDurationIsRefusedNotTakenAsDefault(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	f.do("PUT", "/v1/customers/acme/quotas/calls", adminToken, map[string]any{"limit": "100", "admission": "exact"})
	gw := f.gatewayToken("gw1")
	grant := func(ttl any) response {
		return f.do("POST", "/v1/grants", gw, map[string]any{"holder": "gw1", "generation": 1, "customer": "acme", "meter": "calls",
			"amount": "1", "ttl": ttl})
	}
	for _, ttl := range []any{"0s", 0, "0ms", "-1s", "2h", "500us"} {
		grant(ttl).fieldProblem(t, "ttl", "from 1ms to 1h")
	}
	r := grant("1ms")
	if r.status != 201 || r.json(t)["valid_until"] != "2026-11-20T12:00:00.001Z" {
		t.Fatalf("grant with ttl 1ms: %d %s", r.status, r.body)
	}
	id := grant(nil).json(t)["id"].(string)
	renew := func(ttl any) response {
		return f.do("POST", "/v1/grants/"+id+"/renew", gw, map[string]any{"holder": "gw1", "generation": 1, "spent": "0", "ttl": ttl})
	}
	for _, ttl := range []any{"0s", 0, "-1s", "2h"} {
		renew(ttl).fieldProblem(t, "ttl", "from 1ms to 1h")
	}
	if r := renew(nil); r.status != 200 || r.json(t)["valid_until"] != "2026-11-20T12:00:30Z" {
		t.Fatalf("renew with ttl null: %d %s", r.status, r.body)
	}
	f.do("POST", "/v1/grants/"+id+"/release", gw, map[string]any{"holder": "gw1", "generation": 1, "spent": "0", "ttl": "0s"}).
		fieldProblem(t, "ttl", "a release takes no ttl")
	// A zero ttl is named beside every other field at fault, as every
	// problem names them all at once.
	p := f.do("POST", "/v1/grants", gw, map[string]any{"holder": "gw1", "generation": 1, "customer": "acme", "meter": "calls",
		"amount": "-1", "ttl": "0s"}).problem(t, 400, api.TypeInvalidRequest)
	if got := fields(p); !slices.Equal(got, []string{"ttl", "amount"}) {
		t.Errorf("grant with ttl 0s and amount -1: fields %v, want [ttl amount]", got)
	}
	p2 := f.do("POST", "/v1/grants/"+id+"/renew", gw, map[string]any{"holder": "gw1", "generation": 1, "spent": "-1", "ttl": "0s"}).
		problem(t, 400, api.TypeInvalidRequest)
	if got := fields(p2); !slices.Equal(got, []string{"ttl", "spent"}) {
		t.Errorf("renew with ttl 0s and spent -1: fields %v, want [ttl spent]", got)
	}

	f.putPool("team", "acme")
	for _, path := range []string{"/v1/customers/acme/quotas/calls", "/v1/pools/team/quotas/calls", "/v1/global/quotas/calls"} {
		for _, skew := range []any{"0s", 0} {
			f.do("PUT", path, adminToken, map[string]any{"rate": map[string]any{"amount": "1", "per": "1s", "burst": "2"},
				"admission": "exact", "max_skew": skew}).fieldProblem(t, "max_skew", "from 100ms to 10m")
		}
	}
}

// A customer's and a pool's exact budget of the period is listed as soon
// as its rule is in force, with what the period already consumed, not
// only once a first grant created its row; reading it writes nothing.
func TestBudgetOfRuleInForceIsListedBeforeTheFirstGrant(t *testing.T) {
	t.Parallel()
	f := newFixture(t) // now: 2026-11-20T12:00Z
	f.usage("acme", "calls", f.clock().Add(-time.Hour), "7")
	f.exactInPool("acme", "100", "team", "50")
	cust := f.token("acme")
	budget := func(consumed, available, live string) {
		t.Helper()
		r := f.do("GET", "/v1/customers/acme/budgets", cust, nil)
		items := asSlice(r.json(t)["items"])
		if r.status != 200 || len(items) != 1 {
			t.Fatalf("budgets: %d %s", r.status, r.body)
		}
		b := items[0].(map[string]any)
		if b["customer"] != "acme" || b["meter"] != "calls" || b["period"] != "2026-11-01" || b["period_start"] != "2026-11-01T00:00:00Z" ||
			b["limit"] != "100" || b["rule_version"] != 1.0 || b["consumed"] != consumed || b["available"] != available ||
			b["live"] != live || b["stranded"] != "0" || b["bypassed"] != "0" {
			t.Fatalf("budget: %s, want consumed %s, available %s, live %s", r.body, consumed, available, live)
		}
		r = f.do("GET", "/v1/pools/team", adminToken, nil)
		items = asSlice(r.json(t)["budgets"])
		if r.status != 200 || len(items) != 1 {
			t.Fatalf("pool budgets: %d %s", r.status, r.body)
		}
		b = items[0].(map[string]any)
		if b["scope"] != "pool:team" || b["meter"] != "calls" || b["period_start"] != "2026-11-01T00:00:00Z" ||
			b["limit"] != "50" || b["rule_version"] != 1.0 || b["consumed"] != consumed || b["live"] != live || b["stranded"] != "0" {
			t.Fatalf("pool budget: %s, want consumed %s, live %s", r.body, consumed, live)
		}
	}
	budget("7", "93", "0")
	var rows int
	if err := f.pool.QueryRow(context.Background(),
		`SELECT (SELECT count(*) FROM admission_budgets) + (SELECT count(*) FROM admission_scope_budgets)`).Scan(&rows); err != nil || rows != 0 {
		t.Fatalf("reading budgets wrote %d rows (%v)", rows, err)
	}
	gw := f.gatewayToken("gw")
	if r := f.do("POST", "/v1/grants", gw, map[string]any{"holder": "gw", "generation": 1, "customer": "acme", "meter": "calls",
		"amount": "10"}); r.status != 201 {
		t.Fatalf("grant: %d %s", r.status, r.body)
	}
	budget("17", "83", "10")
}

// A budget row last brought to an older rule version than the one in
// force is listed with what its period consumed under the version in
// force, and with the period's grants it will count as live, as the next
// grant finds it, not as it was at the row's last grant; reading it
// writes nothing. The customer's listing (and the console's, which reads
// the same) and a pool's showed the consumed of the row's last grant,
// with the new version's limit and version, until a grant brought the
// row.
func TestBudgetAfterARuleChangeShowsWhatThePeriodConsumed(t *testing.T) {
	t.Parallel()
	f := newFixture(t) // now: 2026-11-20T12:00Z
	put := func(path string, body map[string]any) {
		t.Helper()
		if r := f.do("PUT", path, adminToken, body); r.status != 200 && r.status != 201 {
			t.Fatalf("PUT %s: %d %s", path, r.status, r.body)
		}
	}
	put("/v1/customers/acme/quotas/calls", map[string]any{"limit": "100", "admission": "exact"})
	f.putPool("team", "acme")
	put("/v1/pools/team/quotas/calls", map[string]any{"limit": "50", "admission": "exact"})
	gw := f.gatewayToken("gw")
	grant := func(amount string) string {
		t.Helper()
		r := f.do("POST", "/v1/grants", gw, map[string]any{"holder": "gw", "generation": 1, "customer": "acme", "meter": "calls",
			"amount": amount, "ttl": "1h"})
		if r.status != 201 {
			t.Fatalf("grant %s: %d %s", amount, r.status, r.body)
		}
		return r.json(t)["id"].(string)
	}
	id := grant("10")
	if r := f.do("POST", "/v1/grants/"+id+"/release", gw, map[string]any{"holder": "gw", "generation": 1, "spent": "10"}); r.status != 200 {
		t.Fatalf("release: %d %s", r.status, r.body)
	}
	f.usage("acme", "calls", f.clock().Add(-time.Minute), "10") // what the grant admitted
	// The customer's rule is lagged for a while: its gateways admit 25
	// more without grants, and a grant of 4 draws from the pool only.
	// Then the rule is exact again with a higher limit, and the pool's
	// limit is raised.
	f.setNow(f.clock().Add(time.Minute))
	put("/v1/customers/acme/quotas/calls", map[string]any{"limit": "100"})
	f.usage("acme", "calls", f.clock(), "25")
	grant("4")
	f.setNow(f.clock().Add(time.Minute))
	put("/v1/customers/acme/quotas/calls", map[string]any{"limit": "200", "admission": "exact"})
	put("/v1/pools/team/quotas/calls", map[string]any{"limit": "80", "admission": "exact"})

	cust := f.token("acme")
	budget := func(consumed, available, poolAvailable, live string) {
		t.Helper()
		r := f.do("GET", "/v1/customers/acme/budgets", cust, nil)
		items := asSlice(r.json(t)["items"])
		if r.status != 200 || len(items) != 1 {
			t.Fatalf("budgets: %d %s", r.status, r.body)
		}
		b := items[0].(map[string]any)
		if b["limit"] != "200" || b["rule_version"] != 3.0 || b["consumed"] != consumed || b["available"] != available ||
			b["live"] != live || b["stranded"] != "0" {
			t.Errorf("customer budget: %s, want limit 200, rule_version 3, consumed %s, available %s, live %s", r.body, consumed, available, live)
		}
		r = f.do("GET", "/v1/pools/team", adminToken, nil)
		items = asSlice(r.json(t)["budgets"])
		if r.status != 200 || len(items) != 1 {
			t.Fatalf("pool budgets: %d %s", r.status, r.body)
		}
		b = items[0].(map[string]any)
		if b["limit"] != "80" || b["rule_version"] != 2.0 || b["consumed"] != consumed || b["available"] != poolAvailable ||
			b["live"] != live || b["stranded"] != "0" {
			t.Errorf("pool budget: %s, want limit 80, rule_version 2, consumed %s, available %s, live %s", r.body, consumed, poolAvailable, live)
		}
	}
	stored := func() string {
		t.Helper()
		var s string
		if err := f.pool.QueryRow(context.Background(), `SELECT
			(SELECT string_agg(consumed::text || '@' || rule_version, ',') FROM admission_budgets) || ' ' ||
			(SELECT string_agg(consumed::text || '@' || rule_version, ',') FROM admission_scope_budgets)`).Scan(&s); err != nil {
			t.Fatal(err)
		}
		return s
	}
	before := stored()
	// 10 released at 10 spent, 4 live, 25 admitted without a grant.
	budget("39", "161", "41", "4")
	if after := stored(); after != before {
		t.Fatalf("reading budgets wrote: %s, was %s", after, before)
	}
	grant("5")
	budget("44", "156", "36", "9")
}

// exactInPool gives customer an exact rule of limit on calls, makes it
// pool's only member, and gives the pool an exact rule of poolLimit.
func (f *fixture) exactInPool(customer, limit, pool, poolLimit string) {
	f.t.Helper()
	if r := f.do("PUT", "/v1/customers/"+customer+"/quotas/calls", adminToken, map[string]any{"limit": limit, "admission": "exact"}); r.status != 201 {
		f.t.Fatalf("customer rule: %d %s", r.status, r.body)
	}
	f.putPool(pool, customer)
	if r := f.do("PUT", "/v1/pools/"+pool+"/quotas/calls", adminToken, map[string]any{"limit": poolLimit, "admission": "exact"}); r.status != 201 {
		f.t.Fatalf("pool rule: %d %s", r.status, r.body)
	}
}
