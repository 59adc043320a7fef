package api_test

import (
	"encoding/json"
	"fmt"
	"strings"
	"testing"
)

type statementResp struct {
	Customer string `json:"customer"`
	Period   string `json:"period"`
	State    string `json:"state"`
	Final    bool   `json:"final"`
	Lines    []struct {
		Meter, Usage, Billed string
		Adjustments          string `json:"adjustments"`
	} `json:"lines"`
	ClosedAt         string `json:"closed_at"`
	Forced           bool   `json:"forced"`
	Reason           string `json:"reason"`
	Actor            string `json:"actor"`
	ReconciliationID string `json:"reconciliation_id"`
}

func decodeStatement(t *testing.T, r response) statementResp {
	t.Helper()
	if r.status != 200 {
		t.Fatalf("status %d: %s", r.status, r.body)
	}
	var s statementResp
	if err := json.Unmarshal(r.body, &s); err != nil {
		t.Fatalf("%v: %s", err, r.body)
	}
	return s
}

func TestPeriodsListAndStatement(t *testing.T) {
	t.Parallel()
	f := newFixture(t) // now: 2026-11-20T12:00Z
	f.usage("acme", "api_calls", date("2026-10-15T10:00:00Z"), "10")
	f.usage("acme", "api_calls", date("2026-11-10T10:00:00Z"), "5.5")
	f.usage("acme", "storage_gb", date("2026-11-11T10:00:00Z"), "2")
	f.usage("globex", "api_calls", date("2026-11-10T10:00:00Z"), "1")

	// Billed per meter: a sum across meters would add calls to gigabytes.
	var page struct {
		Items []struct {
			Period, State string
			Billed        map[string]string
		} `json:"items"`
		NextCursor string `json:"next_cursor"`
	}
	r := f.do("GET", "/v1/customers/acme/periods", adminToken, nil)
	if err := json.Unmarshal(r.body, &page); err != nil || r.status != 200 {
		t.Fatalf("%d %v: %s", r.status, err, r.body)
	}
	if len(page.Items) != 2 || page.NextCursor != "" ||
		page.Items[0].Period != "2026-11-01" || page.Items[0].State != "open" || fmt.Sprint(page.Items[0].Billed) != "map[api_calls:5.5 storage_gb:2]" ||
		page.Items[1].Period != "2026-10-01" || page.Items[1].State != "awaiting_close" || fmt.Sprint(page.Items[1].Billed) != "map[api_calls:10]" {
		t.Fatalf("periods: %s", r.body)
	}
	// Paged one at a time, with a customer token of its own.
	tok := f.token("acme")
	r = f.do("GET", "/v1/customers/acme/periods?limit=1", tok, nil)
	_ = json.Unmarshal(r.body, &page)
	if len(page.Items) != 1 || page.Items[0].Period != "2026-11-01" || page.NextCursor == "" {
		t.Fatalf("page 1: %s", r.body)
	}
	r = f.do("GET", "/v1/customers/acme/periods?limit=1&cursor="+page.NextCursor, tok, nil)
	page.NextCursor = "unset"
	_ = json.Unmarshal(r.body, &page)
	if len(page.Items) != 1 || page.Items[0].Period != "2026-10-01" || page.NextCursor != "" {
		t.Fatalf("page 2: %s", r.body)
	}

	if r := f.do("GET", "/v1/customers/globex/periods", adminToken, nil); !strings.Contains(string(r.body), `"billed":{"api_calls":"1"}`) {
		t.Fatalf("globex's periods: %s", r.body)
	}

	st := decodeStatement(t, f.do("GET", "/v1/customers/acme/periods/previous/statement", tok, nil))
	if st.Period != "2026-10-01" || st.State != "awaiting_close" || st.Final || len(st.Lines) != 1 ||
		st.Lines[0].Meter != "api_calls" || st.Lines[0].Usage != "10" || st.Lines[0].Billed != "10" {
		t.Fatalf("statement: %+v", st)
	}
	if st := decodeStatement(t, f.do("GET", "/v1/customers/acme/periods/current/statement", adminToken, nil)); st.Period != "2026-11-01" || st.Lines[0].Billed != "5.5" {
		t.Fatalf("current: %+v", st)
	}

	// Errors.
	f.do("GET", "/v1/customers/globex/periods", tok, nil).problem(t, 404, "urn:tally:problem:not-found")
	f.do("GET", "/v1/customers/globex/periods/current/statement", tok, nil).problem(t, 404, "urn:tally:problem:not-found")
	f.do("GET", "/v1/customers/nobody/periods", adminToken, nil).problem(t, 404, "urn:tally:problem:not-found")
	f.do("GET", "/v1/customers/nobody/periods/current/statement", adminToken, nil).problem(t, 404, "urn:tally:problem:not-found")
	p := f.do("GET", "/v1/customers/acme/periods/2026-10-15/statement", adminToken, nil).problem(t, 404, "urn:tally:problem:period-not-found")
	if p.ContainingPeriod != "2026-10-01" {
		t.Fatalf("containing period %q", p.ContainingPeriod)
	}
	p = f.do("GET", "/v1/customers/acme/periods/last-month/statement", adminToken, nil).problem(t, 400, "urn:tally:problem:invalid-request")
	if fs := fields(p); len(fs) != 1 || fs[0] != "period" {
		t.Fatalf("fields %v", fs)
	}
	p = f.do("GET", "/v1/customers/acme/periods?limit=0&cursor=x&page=2", adminToken, nil).problem(t, 400, "urn:tally:problem:invalid-request")
	if fs := fields(p); strings.Join(fs, ",") != "page" {
		t.Fatalf("fields %v", fs) // unknown parameters are reported first
	}
	p = f.do("GET", "/v1/customers/acme/periods?limit=0&cursor=x", adminToken, nil).problem(t, 400, "urn:tally:problem:invalid-request")
	if fs := fields(p); strings.Join(fs, ",") != "limit,cursor" {
		t.Fatalf("fields %v", fs)
	}
}

func TestPeriodClose(t *testing.T) {
	t.Parallel()
	f := newFixture(t) // now: 2026-11-20T12:00Z
	f.usage("acme", "api_calls", date("2026-10-15T10:00:00Z"), "10")
	f.usage("globex", "api_calls", date("2026-10-15T10:00:00Z"), "7")
	closeURL := "/v1/customers/acme/periods/2026-10-01/close"

	// Not ended, not reconciled, no reason: each refused with what to do.
	p := f.do("POST", "/v1/customers/acme/periods/current/close", adminToken, nil).problem(t, 409, "urn:tally:problem:period-open")
	if !strings.Contains(p.Detail, "2026-12-01T00:00:00Z") {
		t.Fatalf("detail %q", p.Detail)
	}
	p = f.do("POST", closeURL, adminToken, nil).problem(t, 409, "urn:tally:problem:not-reconciled")
	if !strings.Contains(p.Detail, "never been reconciled") || !strings.Contains(p.Detail, "force") {
		t.Fatalf("detail %q", p.Detail)
	}
	p = f.do("POST", closeURL, adminToken, map[string]any{"force": true, "actor": strings.Repeat("x", 501)}).problem(t, 400, "urn:tally:problem:invalid-request")
	if strings.Join(fields(p), ",") != "reason,actor" {
		t.Fatalf("fields %v", fields(p))
	}
	f.do("POST", closeURL, adminToken, map[string]any{"forse": true}).problem(t, 400, "urn:tally:problem:invalid-request")
	f.do("POST", closeURL, adminToken, `{"force": tru`).problem(t, 400, "urn:tally:problem:malformed-json")
	f.do("POST", closeURL, f.token("acme"), nil).problem(t, 403, "urn:tally:problem:forbidden")
	f.do("POST", "/v1/customers/nobody/periods/2026-10-01/close", adminToken, nil).problem(t, 404, "urn:tally:problem:not-found")
	f.do("POST", "/v1/customers/acme/periods/2026-10-02/close", adminToken, nil).problem(t, 404, "urn:tally:problem:period-not-found")

	// In grace: refused unless forced.
	f.setNow(date("2026-11-01T06:00:00Z"))
	p = f.do("POST", closeURL, adminToken, nil).problem(t, 409, "urn:tally:problem:period-open")
	if !strings.Contains(p.Detail, "in grace until 2026-11-02T00:00:00Z") || !strings.Contains(p.Detail, "force") {
		t.Fatalf("detail %q", p.Detail)
	}
	f.setNow(date("2026-11-20T12:00:00Z"))

	// Reconciled clean: closes, and a second close answers the same statement.
	r := f.do("POST", "/v1/reconciliations", adminToken, map[string]any{"period": "2026-10-01", "customer": "acme"})
	if r.status != 201 || r.json(t)["status"] != "clean" {
		t.Fatalf("reconcile: %d %s", r.status, r.body)
	}
	runID := r.json(t)["id"]
	first := f.do("POST", closeURL, adminToken, nil)
	st := decodeStatement(t, first)
	if !st.Final || st.State != "closed" || st.Forced || st.ReconciliationID != runID || st.ClosedAt != "2026-11-20T12:00:00Z" ||
		len(st.Lines) != 1 || st.Lines[0].Billed != "10" {
		t.Fatalf("closed: %s", first.body)
	}
	f.setNow(date("2026-11-21T09:00:00Z"))
	again := f.do("POST", closeURL, adminToken, map[string]any{})
	if again.status != 200 || string(again.body) != string(first.body) {
		t.Fatalf("second close: %d %s\nfirst: %s", again.status, again.body, first.body)
	}
	// Frozen: late usage of October now lands in November.
	f.usage("acme", "api_calls", date("2026-10-20T10:00:00Z"), "3")
	if got := f.do("GET", "/v1/customers/acme/periods/2026-10-01/statement", adminToken, nil); string(got.body) != string(first.body) {
		t.Fatalf("statement after close: %s", got.body)
	}

	// Forced with a reason: recorded with the actor.
	st = decodeStatement(t, f.do("POST", "/v1/customers/globex/periods/2026-10-01/close", adminToken,
		map[string]any{"force": true, "reason": "invoice run deadline", "actor": "ops@example.com"}))
	if !st.Final || !st.Forced || st.Reason != "invoice run deadline" || st.Actor != "ops@example.com" || st.ReconciliationID != "" || st.Lines[0].Billed != "7" {
		t.Fatalf("forced: %+v", st)
	}
}

// Period references outside the range Tally can name and encode (dates
// 1970-01-01 to 9998-12-31, so every period ends before the year 10000)
// are 400 problems naming period on every endpoint that takes one, never
// a 500.
func TestPeriodOutOfRange(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	f.usage("acme", "api_calls", date("2026-11-10T10:00:00Z"), "5")
	for _, ref := range []string{"9999-12-01", "9999-01-01", "0000-01-01", "1969-12-01"} {
		for _, c := range []struct{ method, path string }{
			{"GET", "/v1/customers/acme/usage?period=" + ref},
			{"GET", "/v1/customers/acme/usage?meter=api_calls&group_by=day&period=" + ref},
			{"GET", "/v1/customers/acme/usage?meter=api_calls&group_by=hour&period=" + ref},
			{"GET", "/v1/customers/acme/periods/" + ref + "/statement"},
			{"POST", "/v1/customers/acme/periods/" + ref + "/close"},
			{"GET", "/v1/reconciliations?period=" + ref},
		} {
			var body any
			if c.method == "POST" {
				body = map[string]any{"force": true, "reason": "r", "actor": "a"}
			}
			p := f.do(c.method, c.path, adminToken, body).problem(t, 400, "urn:tally:problem:invalid-request")
			if got := fields(p); len(got) != 1 || got[0] != "period" {
				t.Fatalf("%s %s: fields %v: %+v", c.method, c.path, got, p)
			}
		}
		p := f.do("POST", "/v1/reconciliations", adminToken, map[string]any{"period": ref, "customer": "acme"}).
			problem(t, 400, "urn:tally:problem:invalid-request")
		if got := fields(p); len(got) != 1 || got[0] != "period" {
			t.Fatalf("POST /v1/reconciliations %s: fields %v", ref, got)
		}
	}
	// The first and last supported months are still periods.
	for _, ref := range []string{"1970-01-01", "9998-12-01"} {
		if r := f.do("GET", "/v1/customers/acme/usage?meter=api_calls&group_by=hour&period="+ref, adminToken, nil); r.status != 200 {
			t.Fatalf("%s: %d %s", ref, r.status, r.body)
		}
		if r := f.do("GET", "/v1/customers/acme/periods/"+ref+"/statement", adminToken, nil); r.status != 200 {
			t.Fatalf("%s statement: %d %s", ref, r.status, r.body)
		}
	}
}

// A manual adjustment dated in a closed period is booked in the first
// period not closed as a prior-period adjustment (docs/design.md §4): its
// statement shows it under prior_period_adjustments, beside late usage of
// that period, and names the period in prior_periods_absorbed, open and
// once closed. It was shown under adjustments, named nowhere.
func TestAdjustmentOfAClosedPeriodIsAPriorPeriodAdjustment(t *testing.T) {
	t.Parallel()
	f := newFixture(t) // now: 2026-11-20T12:00Z
	f.usage("acme", "api_calls", date("2026-10-15T10:00:00Z"), "10")
	if r := f.do("POST", "/v1/customers/acme/periods/2026-10-01/close", adminToken,
		map[string]any{"force": true, "reason": "test", "actor": "ops"}); r.status != 200 {
		t.Fatalf("close October: %d %s", r.status, r.body)
	}
	f.usage("acme", "api_calls", date("2026-10-20T10:00:00Z"), "3")
	adjust := func(op, qty string, at any) {
		t.Helper()
		body := map[string]any{"operation_id": op, "customer": "acme", "meter": "api_calls", "quantity": qty, "reason": "credit", "actor": "ops"}
		if at != nil {
			body["occurred_at"] = at
		}
		if r := f.do("POST", "/v1/adjustments", adminToken, body); r.status != 201 {
			t.Fatalf("adjustment %s: %d %s", qty, r.status, r.body)
		}
	}
	adjust("0193e0a1-7c00-7d4e-9a51-3c2f9b7e4a10", "-4", "2026-10-20T12:00:00Z")
	adjust("0193e0a1-7c00-7d4e-9a51-3c2f9b7e4a11", "2", nil)
	check := func(what string) {
		t.Helper()
		r := f.do("GET", "/v1/customers/acme/periods/2026-11-01/statement", adminToken, nil)
		var st struct {
			Lines []struct {
				Meter, Usage, Billed string
				Prior                string `json:"prior_period_adjustments"`
				Adj                  string `json:"adjustments"`
			} `json:"lines"`
			Absorbed []struct {
				PeriodStart string `json:"period_start"`
				Meter       string `json:"meter"`
				Amount      string `json:"amount"`
			} `json:"prior_periods_absorbed"`
		}
		if err := json.Unmarshal(r.body, &st); err != nil || r.status != 200 {
			t.Fatalf("%s: %d %s", what, r.status, r.body)
		}
		if len(st.Lines) != 1 || st.Lines[0].Usage != "0" || st.Lines[0].Prior != "-1" || st.Lines[0].Adj != "2" || st.Lines[0].Billed != "1" ||
			len(st.Absorbed) != 1 || st.Absorbed[0].PeriodStart != "2026-10-01T00:00:00Z" || st.Absorbed[0].Amount != "-1" {
			t.Fatalf("%s: %s, want usage 0, prior_period_adjustments -1 (late 3, credit -4), adjustments 2, billed 1, October absorbed -1", what, r.body)
		}
	}
	check("open November")
	// A reconciliation's totals break the billed total down the same way.
	r := f.do("POST", "/v1/reconciliations", adminToken, map[string]any{"period": "2026-11-01", "customer": "acme"})
	var run struct {
		Totals []struct {
			Usage       string `json:"usage"`
			Prior       string `json:"prior_period_adjustments"`
			Adjustments string `json:"adjustments"`
			Billed      string `json:"billed"`
		} `json:"totals"`
	}
	if err := json.Unmarshal(r.body, &run); err != nil || r.status != 201 || len(run.Totals) != 1 ||
		run.Totals[0].Usage != "0" || run.Totals[0].Prior != "-1" || run.Totals[0].Adjustments != "2" || run.Totals[0].Billed != "1" {
		t.Fatalf("reconciliation: %d %s, want usage 0, prior_period_adjustments -1, adjustments 2, billed 1", r.status, r.body)
	}
	f.setNow(date("2026-12-05T00:00:00Z"))
	if r := f.do("POST", "/v1/customers/acme/periods/2026-11-01/close", adminToken,
		map[string]any{"force": true, "reason": "test", "actor": "ops"}); r.status != 200 {
		t.Fatalf("close November: %d %s", r.status, r.body)
	}
	check("closed November")
}
