package api_test

import (
	"encoding/json"
	"slices"
	"strings"
	"testing"
)

type customerResp struct {
	Customer  string `json:"customer"`
	CreatedAt string `json:"created_at"`
	Calendar  struct {
		Cadence    string `json:"cadence"`
		AnchorDay  int    `json:"anchor_day"`
		AnchorTime string `json:"anchor_time"`
		Zone       string `json:"zone"`
	} `json:"calendar"`
	CurrentPeriod struct{ Name, Start, End string } `json:"current_period"`
	Pending       *struct {
		EffectiveFrom string `json:"effective_from"`
		Calendar      struct {
			Cadence string `json:"cadence"`
			Zone    string `json:"zone"`
		} `json:"calendar"`
	} `json:"pending"`
	History []struct {
		EffectiveFrom *string `json:"effective_from"`
	} `json:"history"`
}

func decodeCustomer(t *testing.T, r response) customerResp {
	t.Helper()
	var c customerResp
	if err := json.Unmarshal(r.body, &c); err != nil {
		t.Fatalf("%v: %s", err, r.body)
	}
	return c
}

func TestCalendarCreateChangeCancel(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	// Unknown customer: created with this calendar from the beginning.
	r := f.do("PUT", "/v1/customers/initech", adminToken, map[string]any{"cadence": "weekly", "anchor_day": 3, "anchor_time": "06:00", "zone": "Europe/Berlin"})
	if r.status != 201 || r.header.Get("Location") != "/v1/customers/initech" {
		t.Fatalf("create: %d %s", r.status, r.body)
	}
	c := decodeCustomer(t, r)
	if c.Calendar.Cadence != "weekly" || c.Calendar.AnchorDay != 3 || c.Calendar.Zone != "Europe/Berlin" || c.Pending != nil ||
		len(c.History) != 1 || c.History[0].EffectiveFrom != nil {
		t.Fatalf("created: %s", r.body)
	}
	// Wednesday 2026-11-18 06:00 in Berlin (UTC+1) = 05:00Z.
	if c.CurrentPeriod.Name != "2026-11-18" || c.CurrentPeriod.Start != "2026-11-18T05:00:00Z" {
		t.Fatalf("current period: %+v", c.CurrentPeriod)
	}

	// A customer the ledger created on first usage has the default calendar.
	f.usage("acme", "api_calls", date("2026-11-20T10:00:00Z"), "1")
	c = decodeCustomer(t, f.do("GET", "/v1/customers/acme", adminToken, nil))
	if c.Calendar.Cadence != "monthly" || c.Calendar.AnchorDay != 1 || c.Calendar.AnchorTime != "00:00" || c.Calendar.Zone != "UTC" || c.Pending != nil {
		t.Fatalf("default calendar: %+v", c)
	}
	// A change takes effect at the next boundary.
	r = f.do("PUT", "/v1/customers/acme", adminToken, map[string]any{"cadence": "monthly", "anchor_day": 15, "zone": "Asia/Tokyo"})
	if r.status != 200 {
		t.Fatalf("change: %d %s", r.status, r.body)
	}
	c = decodeCustomer(t, r)
	if c.Calendar.Zone != "UTC" || c.Pending == nil || c.Pending.EffectiveFrom != "2026-12-01T00:00:00Z" || c.Pending.Calendar.Zone != "Asia/Tokyo" || len(c.History) != 2 {
		t.Fatalf("pending change: %s", r.body)
	}
	if got := decodeCustomer(t, f.do("GET", "/v1/customers/acme", adminToken, nil)); got.Pending == nil || got.Pending.EffectiveFrom != "2026-12-01T00:00:00Z" {
		t.Fatalf("GET after change: %+v", got)
	}
	// The current period is unchanged: usage still reads November.
	if u := f.do("GET", "/v1/customers/acme/usage?meter=api_calls", adminToken, nil).json(t); u["total"] != "1" || u["period"].(map[string]any)["end"] != "2026-12-01T00:00:00Z" {
		t.Fatalf("usage after change: %v", u)
	}
	// Putting the calendar in force again cancels the pending change.
	c = decodeCustomer(t, f.do("PUT", "/v1/customers/acme", adminToken, map[string]any{"cadence": "monthly"}))
	if c.Pending != nil || len(c.History) != 1 {
		t.Fatalf("cancel: %+v", c)
	}
	// Less than 5 minutes before a boundary: the boundary after it.
	f.setNow(date("2026-11-30T23:57:00Z"))
	c = decodeCustomer(t, f.do("PUT", "/v1/customers/acme", adminToken, map[string]any{"cadence": "daily"}))
	if c.Pending == nil || c.Pending.EffectiveFrom != "2027-01-01T00:00:00Z" {
		t.Fatalf("change near a boundary: %+v", c.Pending)
	}
	// After it takes effect, GET shows it in force and keeps the history.
	f.setNow(date("2027-01-02T00:00:00Z"))
	c = decodeCustomer(t, f.do("GET", "/v1/customers/acme", adminToken, nil))
	if c.Calendar.Cadence != "daily" || c.Pending != nil || len(c.History) != 2 || c.CurrentPeriod.Name != "2027-01-02" {
		t.Fatalf("in force: %+v", c)
	}
}

func TestCalendarErrors(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	f.usage("acme", "api_calls", date("2026-11-20T10:00:00Z"), "1")
	tests := []struct {
		name   string
		body   any
		ctype  string
		status int
		typ    string
		fields []string
	}{
		{"every problem listed", `{"cadence":"yearly","anchor_time":"25:00","zone":"Mars/Olympus_Mons"}`, "", 400, "urn:tally:problem:invalid-request", []string{"cadence", "anchor_time", "zone"}},
		{"anchor day out of range", `{"cadence":"monthly","anchor_day":32}`, "", 400, "urn:tally:problem:invalid-request", []string{"anchor_day"}},
		{"weekly day 8", `{"cadence":"weekly","anchor_day":8,"zone":"Local"}`, "", 400, "urn:tally:problem:invalid-request", []string{"anchor_day", "zone"}},
		{"daily with a day", `{"cadence":"daily","anchor_day":3}`, "", 400, "urn:tally:problem:invalid-request", []string{"anchor_day"}},
		{"missing cadence", `{}`, "", 400, "urn:tally:problem:invalid-request", []string{"cadence"}},
		{"unknown field", `{"cadence":"monthly","anchorday":1}`, "", 400, "urn:tally:problem:invalid-request", []string{"anchorday"}},
		{"wrong type", `{"cadence":"monthly","anchor_day":"1"}`, "", 400, "urn:tally:problem:invalid-request", []string{"anchor_day"}},
		{"huge number", `{"cadence":"monthly","anchor_day":1e300}`, "", 400, "urn:tally:problem:invalid-request", []string{"anchor_day"}},
		{"fraction", `{"cadence":"monthly","anchor_day":1.5}`, "", 400, "urn:tally:problem:invalid-request", []string{"anchor_day"}},
		{"null cadence type", `{"cadence":5}`, "", 400, "urn:tally:problem:invalid-request", []string{"cadence"}},
		{"truncated", `{"cadence":"mon`, "", 400, "urn:tally:problem:malformed-json", nil},
		{"trailing garbage", `{"cadence":"monthly"} {"x":1}`, "", 400, "urn:tally:problem:malformed-json", nil},
		{"trailing text", `{"cadence":"monthly"}garbage`, "", 400, "urn:tally:problem:malformed-json", nil},
		{"not an object", `["monthly"]`, "", 400, "urn:tally:problem:malformed-json", nil},
		{"empty body", ``, "", 400, "urn:tally:problem:malformed-json", nil},
		{"syntax", `{cadence: monthly}`, "", 400, "urn:tally:problem:malformed-json", nil},
		{"text/plain", `{"cadence":"monthly"}`, "text/plain", 415, "urn:tally:problem:unsupported-media-type", nil},
		{"10 MB", `{"cadence":"` + strings.Repeat("m", 10<<20) + `"}`, "", 413, "urn:tally:problem:body-too-large", nil},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			r := f.do("PUT", "/v1/customers/acme", adminToken, tt.body)
			if tt.ctype != "" {
				req := mustRequest(t, "PUT", f.srv.URL+"/v1/customers/acme", tt.body.(string))
				req.Header.Set("Content-Type", tt.ctype)
				req.Header.Set("Authorization", "Bearer "+adminToken)
				r = f.send(req)
			}
			p := r.problem(t, tt.status, tt.typ)
			if got := fields(p); !slices.Equal(got, tt.fields) {
				t.Fatalf("fields %v, want %v: %+v", got, tt.fields, p)
			}
		})
	}
	// Nothing changed.
	if c := decodeCustomer(t, f.do("GET", "/v1/customers/acme", adminToken, nil)); c.Pending != nil || len(c.History) != 1 {
		t.Fatalf("calendar changed by a bad request: %+v", c)
	}
	f.do("GET", "/v1/customers/nobody", adminToken, nil).problem(t, 404, "urn:tally:problem:not-found")
	f.do("GET", "/v1/customers/no%20body", adminToken, nil).problem(t, 400, "urn:tally:problem:invalid-request")
	f.do("PUT", "/v1/customers/"+strings.Repeat("x", 129), adminToken, map[string]any{"cadence": "monthly"}).problem(t, 400, "urn:tally:problem:invalid-request")
}

// TestScheduleCacheAcrossProcesses: a calendar changed by another process
// (here: directly in the database) never changes a started period read
// from the cache, and a period of the new calendar is found at once.
func TestScheduleCacheAcrossProcesses(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	f.usage("acme", "api_calls", date("2026-11-20T10:00:00Z"), "3")
	if u := f.do("GET", "/v1/customers/acme/usage?meter=api_calls", adminToken, nil).json(t); u["total"] != "3" {
		t.Fatalf("usage %v", u)
	}
	// Another process schedules monthly-on-the-15th from 2026-12-01.
	f.exec(`UPDATE customers SET schedule = schedule || '[{"effective_from":"2026-12-01T00:00:00Z","calendar":{"cadence":"monthly","anchor_day":15,"anchor_time":"00:00","zone":"UTC"}}]'::jsonb WHERE id = 'acme'`)
	if u := f.do("GET", "/v1/customers/acme/usage?meter=api_calls", adminToken, nil).json(t); u["period"].(map[string]any)["end"] != "2026-12-01T00:00:00Z" || u["total"] != "3" {
		t.Fatalf("current period after the change: %v", u)
	}
	// The new calendar's second period starts 2026-12-15.
	if r := f.do("GET", "/v1/customers/acme/usage?period=2026-12-15", adminToken, nil); r.status != 200 {
		t.Fatalf("future period of the new calendar: %d %s", r.status, r.body)
	}
}

// Every route under /v1/customers/{c} answers an unknown customer with the
// same 404, whoever asks: the grant routes listed nothing instead.
func TestUnknownCustomerIsNotFoundOnEveryRoute(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	for _, path := range []string{"", "/usage", "/periods", "/quotas", "/grants", "/budgets", "/rate-budgets"} {
		p := f.do("GET", "/v1/customers/nosuch"+path, adminToken, nil).problem(t, 404, "urn:tally:problem:not-found")
		if p.Detail != `customer "nosuch" not found` {
			t.Errorf("%s: detail %q", path, p.Detail)
		}
	}
}
