package api_test

import (
	"context"
	"encoding/json"
	"fmt"
	"slices"
	"strings"
	"sync"
	"testing"
)

func TestAdjustmentIdempotent(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	f.usage("acme", "api_calls", date("2026-11-20T10:00:00Z"), "10")
	credit := map[string]any{
		"operation_id": "0193e0a1-7c00-7d4e-9a51-3c2f9b7e4a10", "customer": "acme", "meter": "api_calls",
		"quantity": "-2.50", "reason": "outage credit INC-42", "actor": "ops@example.com",
	}
	first := f.do("POST", "/v1/adjustments", adminToken, credit)
	if first.status != 201 {
		t.Fatalf("create: %d %s", first.status, first.body)
	}
	m := first.json(t)
	if m["quantity"] != "-2.5" || m["period_start"] != "2026-11-01T00:00:00Z" || m["occurred_at"] != "2026-11-20T12:00:00Z" || m["prior_period_start"] != nil {
		t.Fatalf("adjustment = %s", first.body)
	}
	f.setNow(date("2026-11-20T13:00:00Z")) // a retry later is still the same request
	again := f.do("POST", "/v1/adjustments", adminToken, credit)
	if again.status != 200 || string(again.body) != string(first.body) {
		t.Fatalf("retry: %d %s\nfirst: %s", again.status, again.body, first.body)
	}
	other := map[string]any{}
	for k, v := range credit {
		other[k] = v
	}
	other["quantity"] = "-3"
	p := f.do("POST", "/v1/adjustments", adminToken, other).problem(t, 409, "urn:tally:problem:idempotency-conflict")
	if !slices.Equal(fields(p), []string{"operation_id"}) {
		t.Fatalf("conflict fields: %+v", p)
	}
	// The usage shows the credit once.
	if u := f.do("GET", "/v1/customers/acme/usage?meter=api_calls", adminToken, nil).json(t); u["total"] != "7.5" {
		t.Fatalf("usage total after credit = %v", u["total"])
	}
	// A debit in a closed period becomes a prior-period adjustment.
	f.exec(`INSERT INTO period_closes (customer, period_start, period_end, closed_at, statement, forced, reason, actor)
		VALUES ('acme', '2026-10-01T00:00:00Z', '2026-11-01T00:00:00Z', now(), '{}', true, 'test', 'test')`)
	late := map[string]any{"operation_id": "0193e0a1-7c00-7d4e-9a51-3c2f9b7e4a11", "customer": "acme", "meter": "api_calls",
		"quantity": "4", "occurred_at": "2026-10-15T08:00:00+02:00", "reason": "missed batch", "actor": "ops"}
	r := f.do("POST", "/v1/adjustments", adminToken, late)
	if m := r.json(t); r.status != 201 || m["period_start"] != "2026-11-01T00:00:00Z" || m["prior_period_start"] != "2026-10-01T00:00:00Z" || m["occurred_at"] != "2026-10-15T06:00:00Z" {
		t.Fatalf("prior-period adjustment: %d %s", r.status, r.body)
	}
}

func TestAdjustmentErrors(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	valid := func(change map[string]any) string {
		m := map[string]any{"operation_id": "0193e0a1-7c00-7d4e-9a51-3c2f9b7e4a10", "customer": "acme", "meter": "api_calls",
			"quantity": "-1", "reason": "r", "actor": "a"}
		for k, v := range change {
			if v == nil {
				delete(m, k)
			} else {
				m[k] = v
			}
		}
		b, _ := json.Marshal(m)
		return string(b)
	}
	inv := "urn:tally:problem:invalid-request"
	tests := []struct {
		name   string
		body   string
		status int
		typ    string
		fields []string
	}{
		{"all missing", `{}`, 400, inv, []string{"operation_id", "quantity", "customer", "meter", "reason", "actor"}},
		{"operation id not a uuid", valid(map[string]any{"operation_id": "42"}), 400, inv, []string{"operation_id"}},
		{"operation id braces", valid(map[string]any{"operation_id": "{0193e0a1-7c00-7d4e-9a51-3c2f9b7e4a10}"}), 400, inv, []string{"operation_id"}},
		{"quantity number", `{"operation_id":"0193e0a1-7c00-7d4e-9a51-3c2f9b7e4a10","customer":"acme","meter":"m","quantity":12,"reason":"r","actor":"a"}`, 400, inv, []string{"quantity"}},
		{"quantity exponent", valid(map[string]any{"quantity": "1e5"}), 400, inv, []string{"quantity"}},
		{"quantity zero", valid(map[string]any{"quantity": "0.000"}), 400, inv, []string{"quantity"}},
		{"quantity 39 digits", valid(map[string]any{"quantity": "1" + strings.Repeat("0", 38)}), 400, inv, []string{"quantity"}},
		{"quantity 10 decimals", valid(map[string]any{"quantity": "0.0000000001"}), 400, inv, []string{"quantity"}},
		{"quantity huge", valid(map[string]any{"quantity": strings.Repeat("9", 5000)}), 400, inv, []string{"quantity"}},
		{"quantity NaN", valid(map[string]any{"quantity": "NaN"}), 400, inv, []string{"quantity"}},
		{"sql customer", valid(map[string]any{"customer": "acme'); DELETE FROM entries; --"}), 400, inv, []string{"customer"}},
		{"unicode meter", valid(map[string]any{"meter": "ápi"}), 400, inv, []string{"meter"}},
		{"occurred_at future", valid(map[string]any{"occurred_at": "2026-11-20T12:06:00Z"}), 400, inv, []string{"occurred_at"}},
		{"occurred_at no zone", valid(map[string]any{"occurred_at": "2026-11-20T12:00:00"}), 400, inv, []string{"occurred_at"}},
		{"occurred_at year 1", valid(map[string]any{"occurred_at": "0001-01-01T00:00:00Z"}), 400, inv, []string{"occurred_at"}},
		{"occurred_at number", `{"operation_id":"0193e0a1-7c00-7d4e-9a51-3c2f9b7e4a10","customer":"acme","meter":"m","quantity":"1","reason":"r","actor":"a","occurred_at":1700000000}`, 400, inv, []string{"occurred_at"}},
		{"reason too long", valid(map[string]any{"reason": strings.Repeat("r", 1001)}), 400, inv, []string{"reason"}},
		{"unknown field", valid(map[string]any{"amount": "1"}), 400, inv, []string{"amount"}},
		{"truncated", valid(nil)[:40], 400, "urn:tally:problem:malformed-json", nil},
		{"trailing garbage", valid(nil) + "]", 400, "urn:tally:problem:malformed-json", nil},
		{"null", `null`, 400, inv, []string{"operation_id", "quantity", "customer", "meter", "reason", "actor"}},
		{"10 MB", valid(map[string]any{"reason": strings.Repeat("r", 10<<20)}), 413, "urn:tally:problem:body-too-large", nil},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			p := f.do("POST", "/v1/adjustments", adminToken, tt.body).problem(t, tt.status, tt.typ)
			if got := fields(p); !slices.Equal(got, tt.fields) {
				t.Fatalf("fields %v, want %v: %+v", got, tt.fields, p)
			}
		})
	}
	var n int
	_ = f.pool.QueryRow(t.Context(), `SELECT count(*) FROM entries`).Scan(&n)
	if n != 0 {
		t.Fatalf("%d entries booked by bad requests", n)
	}
	// A chunked 10 MB body (no Content-Length) is cut off too.
	req := mustRequest(t, "POST", f.srv.URL+"/v1/adjustments", "")
	req.Body = ioNopCloser(strings.NewReader(valid(map[string]any{"reason": strings.Repeat("r", 10<<20)})))
	req.ContentLength = -1
	req.Header.Set("Authorization", "Bearer "+adminToken)
	req.Header.Set("Content-Type", "application/json")
	f.send(req).problem(t, 413, "urn:tally:problem:body-too-large")
}

// Concurrent retries of one adjustment (a client that timed out and
// retried while the first request was still in flight) get the stored
// answer, and a different body under the same operation_id gets 409:
// never a 500 from the unique key, and the amount is booked once.
func TestAdjustmentConcurrentRetries(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	f.usage("acme", "api_calls", date("2026-11-20T10:00:00Z"), "100")
	const rounds, n = 6, 8
	for round := 0; round < rounds; round++ {
		op := fmt.Sprintf("0193e0a1-7c00-7d4e-9a51-3c2f9b7e4b%02d", round)
		bodies := []map[string]any{
			{"operation_id": op, "customer": "acme", "meter": "api_calls", "quantity": "-1", "reason": "credit", "actor": "ops"},
			{"operation_id": op, "customer": "acme", "meter": "api_calls", "quantity": "-7", "reason": "credit", "actor": "ops"},
		}
		start := make(chan struct{})
		res := make([]response, n)
		sent := make([]string, n)
		var wg sync.WaitGroup
		for i := 0; i < n; i++ {
			wg.Add(1)
			go func() {
				defer wg.Done()
				<-start
				// Round 0..2: all identical; later rounds: every fourth body differs.
				body := bodies[0]
				if round >= 3 && i%4 == 3 {
					body = bodies[1]
				}
				sent[i] = body["quantity"].(string)
				res[i] = f.do("POST", "/v1/adjustments", adminToken, body)
			}()
		}
		close(start)
		wg.Wait()
		created := -1
		for i, r := range res {
			if r.status == 201 {
				if created >= 0 {
					t.Fatalf("round %d: two requests created the adjustment", round)
				}
				created = i
			}
		}
		if created < 0 {
			t.Fatalf("round %d: no request created the adjustment: %v", round, statuses(res))
		}
		winner := res[created].json(t)["quantity"]
		for i, r := range res {
			switch {
			case i == created:
			case sent[i] == winner && r.status == 200:
				// Same body as the winner: the stored answer.
				if string(r.body) != string(res[created].body) {
					t.Fatalf("round %d: retry answered %s, first %s", round, r.body, res[created].body)
				}
			case sent[i] != winner && r.status == 409:
			default:
				t.Fatalf("round %d: request %d answered %d %s (statuses %v)", round, i, r.status, r.body, statuses(res))
			}
		}
	}
	// Each round booked exactly one credit.
	var got int
	if err := f.pool.QueryRow(context.Background(), `SELECT count(*) FROM entries WHERE kind = 'adjustment'`).Scan(&got); err != nil {
		t.Fatal(err)
	}
	if got != rounds {
		t.Fatalf("%d adjustments booked, want %d", got, rounds)
	}
}

func statuses(rs []response) []int {
	out := make([]int, len(rs))
	for i, r := range rs {
		out[i] = r.status
	}
	return out
}

// An adjustment is an amount of a counter: one on a gauge or a unique
// meter is refused naming the meter (its statement lines are readings, and
// the amount would show nowhere but in the billed total). A meter with
// adjustments is a counter with usage: its kind stays.
func TestAdjustmentsAreForCounters(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	for meter, kind := range map[string]string{"seats": "gauge", "mau": "unique"} {
		if r := f.do("PUT", "/v1/meters/"+meter, adminToken, map[string]any{"kind": kind}); r.status != 200 {
			t.Fatalf("declare %s: %d %s", meter, r.status, r.body)
		}
		f.do("POST", "/v1/adjustments", adminToken, map[string]any{
			"operation_id": "0193e0a1-7c00-7d4e-9a51-3c2f9b7e4a1" + map[string]string{"seats": "1", "mau": "2"}[meter],
			"customer":     "acme", "meter": meter, "quantity": "-1000", "reason": "credit", "actor": "ops",
		}).fieldProblem(t, "meter", "a "+kind)
	}
	if r := f.do("POST", "/v1/adjustments", adminToken, map[string]any{
		"operation_id": "0193e0a1-7c00-7d4e-9a51-3c2f9b7e4a13", "customer": "acme", "meter": "adjonly",
		"quantity": "5", "reason": "manual", "actor": "ops",
	}); r.status != 201 {
		t.Fatalf("adjustment on a counter: %d %s", r.status, r.body)
	}
	f.do("PUT", "/v1/meters/adjonly", adminToken, map[string]any{"kind": "gauge"}).problem(t, 409, "urn:tally:problem:meter-kind-in-use")
}
