package api_test

import (
	"context"
	"encoding/json"
	"strings"
	"testing"
	"time"

	"github.com/tally-ledger/tally/api"
)

func TestReconciliations(t *testing.T) {
	t.Parallel()
	f := newFixture(t) // now: 2026-11-20T12:00Z
	f.usage("acme", "api_calls", date("2026-10-15T10:00:00Z"), "10")
	f.usage("globex", "api_calls", date("2026-10-15T10:00:00Z"), "7")

	r := f.do("POST", "/v1/reconciliations", adminToken, map[string]any{"period": "2026-10-01"})
	run := r.json(t)
	if r.status != 201 || run["status"] != "clean" || r.header.Get("Location") != "/v1/reconciliations/"+run["id"].(string) {
		t.Fatalf("run: %d %v %s", r.status, r.header, r.body)
	}
	totals, _ := run["totals"].([]any)
	if len(totals) != 2 {
		t.Fatalf("totals: %s", r.body)
	}
	// With close: the clean periods whose grace has ended are closed.
	r = f.do("POST", "/v1/reconciliations", adminToken, map[string]any{"period": "2026-10-01", "customer": "globex", "close": true})
	second := r.json(t)
	if r.status != 201 || second["customer"] != "globex" || strings.Join(strs(second["closed"]), ",") != "globex" {
		t.Fatalf("run with close: %d %s", r.status, r.body)
	}
	if st := decodeStatement(t, f.do("GET", "/v1/customers/globex/periods/2026-10-01/statement", adminToken, nil)); !st.Final {
		t.Fatalf("not closed: %+v", st)
	}

	// Listed newest first, paged, with counts instead of findings.
	var page struct {
		Items []struct {
			ID, Period, Status string
			Findings           *int `json:"findings"`
		} `json:"items"`
		NextCursor string `json:"next_cursor"`
	}
	r = f.do("GET", "/v1/reconciliations?period=2026-10-01&limit=1", adminToken, nil)
	if err := json.Unmarshal(r.body, &page); err != nil || len(page.Items) != 1 || page.Items[0].ID != second["id"] ||
		page.Items[0].Findings == nil || page.NextCursor == "" {
		t.Fatalf("page 1: %v %s", err, r.body)
	}
	r = f.do("GET", "/v1/reconciliations?period=2026-10-01&limit=1&cursor="+page.NextCursor, adminToken, nil)
	page.NextCursor = "unset"
	if err := json.Unmarshal(r.body, &page); err != nil || len(page.Items) != 1 || page.Items[0].ID != run["id"] || page.NextCursor != "" {
		t.Fatalf("page 2: %v %s", err, r.body)
	}
	if r := f.do("GET", "/v1/reconciliations?period=2026-09-01", adminToken, nil); string(r.body) != `{"items":[],"next_cursor":""}`+"\n" {
		t.Fatalf("other period: %s", r.body)
	}
	got := f.do("GET", "/v1/reconciliations/"+run["id"].(string), adminToken, nil).json(t)
	if got["id"] != run["id"] || got["status"] != "clean" || got["findings"] == nil || got["checks"] == nil {
		t.Fatalf("get: %v", got)
	}

	// Errors.
	f.do("GET", "/v1/reconciliations/0190f2a4-0000-7000-8000-000000000000", adminToken, nil).problem(t, 404, "urn:tally:problem:not-found")
	f.do("GET", "/v1/reconciliations/nope", adminToken, nil).problem(t, 400, "urn:tally:problem:invalid-request")
	f.do("GET", "/v1/reconciliations", f.token("acme"), nil).problem(t, 403, "urn:tally:problem:forbidden")
	f.do("POST", "/v1/reconciliations", f.token("acme"), map[string]any{"period": "previous"}).problem(t, 403, "urn:tally:problem:forbidden")
	p := f.do("GET", "/v1/reconciliations?period=october&cursor=zz", adminToken, nil).problem(t, 400, "urn:tally:problem:invalid-request")
	if strings.Join(fields(p), ",") != "cursor,period" {
		t.Fatalf("fields %v", fields(p))
	}
	p = f.do("POST", "/v1/reconciliations", adminToken, map[string]any{"customer": "a b", "deep": true}).problem(t, 400, "urn:tally:problem:invalid-request")
	if strings.Join(fields(p), ",") != "customer,deep,period" || !strings.Contains(p.Errors[1].Detail, "tally reconcile --deep") {
		t.Fatalf("problem %+v", p)
	}
	f.do("POST", "/v1/reconciliations", adminToken, map[string]any{"period": "2026-10-01", "customer": "nobody"}).problem(t, 404, "urn:tally:problem:not-found")
	f.do("POST", "/v1/reconciliations", adminToken, map[string]any{"period": "2026-10-02", "customer": "acme"}).problem(t, 404, "urn:tally:problem:period-not-found")

	// Runs of one period never overlap: a run holding its lock makes another 409.
	conn, err := f.pool.Acquire(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Release()
	// reconcile's run lock: (runLockSpace 71541, hashtext(period)).
	if _, err := conn.Exec(context.Background(), `SELECT pg_advisory_lock(71541, hashtext('2026-10-01'))`); err != nil {
		t.Fatal(err)
	}
	p = f.do("POST", "/v1/reconciliations", adminToken, map[string]any{"period": "2026-10-01"}).problem(t, 409, "urn:tally:problem:busy")
	if !strings.Contains(p.Detail, "another reconciliation") {
		t.Fatalf("detail %q", p.Detail)
	}
	if _, err := conn.Exec(context.Background(), `SELECT pg_advisory_unlock(71541, hashtext('2026-10-01'))`); err != nil {
		t.Fatal(err)
	}
}

// TestReconcileTimeout: a synchronous run gets ReconcileTimeout, not the
// (here expired at once) RequestTimeout of every other request.
func TestReconcileTimeout(t *testing.T) {
	t.Parallel()
	f := newFixtureWith(t, func(c *api.Config) { c.RequestTimeout = time.Nanosecond })
	f.usage("acme", "api_calls", date("2026-10-15T10:00:00Z"), "10")
	f.do("GET", "/v1/customers/acme", adminToken, nil).problem(t, 503, "urn:tally:problem:unavailable")
	if r := f.do("POST", "/v1/reconciliations", adminToken, map[string]any{"period": "2026-10-01"}); r.status != 201 || r.json(t)["status"] != "clean" {
		t.Fatalf("run: %d %s", r.status, r.body)
	}
}

func strs(v any) []string {
	var out []string
	for _, x := range asSlice(v) {
		s, _ := x.(string)
		out = append(out, s)
	}
	return out
}

func asSlice(v any) []any {
	s, _ := v.([]any)
	return s
}

// TestReconciliationSummaryFinding: a run lists at most a bound of
// findings of each kind and counts the rest in a summary finding; the
// REST answer shows how many it stands for (omitted), and the list counts
// them among the run's findings and discrepancies.
func TestReconciliationSummaryFinding(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	id := "019a3c8e-7a40-7000-8000-0000000000f1"
	f.exec(`INSERT INTO reconciliation_runs (id, period, status, started_at, finished_at)
		VALUES ($1, '2026-10-01', 'discrepancies', '2026-11-20T02:30:00Z', '2026-11-20T02:31:00Z')`, id)
	f.exec(`INSERT INTO reconciliation_findings (run_id, n, kind, severity, customer, meter, stream, amount, detail, omitted) VALUES
		($1, 0, 'stream_total_mismatch', 'discrepancy', 'acme', 'api_calls', 'gw/1', 1, 'listed', NULL),
		($1, 1, 'open_gap', 'notice', 'acme', 'api_calls', 'gw/1', 2, 'listed', NULL),
		($1, 2, 'stream_total_mismatch', 'discrepancy', NULL, NULL, NULL, NULL, '12345 more stream_total_mismatch findings (discrepancy) not listed', 12345)`, id)

	got := f.do("GET", "/v1/reconciliations/"+id, adminToken, nil).json(t)
	fs, _ := got["findings"].([]any)
	if len(fs) != 3 {
		t.Fatalf("findings: %v", got)
	}
	if s := fs[2].(map[string]any); s["omitted"] != float64(12345) || s["customer"] != nil {
		t.Errorf("summary finding: %v", s)
	}
	if _, ok := fs[0].(map[string]any)["omitted"]; ok {
		t.Errorf("a listed finding has omitted: %v", fs[0])
	}
	var page struct {
		Items []struct {
			Findings      int `json:"findings"`
			Discrepancies int `json:"discrepancies"`
		} `json:"items"`
	}
	r := f.do("GET", "/v1/reconciliations?period=2026-10-01", adminToken, nil)
	if err := json.Unmarshal(r.body, &page); err != nil || len(page.Items) != 1 ||
		page.Items[0].Findings != 12347 || page.Items[0].Discrepancies != 12346 {
		t.Fatalf("list: %v %s", err, r.body)
	}
}

// A customer given empty (a client's {"customer": "$C"} with C unset) is
// a bad customer id, not every customer: with close it closed every
// customer's period, which nothing undoes. Leaving it out still means
// every customer.
func TestReconciliationOfCustomerGivenEmptyClosesNothing(t *testing.T) {
	t.Parallel()
	f := newFixture(t) // now: 2026-11-20T12:00Z
	f.usage("acme", "api_calls", date("2026-10-15T10:00:00Z"), "10")
	f.usage("globex", "api_calls", date("2026-10-15T10:00:00Z"), "7")
	f.do("POST", "/v1/reconciliations", adminToken, map[string]any{"period": "2026-10-01", "customer": "", "close": true}).
		fieldProblem(t, "customer", "is not")
	for _, c := range []string{"acme", "globex"} {
		if st := decodeStatement(t, f.do("GET", "/v1/customers/"+c+"/periods/2026-10-01/statement", adminToken, nil)); st.Final {
			t.Fatalf("%s's October closed by a run of customer \"\"", c)
		}
	}
	if r := f.do("POST", "/v1/reconciliations", adminToken, map[string]any{"period": "2026-10-01"}); r.status != 201 || r.json(t)["customer"] != nil {
		t.Fatalf("a run of every customer: %d %s", r.status, r.body)
	}
}
