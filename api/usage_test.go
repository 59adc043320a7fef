package api_test

import (
	"context"
	"encoding/json"
	"fmt"
	"net/url"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"

	"github.com/tally-ledger/tally/ledger"
)

// seedAcme books usage for acme, whose calendar is monthly in New York,
// and for globex (default calendar). Now is 2026-11-20T12:00Z.
func seedAcme(f *fixture) {
	f.t.Helper()
	if r := f.do("PUT", "/v1/customers/acme", adminToken, map[string]any{"cadence": "monthly", "anchor_day": 1, "zone": "America/New_York"}); r.status != 201 {
		f.t.Fatalf("create acme: %d %s", r.status, r.body)
	}
	f.usage("acme", "api_calls", date("2026-11-02T15:10:00Z"), "10")
	f.usage("acme", "api_calls", date("2026-11-02T15:50:00Z"), "5.5")
	f.usage("acme", "api_calls", date("2026-11-02T16:05:00Z"), "1")
	// 22:30 in New York on Nov 9: the local day is the 9th, the UTC day the 10th.
	f.usage("acme", "api_calls", date("2026-11-10T03:30:00Z"), "2")
	f.usage("acme", "storage_gb", date("2026-11-05T00:00:00Z"), "0.000000001")
	// October in New York (ends 2026-11-01T04:00Z).
	f.usage("acme", "api_calls", date("2026-11-01T03:59:59Z"), "100")
	f.usage("globex", "api_calls", date("2026-11-03T00:00:00Z"), "7")
}

func TestUsageOneMeterByDay(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	seedAcme(f)
	r := f.do("GET", "/v1/customers/acme/usage?meter=api_calls", adminToken, nil)
	if r.status != 200 {
		t.Fatalf("%d %s", r.status, r.body)
	}
	m := r.json(t)
	if m["total"] != "18.5" || m["meter"] != "api_calls" || m["group_by"] != "day" || m["as_of"] != nil || m["lag_seconds"] != nil {
		t.Fatalf("usage = %s", r.body)
	}
	p := m["period"].(map[string]any)
	if p["name"] != "2026-11-01" || p["start"] != "2026-11-01T04:00:00Z" || p["end"] != "2026-12-01T05:00:00Z" || p["state"] != "open" {
		t.Fatalf("period = %v", p)
	}
	want := []map[string]any{
		{"start": "2026-11-02T05:00:00Z", "end": "2026-11-03T05:00:00Z", "quantity": "16.5"},
		// Nov 9 in New York: EST from Nov 1 (DST ended), so 05:00Z.
		{"start": "2026-11-09T05:00:00Z", "end": "2026-11-10T05:00:00Z", "quantity": "2"},
	}
	series := m["series"].([]any)
	if len(series) != len(want) {
		t.Fatalf("series = %v", series)
	}
	for i, w := range want {
		s := series[i].(map[string]any)
		for k, v := range w {
			if s[k] != v {
				t.Errorf("series[%d].%s = %v, want %v", i, k, s[k], v)
			}
		}
	}
}

func TestUsageByHourAndAllMeters(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	seedAcme(f)
	r := f.do("GET", "/v1/customers/acme/usage?group_by=hour", adminToken, nil)
	if r.status != 200 {
		t.Fatalf("%d %s", r.status, r.body)
	}
	var got struct {
		Customer string
		Period   struct{ Name string }
		Items    []struct {
			Meter, Total string
			Series       []struct{ Start, End, Quantity string }
		}
	}
	if err := json.Unmarshal(r.body, &got); err != nil {
		t.Fatal(err)
	}
	if got.Customer != "acme" || len(got.Items) != 2 || got.Items[0].Meter != "api_calls" || got.Items[1].Meter != "storage_gb" {
		t.Fatalf("items = %s", r.body)
	}
	calls := got.Items[0]
	if calls.Total != "18.5" || len(calls.Series) != 3 ||
		calls.Series[0].Start != "2026-11-02T15:00:00Z" || calls.Series[0].End != "2026-11-02T16:00:00Z" || calls.Series[0].Quantity != "15.5" ||
		calls.Series[1].Quantity != "1" || calls.Series[2].Start != "2026-11-10T03:00:00Z" {
		t.Fatalf("api_calls = %+v", calls)
	}
	if got.Items[1].Total != "0.000000001" {
		t.Fatalf("storage = %+v", got.Items[1])
	}
}

func TestUsagePeriods(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	seedAcme(f)
	get := func(q string) map[string]any {
		t.Helper()
		r := f.do("GET", "/v1/customers/acme/usage?meter=api_calls&"+q, adminToken, nil)
		if r.status != 200 {
			t.Fatalf("%s: %d %s", q, r.status, r.body)
		}
		return r.json(t)
	}
	prev := get("period=previous")
	if p := prev["period"].(map[string]any); p["name"] != "2026-10-01" || p["end"] != "2026-11-01T04:00:00Z" || p["state"] != "awaiting_close" || prev["total"] != "100" {
		t.Fatalf("previous = %v", prev)
	}
	if named := get("period=2026-10-01"); named["total"] != "100" {
		t.Fatalf("2026-10-01 = %v", named)
	}
	if cur := get("period=current"); cur["total"] != "18.5" {
		t.Fatalf("current = %v", cur)
	}
	// A closed period says so.
	f.exec(`INSERT INTO period_closes (customer, period_start, period_end, closed_at, statement, forced, reason, actor) VALUES ('acme', '2026-10-01T04:00:00Z', '2026-11-01T04:00:00Z', now(), '{}', true, 'test', 'test')`)
	if p := get("period=previous")["period"].(map[string]any); p["state"] != "closed" {
		t.Fatalf("closed period state = %v", p["state"])
	}
	// In grace: the day after November ended in New York.
	f.setNow(date("2026-12-01T12:00:00Z"))
	if p := get("period=previous")["period"].(map[string]any); p["name"] != "2026-11-01" || p["state"] != "grace" || p["grace_ends"] != "2026-12-02T05:00:00Z" {
		t.Fatalf("grace = %v", p)
	}
	// A future period exists and is empty.
	if fut := get("period=2027-01-01"); fut["total"] != "0" || len(fut["series"].([]any)) != 0 {
		t.Fatalf("future = %v", fut)
	}
	// Every meter of an empty period: an empty list, the last member.
	r := f.do("GET", "/v1/customers/acme/usage?period=2027-01-01", adminToken, nil)
	if r.status != 200 || !strings.HasSuffix(string(r.body), `"lag_seconds":null,"items":[]}`+"\n") {
		t.Fatalf("future, every meter: %d %s", r.status, r.body)
	}
}

func TestUsageFreshness(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	seedAcme(f)
	asOf := func() (any, any) {
		m := f.do("GET", "/v1/customers/acme/usage", adminToken, nil).json(t)
		return m["as_of"], m["lag_seconds"]
	}
	if a, l := asOf(); a != nil || l != nil {
		t.Fatalf("no partitions: as_of %v lag %v, want nulls", a, l)
	}
	// These writes go behind the API's back: a cached answer moves once
	// their notification is heard (docs/design.md §7), so each answer is
	// awaited, not expected at the very next read.
	settles := func(what string, ok func(a, l any) bool) {
		t.Helper()
		var a, l any
		for deadline := time.Now().Add(10 * time.Second); time.Now().Before(deadline); time.Sleep(20 * time.Millisecond) {
			if a, l = asOf(); ok(a, l) {
				return
			}
		}
		t.Fatalf("%s: as_of %v lag %v", what, a, l)
	}
	f.exec(`INSERT INTO ingest_partitions (topic, partition, next_offset, applied_through) VALUES
		('tally.meter-batches', 0, 10, '2026-11-20T11:59:58Z'),
		('tally.meter-batches', 1, 10, '2026-11-20T11:59:50.5Z')`)
	settles("want the oldest partition", func(a, l any) bool { return a == "2026-11-20T11:59:50.5Z" && l == 9.5 })
	// A partition that never reported: unknown, never "fresh".
	f.exec(`INSERT INTO ingest_partitions (topic, partition, next_offset) VALUES ('tally.meter-batches', 2, 0)`)
	settles("unknown partition, want nulls", func(a, l any) bool { return a == nil && l == nil })
}

func TestUsageErrors(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	seedAcme(f)
	long := strings.Repeat("a", 129)
	tests := []struct {
		name, path string
		status     int
		typ        string
		fields     []string
	}{
		{"unknown customer", "/v1/customers/nobody/usage", 404, "urn:tally:problem:not-found", nil},
		{"sql in customer", "/v1/customers/" + url.PathEscape("acme' OR '1'='1") + "/usage", 400, "urn:tally:problem:invalid-request", []string{"customer"}},
		{"sql in meter", "/v1/customers/acme/usage?meter=" + url.QueryEscape("x';DROP TABLE rollups;--"), 400, "urn:tally:problem:invalid-request", []string{"meter"}},
		{"unicode customer", "/v1/customers/" + url.PathEscape("äcme") + "/usage", 400, "urn:tally:problem:invalid-request", []string{"customer"}},
		{"emoji meter", "/v1/customers/acme/usage?meter=" + url.QueryEscape("📞"), 400, "urn:tally:problem:invalid-request", []string{"meter"}},
		{"slash in customer", "/v1/customers/" + url.PathEscape("a/b") + "/usage", 400, "urn:tally:problem:invalid-request", []string{"customer"}},
		{"long customer", "/v1/customers/" + long + "/usage", 400, "urn:tally:problem:invalid-request", []string{"customer"}},
		{"empty meter", "/v1/customers/acme/usage?meter=", 400, "urn:tally:problem:invalid-request", []string{"meter"}},
		{"bad group_by", "/v1/customers/acme/usage?group_by=week", 400, "urn:tally:problem:invalid-request", []string{"group_by"}},
		{"two problems", "/v1/customers/acme/usage?group_by=week&meter=%00", 400, "urn:tally:problem:invalid-request", []string{"meter", "group_by"}},
		{"unknown parameter", "/v1/customers/acme/usage?metre=api_calls", 400, "urn:tally:problem:invalid-request", []string{"metre"}},
		{"repeated parameter", "/v1/customers/acme/usage?meter=a&meter=b", 400, "urn:tally:problem:invalid-request", []string{"meter"}},
		{"bad query encoding", "/v1/customers/acme/usage?meter=%zz", 400, "urn:tally:problem:invalid-request", []string{"query"}},
		{"period word", "/v1/customers/acme/usage?period=yesterday", 400, "urn:tally:problem:invalid-request", []string{"period"}},
		{"period month 13", "/v1/customers/acme/usage?period=2026-13-01", 400, "urn:tally:problem:invalid-request", []string{"period"}},
		{"period with time", "/v1/customers/acme/usage?period=2026-11-01T00:00:00Z", 400, "urn:tally:problem:invalid-request", []string{"period"}},
		{"period huge year", "/v1/customers/acme/usage?period=99999-01-01", 400, "urn:tally:problem:invalid-request", []string{"period"}},
		{"date inside a period", "/v1/customers/acme/usage?period=2026-11-15", 404, "urn:tally:problem:period-not-found", []string{"period"}},
		{"query too long", "/v1/customers/acme/usage?meter=" + strings.Repeat("m", 2000), 414, "urn:tally:problem:uri-too-long", nil},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			p := f.do("GET", tt.path, adminToken, nil).problem(t, tt.status, tt.typ)
			if got := fields(p); !slices.Equal(got, tt.fields) {
				t.Fatalf("fields %v, want %v (%+v)", got, tt.fields, p)
			}
		})
	}
	p := f.do("GET", "/v1/customers/acme/usage?period=2026-11-15", adminToken, nil).problem(t, 404, "urn:tally:problem:period-not-found")
	if p.ContainingPeriod != "2026-11-01" || !strings.Contains(p.Detail, "2026-11-01") {
		t.Fatalf("period-not-found does not name the containing period: %+v", p)
	}
	// Nothing above reached the database with the hostile ids.
	var n int
	if err := f.pool.QueryRow(context.Background(), `SELECT count(*) FROM rollups`).Scan(&n); err != nil || n == 0 {
		t.Fatalf("rollups: %d, %v", n, err)
	}
}

// TestUsageSeriesClampedToPeriod: with an anchor at 00:30 in a +05:30 zone
// the local hour bucket of usage at 00:40 starts before the period; hour
// and day entries are clamped to the period. The day before DST ends in
// New York is 25 hours long.
func TestUsageSeriesClampedToPeriod(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	if r := f.do("PUT", "/v1/customers/kol", adminToken, map[string]any{"cadence": "monthly", "anchor_time": "00:30", "zone": "Asia/Kolkata"}); r.status != 201 {
		t.Fatalf("%d %s", r.status, r.body)
	}
	f.usage("kol", "api_calls", date("2026-10-31T19:10:00Z"), "4") // 00:40 on Nov 1 in Kolkata
	f.usage("kol", "api_calls", date("2026-11-01T18:20:00Z"), "1") // 23:50 on Nov 1
	for _, tt := range []struct{ groupBy, start, end, qty string }{
		{"hour", "2026-10-31T19:00:00Z", "2026-10-31T19:30:00Z", "4"},
		{"day", "2026-10-31T19:00:00Z", "2026-11-01T18:30:00Z", "5"},
	} {
		u := f.do("GET", "/v1/customers/kol/usage?meter=api_calls&period=2026-11-01&group_by="+tt.groupBy, adminToken, nil).json(t)
		s := u["series"].([]any)[0].(map[string]any)
		if s["start"] != tt.start || s["end"] != tt.end || s["quantity"] != tt.qty || u["total"] != "5" {
			t.Errorf("%s: %v", tt.groupBy, u)
		}
	}
	// The day DST ends in New York (2026-11-01) has 25 hours.
	if r := f.do("PUT", "/v1/customers/ny", adminToken, map[string]any{"cadence": "monthly", "zone": "America/New_York"}); r.status != 201 {
		t.Fatalf("%d %s", r.status, r.body)
	}
	f.usage("ny", "api_calls", date("2026-11-02T04:30:00Z"), "2") // 23:30 EST on Nov 1
	u := f.do("GET", "/v1/customers/ny/usage?meter=api_calls&period=2026-11-01", adminToken, nil).json(t)
	if s := u["series"].([]any)[0].(map[string]any); s["start"] != "2026-11-01T04:00:00Z" || s["end"] != "2026-11-02T05:00:00Z" {
		t.Errorf("DST day: %v", s)
	}
}

// TestUsageByDayWhereClocksSkipMidnight: in America/Havana the clocks go
// from 23:59:59 CST to 01:00 CDT on the day DST starts (2026-03-08), so that
// day starts at 01:00. Its usage is a bucket of its own, and the day before
// ends where it starts.
func TestUsageByDayWhereClocksSkipMidnight(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	if r := f.do("PUT", "/v1/customers/hav", adminToken, map[string]any{"cadence": "monthly", "zone": "America/Havana"}); r.status != 201 {
		t.Fatalf("%d %s", r.status, r.body)
	}
	f.usage("hav", "api_calls", date("2026-03-08T04:30:00Z"), "3") // 23:30 CST on Mar 7
	f.usage("hav", "api_calls", date("2026-03-08T12:00:00Z"), "5") // 08:00 CDT on Mar 8
	r := f.do("GET", "/v1/customers/hav/usage?meter=api_calls&period=2026-03-01", adminToken, nil)
	if r.status != 200 {
		t.Fatalf("%d %s", r.status, r.body)
	}
	var u struct {
		Total  string
		Series []struct{ Start, End, Quantity string }
	}
	if err := json.Unmarshal(r.body, &u); err != nil {
		t.Fatal(err)
	}
	want := "[{2026-03-07T05:00:00Z 2026-03-08T05:00:00Z 3} {2026-03-08T05:00:00Z 2026-03-09T04:00:00Z 5}]"
	if got := fmt.Sprint(u.Series); u.Total != "8" || got != want {
		t.Fatalf("total %s, series\n\t%s\nwant\n\t%s", u.Total, got, want)
	}
}

// TestUniqueByDayWhereClocksSkipMidnight: a unique meter's series in
// America/Havana has the local days as the counters' series has them: a
// member seen at 23:30 CST on 7 March 2026 counts on the 7th, one seen at
// 01:10 CDT on the 8th (the 8th's first hour: its midnight was skipped) on
// the 8th, which starts at 05:00Z.
func TestUniqueByDayWhereClocksSkipMidnight(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	f.setNow(date("2026-03-10T00:00:00Z"))
	if r := f.do("PUT", "/v1/customers/hav", adminToken, map[string]any{"cadence": "monthly", "zone": "America/Havana"}); r.status != 201 {
		t.Fatalf("%d %s", r.status, r.body)
	}
	if r := f.do("PUT", "/v1/meters/mau", adminToken, map[string]any{"kind": "unique"}); r.status != 200 {
		t.Fatalf("PUT mau: %d %s", r.status, r.body)
	}
	ctx := context.Background()
	member := func(seq int64, m string, at time.Time) ledger.Record {
		return ledger.Record{OperationID: uuid.New(), Stream: ledger.StreamKey{Producer: "auth", Epoch: 1, Customer: "hav", Meter: "mau"},
			Seq: seq, OccurredAt: at, Shape: ledger.Unique, Member: m}
	}
	if err := pgx.BeginFunc(ctx, f.pool, func(tx pgx.Tx) error {
		_, err := f.ledger.Apply(ctx, tx, []ledger.Record{
			member(1, "ann", date("2026-03-08T04:30:00Z")), // 23:30 CST on Mar 7
			member(2, "bob", date("2026-03-08T05:10:00Z")), // 01:10 CDT on Mar 8
			member(3, "ann", date("2026-03-08T12:00:00Z")), // 08:00 CDT on Mar 8
		})
		return err
	}); err != nil {
		t.Fatal(err)
	}
	f.sync()
	r := f.do("GET", "/v1/customers/hav/usage?meter=mau&period=2026-03-01", adminToken, nil)
	if r.status != 200 {
		t.Fatalf("%d %s", r.status, r.body)
	}
	var u struct {
		Total  string
		Series []struct{ Start, End, Quantity string }
	}
	if err := json.Unmarshal(r.body, &u); err != nil {
		t.Fatal(err)
	}
	want := "[{2026-03-07T05:00:00Z 2026-03-08T05:00:00Z 1} {2026-03-08T05:00:00Z 2026-03-09T04:00:00Z 2}]"
	if got := fmt.Sprint(u.Series); u.Total != "2" || got != want {
		t.Fatalf("total %s, series\n\t%s\nwant\n\t%s", u.Total, got, want)
	}
}
