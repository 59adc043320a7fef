package api_test

import (
	"context"
	"maps"
	"slices"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"

	"github.com/tally-ledger/tally/amount"
	"github.com/tally-ledger/tally/ledger"
)

// Meters are declared over REST; a used meter's kind is fixed (409); the
// usage answer speaks each kind: a gauge's max, latest, unit_seconds and
// average, a unique meter's distinct members per period and day.
func TestMetersAndKindUsage(t *testing.T) {
	f := newFixture(t)
	f.setNow(time.Date(2026, 12, 1, 12, 0, 0, 0, time.UTC))
	if r := f.do("PUT", "/v1/meters/seats", adminToken, map[string]any{"kind": "gauge", "unit": "seat"}); r.status != 200 {
		t.Fatalf("PUT seats: %d %s", r.status, r.body)
	}
	if r := f.do("PUT", "/v1/meters/mau", adminToken, map[string]any{"kind": "unique", "description": "monthly active users"}); r.status != 200 {
		t.Fatalf("PUT mau: %d %s", r.status, r.body)
	}
	p := f.do("PUT", "/v1/meters/bad", adminToken, map[string]any{"kind": "level"}).problem(t, 400, "urn:tally:problem:invalid-request")
	if got := fields(p); len(got) != 1 || got[0] != "kind" {
		t.Fatalf("fields %v", got)
	}
	if m := f.do("GET", "/v1/meters/calls", adminToken, nil).json(t); m["kind"] != "counter" || m["declared"] != false {
		t.Fatalf("an undeclared meter: %v", m)
	}
	if m := f.do("GET", "/v1/meters", adminToken, nil).json(t); len(m["items"].([]any)) != 2 {
		t.Fatalf("list: %v", m)
	}

	// acme: 3 seats from 00:00, 5 from 06:00 (another stream adds 2); two
	// users, one of them seen twice.
	ctx := context.Background()
	day := time.Date(2026, 12, 1, 0, 0, 0, 0, time.UTC)
	rec := func(producer, meter string, seq int64, at time.Time) ledger.Record {
		return ledger.Record{OperationID: uuid.New(), Stream: ledger.StreamKey{Producer: producer, Epoch: 1, Customer: "acme", Meter: meter},
			Seq: seq, OccurredAt: at}
	}
	level := func(producer string, seq int64, v string, at time.Time) ledger.Record {
		r := rec(producer, "seats", seq, at)
		r.Shape, r.Level = ledger.Gauge, amount.MustParse(v)
		return r
	}
	member := func(seq int64, m string, at time.Time) ledger.Record {
		r := rec("auth", "mau", seq, at)
		r.Shape, r.Member = ledger.Unique, m
		return r
	}
	if err := pgx.BeginFunc(ctx, f.pool, func(tx pgx.Tx) error {
		_, err := f.ledger.Apply(ctx, tx, []ledger.Record{
			level("a", 1, "3", day), level("b", 1, "2", day.Add(6*time.Hour)),
			member(1, "u1", day.Add(time.Hour)), member(2, "u2", day.Add(2*time.Hour)), member(3, "u1", day.Add(3*time.Hour)),
		})
		return err
	}); err != nil {
		t.Fatal(err)
	}
	f.sync()
	u := f.do("GET", "/v1/customers/acme/usage?meter=seats", adminToken, nil).json(t)
	g := u["gauge"].(map[string]any)
	// 3 × 6h + 5 × 6h through noon.
	if u["kind"] != "gauge" || g["max"] != "5" || g["latest"] != "5" || g["unit_seconds"] != "172800" || g["unit_hours"] != "48" || g["average"] != "4" {
		t.Fatalf("seats usage: %v", u)
	}
	// An hour later the level-seconds grew, with no new reading.
	f.setNow(f.clock().Add(time.Hour))
	if g := f.do("GET", "/v1/customers/acme/usage?meter=seats", adminToken, nil).json(t)["gauge"].(map[string]any); g["unit_seconds"] != "190800" {
		t.Fatalf("an hour later: %v", g)
	}
	all := f.do("GET", "/v1/customers/acme/usage", adminToken, nil).json(t)
	var mau map[string]any
	for _, it := range all["items"].([]any) {
		if m := it.(map[string]any); m["meter"] == "mau" {
			mau = m
		}
	}
	if mau == nil || mau["total"] != "2" || mau["kind"] != "unique" || len(mau["series"].([]any)) != 1 {
		t.Fatalf("mau in all meters: %v", all)
	}
	f.do("PUT", "/v1/meters/seats", adminToken, map[string]any{"kind": "counter"}).problem(t, 409, "urn:tally:problem:meter-kind-in-use")
	if r := f.do("PUT", "/v1/meters/seats", adminToken, map[string]any{"kind": "gauge", "unit": "seats"}); r.status != 200 {
		t.Fatalf("a new unit: %d %s", r.status, r.body)
	}
	f.do("PUT", "/v1/meters/seats", f.token("acme"), map[string]any{"kind": "gauge"}).problem(t, 403, "urn:tally:problem:forbidden")

	// December closes (forced) on January 1st: its statement freezes the
	// gauge (5 seats from Dec 1 06:00 to the end) and the distinct users.
	f.setNow(time.Date(2027, 1, 1, 0, 0, 1, 0, time.UTC))
	closed := f.do("POST", "/v1/customers/acme/periods/2026-12-01/close", adminToken,
		map[string]any{"force": true, "reason": "test", "actor": "test"})
	if closed.status != 200 {
		t.Fatalf("close: %d %s", closed.status, closed.body)
	}
	want := "13348800" // 3 × 6h + 5 × (31 × 24 − 6)h
	st := f.do("GET", "/v1/customers/acme/periods/2026-12-01/statement", adminToken, nil).json(t)
	gl := st["gauges"].([]any)[0].(map[string]any)
	if gl["unit_seconds"] != want || gl["max"] != "5" || st["uniques"].([]any)[0].(map[string]any)["count"] != float64(2) {
		t.Fatalf("frozen statement: %v", st)
	}
	// A late reading of December (b said 0 at Dec 31 00:00) changes no
	// frozen statement: January bills the difference, 2 seats × 24h less.
	if err := pgx.BeginFunc(ctx, f.pool, func(tx pgx.Tx) error {
		_, err := f.ledger.Apply(ctx, tx, []ledger.Record{level("b", 2, "0", time.Date(2026, 12, 31, 0, 0, 0, 0, time.UTC))})
		return err
	}); err != nil {
		t.Fatal(err)
	}
	f.sync()
	st = f.do("GET", "/v1/customers/acme/periods/2026-12-01/statement", adminToken, nil).json(t)
	if gl := st["gauges"].([]any)[0].(map[string]any); gl["unit_seconds"] != want {
		t.Fatalf("the frozen statement changed: %v", st)
	}
	jan := f.do("GET", "/v1/customers/acme/usage?meter=seats&period=2027-01-01", adminToken, nil).json(t)["gauge"].(map[string]any)
	if jan["prior_period_unit_seconds"] != "-172800" || jan["latest"] != "3" {
		t.Fatalf("january: %v", jan)
	}
}

// A meter with quota rules stays a counter: declaring it a gauge or
// unique meter afterwards is a 409 naming kind (the rules, exact ones
// above all, would draw from a running total it no longer has), while
// unit and description of a counter may still be declared. On a gauge, a
// pool or global rule is refused naming meter, an exact customer rule
// naming admission; a lagged customer rule is stored and listed.
func TestMeterWithQuotaRulesStaysACounter(t *testing.T) {
	f := newFixture(t)
	f.putPool("plan", "acme")
	for path, body := range map[string]map[string]any{
		"/v1/customers/acme/quotas/calls": {"limit": "10", "admission": "exact"},
		"/v1/pools/plan/quotas/tokens":    {"limit": "10", "admission": "exact"},
		"/v1/global/quotas/jobs":          {"limit": "10"},
	} {
		if r := f.do("PUT", path, adminToken, body); r.status != 200 && r.status != 201 {
			t.Fatalf("PUT %s: %d %s", path, r.status, r.body)
		}
	}
	for _, meter := range []string{"calls", "tokens", "jobs"} {
		for _, kind := range []string{"gauge", "unique"} {
			p := f.do("PUT", "/v1/meters/"+meter, adminToken, map[string]any{"kind": kind}).problem(t, 409, "urn:tally:problem:meter-has-quota-rules")
			if got := fields(p); len(got) != 1 || got[0] != "kind" {
				t.Fatalf("%s as %s: fields %v", meter, kind, got)
			}
		}
		if m := f.do("GET", "/v1/meters/"+meter, adminToken, nil).json(t); m["kind"] != "counter" {
			t.Fatalf("%s: %v", meter, m)
		}
	}
	if r := f.do("PUT", "/v1/meters/calls", adminToken, map[string]any{"kind": "counter", "unit": "call"}); r.status != 200 {
		t.Fatalf("counter unit: %d %s", r.status, r.body)
	}
	if r := f.do("PUT", "/v1/meters/seats", adminToken, map[string]any{"kind": "gauge"}); r.status != 200 {
		t.Fatalf("PUT seats: %d %s", r.status, r.body)
	}
	for _, path := range []string{"/v1/pools/plan/quotas/seats", "/v1/global/quotas/seats"} {
		for _, adm := range []string{"lagged", "exact"} {
			p := f.do("PUT", path, adminToken, map[string]any{"limit": "10", "admission": adm}).problem(t, 400, "urn:tally:problem:invalid-request")
			if got := fields(p); len(got) != 1 || got[0] != "meter" {
				t.Fatalf("%s %s: fields %v", path, adm, got)
			}
		}
	}
	p := f.do("PUT", "/v1/customers/acme/quotas/seats", adminToken, map[string]any{"limit": "10", "admission": "exact"}).problem(t, 400, "urn:tally:problem:invalid-request")
	if got := fields(p); len(got) != 1 || got[0] != "admission" {
		t.Fatalf("exact customer rule on a gauge: fields %v", got)
	}
	// A lagged customer rule limits the gauge's period max; the gauge
	// stays declarable (its unit may change) with the rule on it.
	if r := f.do("PUT", "/v1/customers/acme/quotas/seats", adminToken, map[string]any{"limit": "10"}); r.status != 201 {
		t.Fatalf("lagged customer rule on a gauge: %d %s", r.status, r.body)
	}
	if r := f.do("PUT", "/v1/meters/seats", adminToken, map[string]any{"kind": "gauge", "unit": "seat"}); r.status != 200 {
		t.Fatalf("gauge unit: %d %s", r.status, r.body)
	}
	q := f.do("GET", "/v1/customers/acme/quotas", adminToken, nil).json(t)
	if items, _ := q["items"].([]any); len(items) != 2 {
		t.Fatalf("quotas: %v", q)
	}
}

// A declared gauge or unique meter without data in the period answers
// with its kind and the kind's fields at zero, by day and by hour, as it
// answers once it has data (the same members): never like a counter. A
// declaration made behind the API's back (another API process) reaches
// an answer the API had cached.
func TestDeclaredMeterWithoutDataAnswersItsKind(t *testing.T) {
	f := newFixture(t)
	f.setNow(time.Date(2026, 12, 1, 12, 0, 0, 0, time.UTC))
	if r := f.do("PUT", "/v1/customers/acme", adminToken, map[string]any{"cadence": "monthly", "anchor_day": 1, "zone": "UTC"}); r.status != 201 {
		t.Fatalf("create acme: %d %s", r.status, r.body)
	}
	if r := f.do("PUT", "/v1/meters/mau", adminToken, map[string]any{"kind": "unique"}); r.status != 200 {
		t.Fatalf("PUT mau: %d %s", r.status, r.body)
	}
	// Cached while seats is still an undeclared counter.
	if u := f.do("GET", "/v1/customers/acme/usage?meter=seats", adminToken, nil).json(t); u["kind"] != nil || u["total"] != "0" {
		t.Fatalf("an undeclared meter: %v", u)
	}
	ctx := context.Background()
	if err := pgx.BeginFunc(ctx, f.pool, func(tx pgx.Tx) error {
		_, err := ledger.DeclareMeter(ctx, tx, ledger.Meter{Meter: "seats", Kind: ledger.Gauge}, f.clock())
		return err
	}); err != nil {
		t.Fatal(err)
	}
	f.sync()
	empty := map[string]map[string]any{}
	for _, groupBy := range []string{"day", "hour"} {
		u := f.do("GET", "/v1/customers/acme/usage?meter=seats&group_by="+groupBy, adminToken, nil).json(t)
		g, _ := u["gauge"].(map[string]any)
		if u["kind"] != "gauge" || u["total"] != "0" || g == nil || len(u["series"].([]any)) != 0 {
			t.Fatalf("seats by %s without readings: %v", groupBy, u)
		}
		for _, k := range []string{"max", "latest", "unit_seconds", "unit_hours", "average", "prior_period_unit_seconds"} {
			if g[k] != "0" {
				t.Fatalf("seats by %s without readings: %s = %v: %v", groupBy, k, g[k], u)
			}
		}
		// Zero from the period's start to now.
		if l := g["levels"].([]any); len(l) != 1 || l[0].(map[string]any)["start"] != "2026-12-01T00:00:00Z" ||
			l[0].(map[string]any)["end"] != "2026-12-01T12:00:00Z" || l[0].(map[string]any)["max"] != "0" {
			t.Fatalf("seats by %s without readings: levels %v", groupBy, g["levels"])
		}
		m := f.do("GET", "/v1/customers/acme/usage?meter=mau&group_by="+groupBy, adminToken, nil).json(t)
		if m["kind"] != "unique" || m["total"] != "0" || m["unique"] == nil || m["unique"].(map[string]any)["count"] != float64(0) ||
			len(m["series"].([]any)) != 0 {
			t.Fatalf("mau by %s without members: %v", groupBy, m)
		}
		empty["seats"], empty["mau"] = u, m
	}

	// With data, the same members.
	day := time.Date(2026, 12, 1, 0, 0, 0, 0, time.UTC)
	if err := pgx.BeginFunc(ctx, f.pool, func(tx pgx.Tx) error {
		stream := func(meter string) ledger.StreamKey {
			return ledger.StreamKey{Producer: "a", Epoch: 1, Customer: "acme", Meter: meter}
		}
		_, err := f.ledger.Apply(ctx, tx, []ledger.Record{
			{OperationID: uuid.New(), Stream: stream("seats"), Seq: 1, OccurredAt: day, Shape: ledger.Gauge, Level: amount.MustParse("3")},
			{OperationID: uuid.New(), Stream: stream("mau"), Seq: 1, OccurredAt: day, Shape: ledger.Unique, Member: "u1"},
		})
		return err
	}); err != nil {
		t.Fatal(err)
	}
	f.sync()
	for meter, e := range empty {
		u := f.do("GET", "/v1/customers/acme/usage?meter="+meter, adminToken, nil).json(t)
		if u["total"] == "0" || !slices.Equal(sortedKeys(u), sortedKeys(e)) || !slices.Equal(sortedKeys(u[u["kind"].(string)]), sortedKeys(e[u["kind"].(string)])) {
			t.Fatalf("%s with data %v, without %v", meter, u, e)
		}
	}
}

// sortedKeys is the members of a JSON object.
func sortedKeys(v any) []string {
	m, _ := v.(map[string]any)
	keys := slices.Collect(maps.Keys(m))
	slices.Sort(keys)
	return keys
}
