package migrations_test

import (
	"context"
	"fmt"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/tally-ledger/tally/amount"
	"github.com/tally-ledger/tally/ledger"
	"github.com/tally-ledger/tally/migrations"
	"github.com/tally-ledger/tally/periods"
)

// dayBucketTables is what the bucket days of gauges and unique meters
// hold, one line per row.
func dayBucketTables(t *testing.T, pool *pgxpool.Pool) string {
	t.Helper()
	var s string
	err := pool.QueryRow(context.Background(), `SELECT concat_ws(E'\n',
  (SELECT string_agg(format('gauge %s %s..%s in=%s max=%s last=%s us=%s out=%s', customer, day_start, day_end, level_in, max_prefix, last_at,
                            unit_seconds, level_out), E'\n' ORDER BY customer, day_start) FROM gauge_days),
  (SELECT string_agg(format('reading %s %s %s day=%s counted=%s', customer, member, occurred_at, day, counted), E'\n'
                     ORDER BY customer, occurred_at) FROM unique_readings),
  (SELECT string_agg(format('count %s %s day=%s %s', customer, per_day, day, members), E'\n' ORDER BY customer, per_day, day)
   FROM unique_counts))`).Scan(&s)
	if err != nil {
		t.Fatal(err)
	}
	return s
}

// TestDayBucketsRekeyedWhereClocksSkipMidnight: migration 00041 moves
// the bucket days the ledger keyed by time.Date's midnight where that is
// not the day's first instant to the day's first instant, and recomputes
// the moved gauge buckets: the rows become what the ledger writes now.
// hav (America/Havana, whose clocks skip midnight on 2026-03-08) has a
// gauge and a unique meter, amm (Asia/Amman, midnight twice on
// 2021-10-29: the ledger took the second) a unique meter. ny (no skipped
// midnight) is untouched; late (Havana, periods anchored at 23:30 on the
// 7th, between time.Date's midnight and the 8th's first instant) is left
// as it was.
func TestDayBucketsRekeyedWhereClocksSkipMidnight(t *testing.T) {
	ctx := context.Background()
	pool := poolAt(t, 40)
	for _, c := range []struct{ id, zone, day, at string }{
		{"hav", "America/Havana", "1", "00:00"}, {"amm", "Asia/Amman", "1", "00:00"},
		{"ny", "America/New_York", "1", "00:00"}, {"late", "America/Havana", "7", "23:30"},
	} {
		if _, err := pool.Exec(ctx, `INSERT INTO customers (id, schedule) VALUES ($1, jsonb_build_array(jsonb_build_object(
			'effective_from', '0001-01-01T00:00:00Z', 'calendar', jsonb_build_object('cadence', 'monthly', 'anchor_day', $3::int,
			'anchor_time', $4::text, 'zone', $2::text))))`, c.id, c.zone, c.day, c.at); err != nil {
			t.Fatal(err)
		}
	}
	now := time.Date(2026, 3, 10, 0, 0, 0, 0, time.UTC)
	l, err := ledger.New(ledger.Config{Clock: func() time.Time { return now }})
	if err != nil {
		t.Fatal(err)
	}
	at := func(s string) time.Time {
		v, err := time.Parse(time.RFC3339, s)
		if err != nil {
			t.Fatal(err)
		}
		return v
	}
	var seq int64
	rec := func(customer, meter string, when string) ledger.Record {
		seq++
		return ledger.Record{OperationID: uuidFor(customer, meter, seq), Stream: ledger.StreamKey{Producer: "p", Epoch: 1, Customer: customer, Meter: meter},
			Seq: seq, OccurredAt: at(when)}
	}
	level := func(customer, v, when string) ledger.Record {
		r := rec(customer, "seats", when)
		r.Shape, r.Level = ledger.Gauge, amount.MustParse(v)
		return r
	}
	member := func(customer, m, when string) ledger.Record {
		r := rec(customer, "mau", when)
		r.Shape, r.Member = ledger.Unique, m
		return r
	}
	if err := pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
		for m, k := range map[string]ledger.MeterKind{"seats": ledger.Gauge, "mau": ledger.Unique} {
			if _, err := ledger.DeclareMeter(ctx, tx, ledger.Meter{Meter: m, Kind: k}, now); err != nil {
				return err
			}
		}
		_, err := l.Apply(ctx, tx, []ledger.Record{
			level("hav", "2", "2026-03-07T12:00:00Z"), level("hav", "7", "2026-03-08T04:30:00Z"), level("hav", "3", "2026-03-08T05:10:00Z"),
			member("hav", "ann", "2026-03-08T04:30:00Z"), member("hav", "bob", "2026-03-08T05:10:00Z"), member("hav", "ann", "2026-03-08T12:00:00Z"),
			member("amm", "ann", "2021-10-28T21:30:00Z"), member("amm", "bob", "2021-10-28T22:30:00Z"),
			member("ny", "ann", "2026-03-08T04:30:00Z"), member("ny", "bob", "2026-03-08T05:10:00Z"),
			level("late", "4", "2026-03-08T04:10:00Z"),
		})
		return err
	}); err != nil {
		t.Fatal(err)
	}
	want := dayBucketTables(t, pool)

	// What the ledger stored before: Havana's 8th keyed and the 7th ended
	// at 04:00Z (23:00 CST), its buckets' level-seconds over those bounds;
	// Amman's 29th keyed by its second midnight (22:00Z, not 21:00Z); late's
	// bucket of the 7th ended at 04:00Z, not at its period's end (04:30Z).
	for _, q := range []string{
		`UPDATE gauge_days SET day_end = '2026-03-08T04:00:00Z', unit_seconds = 106200 WHERE customer = 'hav' AND day_start = '2026-03-07T05:00:00Z'`,
		`UPDATE gauge_days SET day_start = '2026-03-08T04:00:00Z', unit_seconds = 276000 WHERE customer = 'hav' AND day_start = '2026-03-08T05:00:00Z'`,
		`UPDATE unique_readings SET day = '2026-03-08T04:00:00Z' WHERE customer = 'hav' AND day = '2026-03-08T05:00:00Z'`,
		`UPDATE unique_counts SET day = '2026-03-08T04:00:00Z' WHERE customer = 'hav' AND per_day AND day = '2026-03-08T05:00:00Z'`,
		`UPDATE unique_readings SET day = '2021-10-28T22:00:00Z' WHERE customer = 'amm' AND day = '2021-10-28T21:00:00Z'`,
		`UPDATE unique_counts SET day = '2021-10-28T22:00:00Z' WHERE customer = 'amm' AND per_day AND day = '2021-10-28T21:00:00Z'`,
		`UPDATE gauge_days SET day_end = '2026-03-08T04:00:00Z', unit_seconds = unit_seconds - 4 * 1800 WHERE customer = 'late' AND day_end = '2026-03-08T04:30:00Z'`,
	} {
		if tag, err := pool.Exec(ctx, q); err != nil || tag.RowsAffected() == 0 {
			t.Fatalf("%s: %v (%d rows)", q, err, tag.RowsAffected())
		}
	}
	left := dayBucketTables(t, pool)
	if err := migrations.UpTo(ctx, pool, 41); err != nil {
		t.Fatal(err)
	}
	got := dayBucketTables(t, pool)
	// late is left as it was: the rows of the others are the ledger's.
	split := func(s, customer string) (own, others []string) {
		for _, line := range strings.Split(s, "\n") {
			if strings.Fields(line)[1] == customer {
				own = append(own, line)
			} else {
				others = append(others, line)
			}
		}
		return own, others
	}
	gotLate, gotOthers := split(got, "late")
	wantLate, _ := split(left, "late")
	_, wantOthers := split(want, "late")
	if g, w := strings.Join(gotOthers, "\n"), strings.Join(wantOthers, "\n"); g != w {
		t.Errorf("after 00041:\n%s\nwant (as the ledger writes them):\n%s", g, w)
	}
	if g, w := strings.Join(gotLate, "\n"), strings.Join(wantLate, "\n"); g != w {
		t.Errorf("late after 00041:\n%s\nwant it left:\n%s", g, w)
	}
	// The helper functions are gone.
	var n int
	if err := pool.QueryRow(ctx, `SELECT count(*) FROM pg_proc WHERE proname LIKE 'tally\_%' AND proname IN ('tally_offset', 'tally_go_midnight', 'tally_resolve_wall')`).Scan(&n); err != nil || n != 0 {
		t.Fatalf("helper functions left: %d %v", n, err)
	}
}

// TestDayStartInSQLIsGos: the functions of migration 00041 answer, from
// Postgres's zone rules, what Go answers: tally_go_midnight time.Date's
// midnight (what the ledger stored) and tally_resolve_wall at midnight
// periods.DayStart (what it stores now), on every date from 1970 to 2037
// where the two differ in zones that have such dates, the dates either
// side, and every 29th date.
func TestDayStartInSQLIsGos(t *testing.T) {
	ctx := context.Background()
	pool := emptyPool(t)
	src, err := os.ReadFile("00041_day_buckets_skipped_midnight.sql")
	if err != nil {
		t.Fatal(err)
	}
	for _, block := range strings.Split(string(src), "-- +goose StatementBegin")[1:] {
		stmt, _, _ := strings.Cut(block, "-- +goose StatementEnd")
		if strings.Contains(stmt, "CREATE FUNCTION") {
			if _, err := pool.Exec(ctx, stmt); err != nil {
				t.Fatal(err)
			}
		}
	}
	var zones, dates []string
	var midnights, starts []time.Time
	differ := 0
	for _, z := range []string{"America/Havana", "America/Santiago", "America/Asuncion", "America/Sao_Paulo", "Atlantic/Azores",
		"America/Scoresbysund", "Asia/Amman", "Asia/Gaza", "Asia/Beirut", "Antarctica/Casey", "Asia/Colombo", "Africa/Tunis",
		"Pacific/Apia", "Pacific/Kiritimati", "America/Montevideo", "Pacific/Rarotonga", "Africa/Monrovia", "America/New_York",
		"Asia/Kathmandu", "Europe/London", "UTC"} {
		loc, err := time.LoadLocation(z)
		if err != nil {
			t.Fatal(err)
		}
		odd := map[int]bool{}
		n := 0
		for d := time.Date(1970, 1, 2, 0, 0, 0, 0, time.UTC); d.Year() < 2038; d = d.AddDate(0, 0, 1) {
			n++
			y, m, day := d.Date()
			if !time.Date(y, m, day, 0, 0, 0, 0, loc).Equal(periods.DayStart(loc, y, m, day)) {
				odd[n-1], odd[n], odd[n+1] = true, true, true
				differ++
			} else if n%29 == 0 {
				odd[n] = true
			}
		}
		n = 0
		for d := time.Date(1970, 1, 2, 0, 0, 0, 0, time.UTC); d.Year() < 2038; d = d.AddDate(0, 0, 1) {
			if n++; !odd[n] {
				continue
			}
			y, m, day := d.Date()
			zones, dates = append(zones, z), append(dates, d.Format(time.DateOnly))
			midnights, starts = append(midnights, time.Date(y, m, day, 0, 0, 0, 0, loc)), append(starts, periods.DayStart(loc, y, m, day))
		}
	}
	if differ < 100 {
		t.Fatalf("only %d dates where time.Date's midnight is not the day's first instant", differ)
	}
	rows, err := pool.Query(ctx, `
SELECT z, d, m, s, tally_go_midnight(z, d), tally_resolve_wall(z, d::timestamp)
FROM unnest($1::text[], $2::date[], $3::timestamptz[], $4::timestamptz[]) AS k(z, d, m, s)
WHERE tally_go_midnight(z, d) <> m OR tally_resolve_wall(z, d::timestamp) <> s`, zones, dates, midnights, starts)
	if err != nil {
		t.Fatal(err)
	}
	var bad int
	var z string
	var d, m, s, gm, gs time.Time
	if _, err := pgx.ForEachRow(rows, []any{&z, &d, &m, &s, &gm, &gs}, func() error {
		if bad++; bad <= 10 {
			t.Errorf("%s %s: time.Date %s, SQL %s; DayStart %s, SQL %s", z, d.Format(time.DateOnly), m.UTC(), gm.UTC(), s.UTC(), gs.UTC())
		}
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	if bad > 0 {
		t.Fatalf("%d of %d dates differ", bad, len(zones))
	}
}

// uuidFor is a record's operation id, fixed by its stream and seq.
func uuidFor(customer, meter string, seq int64) uuid.UUID {
	return uuid.NewSHA1(uuid.NameSpaceOID, fmt.Appendf(nil, "%s/%s/%d", customer, meter, seq))
}

// TestStretchedDayBucketsSplitAtTheDayStart: where a period starts
// exactly at time.Date's midnight of a date whose midnight the clocks skip
// (Havana, daily at 23:00: the period of 2026-03-08 04:00Z, whose next
// local day starts at 05:00Z) or between it and the day's first instant
// (monthly on the 7th at 23:30: 04:30Z), the build before kept the
// period's first local day and the next in one bucket keyed by the
// period's start. Migration 00041 splits it at the next day's first
// instant, as the ledger keys them now: the gauge buckets recomputed from
// their change points, the unique readings of the next day re-keyed with
// the first written of each member and day counted (the first written,
// not the earliest: bob's 06:00Z reading came in a batch before his
// 05:10Z one), and the per-day counts recounted. dly's bucket was
// stretched to the period's end; dly0's, whose first reading fell in the
// period's first hour, was left ending where it starts (the build before
// kept the end of the bucket's first row); nxt's readings were all of the
// 8th. Readings applied after the
// migration land as they land for ctl, whose rows were never rewound, and
// the period's level-seconds and members are what the readings make.
func TestStretchedDayBucketsSplitAtTheDayStart(t *testing.T) {
	ctx := context.Background()
	pool := poolAt(t, 40)
	daily := `jsonb_build_object('cadence', 'daily', 'anchor_day', 0, 'anchor_time', '23:00', 'zone', 'America/Havana')`
	monthly := `jsonb_build_object('cadence', 'monthly', 'anchor_day', 7, 'anchor_time', '23:30', 'zone', 'America/Havana')`
	for _, c := range []struct{ id, cal string }{{"dly", daily}, {"dly0", daily}, {"ctl", daily}, {"nxt", daily}, {"late2", monthly}} {
		if _, err := pool.Exec(ctx, `INSERT INTO customers (id, schedule) VALUES ($1, jsonb_build_array(jsonb_build_object(
			'effective_from', '0001-01-01T00:00:00Z', 'calendar', `+c.cal+`)))`, c.id); err != nil {
			t.Fatal(err)
		}
	}
	now := time.Date(2026, 3, 10, 0, 0, 0, 0, time.UTC)
	l, err := ledger.New(ledger.Config{Clock: func() time.Time { return now }})
	if err != nil {
		t.Fatal(err)
	}
	at := func(s string) time.Time {
		v, err := time.Parse(time.RFC3339, "2026-03-"+s)
		if err != nil {
			t.Fatal(err)
		}
		return v
	}
	var seq int64
	rec := func(producer, customer, meter, when string) ledger.Record {
		seq++
		return ledger.Record{OperationID: uuidFor(producer+customer, meter, seq), Stream: ledger.StreamKey{Producer: producer, Epoch: 1,
			Customer: customer, Meter: meter}, Seq: seq, OccurredAt: at(when)}
	}
	level := func(producer, customer, v, when string) ledger.Record {
		r := rec(producer, customer, "seats", when)
		r.Shape, r.Level = ledger.Gauge, amount.MustParse(v)
		return r
	}
	member := func(customer, m, when string) ledger.Record {
		r := rec("p", customer, "mau", when)
		r.Shape, r.Member = ledger.Unique, m
		return r
	}
	apply := func(recs []ledger.Record) {
		t.Helper()
		now = now.Add(time.Minute) // each batch its own ingested_at
		if err := pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
			out, err := l.Apply(ctx, tx, recs)
			for i, o := range out {
				if o.Kind != ledger.Applied {
					return fmt.Errorf("record %d: %+v", i, o)
				}
			}
			return err
		}); err != nil {
			t.Fatal(err)
		}
	}
	if err := pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
		for m, k := range map[string]ledger.MeterKind{"seats": ledger.Gauge, "mau": ledger.Unique} {
			if _, err := ledger.DeclareMeter(ctx, tx, ledger.Meter{Meter: m, Kind: k}, now); err != nil {
				return err
			}
		}
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	// Three batches: ann and bob are first seen after 05:00Z (the 8th)
	// and before it (the 7th) in different batches.
	for _, b := range [][]string{{"ann 08T05:20:00Z", "bob 08T04:10:00Z", "cat 08T07:00:00Z"}, {"ann 08T04:40:00Z", "bob 08T06:00:00Z"},
		{"bob 08T05:10:00Z"}} {
		var recs []ledger.Record
		for _, c := range []string{"dly", "dly0", "ctl"} {
			for _, s := range b {
				m, when, _ := strings.Cut(s, " ")
				recs = append(recs, member(c, m, when))
			}
		}
		if len(b) == 3 {
			for _, c := range []string{"dly", "dly0", "ctl"} {
				recs = append(recs, level("p", c, "5", "08T04:20:00Z"), level("p", c, "8", "08T05:30:00Z"), level("p", c, "6", "08T20:00:00Z"))
			}
			recs = append(recs, level("p", "nxt", "3", "08T06:00:00Z"), level("p", "nxt", "1", "08T20:00:00Z"), member("nxt", "ann", "08T05:30:00Z"))
			recs = append(recs, level("p", "late2", "4", "08T04:40:00Z"), level("p", "late2", "7", "08T06:00:00Z"),
				member("late2", "ann", "08T05:30:00Z"), member("late2", "bob", "08T04:50:00Z"))
		} else if len(b) == 2 {
			recs = append(recs, member("late2", "ann", "08T04:45:00Z"))
		}
		apply(recs)
	}
	want := dayBucketTables(t, pool)

	// What the build before stored: one bucket from the period's start
	// over the next local day, keyed by the period's start; its first
	// reading of each member counted (the first written).
	for _, k := range []struct{ customer, start, next string }{
		{"dly", "2026-03-08T04:00:00Z", "2026-03-08T05:00:00Z"}, {"dly0", "2026-03-08T04:00:00Z", "2026-03-08T05:00:00Z"},
		{"late2", "2026-03-08T04:30:00Z", "2026-03-08T05:00:00Z"},
	} {
		for _, q := range []string{
			`UPDATE gauge_days a SET day_end = b.day_end, unit_seconds = a.unit_seconds + b.unit_seconds,
			   max_prefix = greatest(a.max_prefix, a.level_out, b.max_prefix), last_at = b.last_at, level_out = b.level_out
			 FROM gauge_days b WHERE a.customer = $1 AND b.customer = $1 AND a.day_start = $2 AND b.day_start = $3`,
			`DELETE FROM gauge_days WHERE customer = $1 AND day_start = $3 AND $2::text <> ''`,
			`UPDATE unique_readings SET day = $2 WHERE customer = $1 AND day = $3`,
			`UPDATE unique_readings r SET counted = (r.stream_id, r.seq) IN (
			   SELECT DISTINCT ON (member) stream_id, seq FROM unique_readings WHERE customer = $1 AND day = $2 ORDER BY member, ingested_at, seq)
			 WHERE customer = $1 AND day = $2 AND $3::text <> ''`,
			`DELETE FROM unique_counts WHERE customer = $1 AND per_day AND day = $3 AND $2::text <> ''`,
			`UPDATE unique_counts SET members = (SELECT count(DISTINCT member) FROM unique_readings WHERE customer = $1 AND day = $2)
			 WHERE customer = $1 AND per_day AND day = $2 AND $3::text <> ''`,
		} {
			if tag, err := pool.Exec(ctx, q, k.customer, k.start, k.next); err != nil || tag.RowsAffected() == 0 {
				t.Fatalf("%s %s: %v (%d rows)", k.customer, q, err, tag.RowsAffected())
			}
		}
	}
	// nxt's readings are all of the 8th: its one bucket was keyed by the
	// period's start.
	for _, q := range []string{
		`UPDATE gauge_days SET day_start = '2026-03-08T04:00:00Z' WHERE customer = 'nxt' AND day_start = '2026-03-08T05:00:00Z'`,
		`UPDATE unique_readings SET day = '2026-03-08T04:00:00Z' WHERE customer = 'nxt' AND day = '2026-03-08T05:00:00Z'`,
		`UPDATE unique_counts SET day = '2026-03-08T04:00:00Z' WHERE customer = 'nxt' AND per_day AND day = '2026-03-08T05:00:00Z'`,
	} {
		if tag, err := pool.Exec(ctx, q); err != nil || tag.RowsAffected() == 0 {
			t.Fatalf("%s: %v (%d rows)", q, err, tag.RowsAffected())
		}
	}
	// dly0's first reading was its 7th's: the build before made its row
	// [04:00Z, 04:00Z) and appended the later points to it.
	if _, err := pool.Exec(ctx, `UPDATE gauge_days SET day_end = day_start, unit_seconds = 93000
		WHERE customer = 'dly0' AND day_start = '2026-03-08T04:00:00Z'`); err != nil {
		t.Fatal(err)
	}
	if err := migrations.UpTo(ctx, pool, 41); err != nil {
		t.Fatal(err)
	}
	lines := func(s, customer string) string {
		var out []string
		for _, line := range strings.Split(s, "\n") {
			if f := strings.Fields(line); f[1] == customer {
				out = append(out, strings.Join(append(f[:1:1], f[2:]...), " "))
			}
		}
		return strings.Join(out, "\n")
	}
	got := dayBucketTables(t, pool)
	for _, c := range []string{"dly", "dly0", "nxt", "late2"} {
		if g, w := lines(got, c), lines(want, c); g != w {
			t.Errorf("%s after 00041:\n%s\nwant (as the ledger writes them):\n%s", c, g, w)
		}
	}

	// After the upgrade: readings of both days of dly's period, one of
	// them before a stored change point of its bucket.
	if err := migrations.UpTo(ctx, pool, 1<<30); err != nil {
		t.Fatal(err)
	}
	var recs []ledger.Record
	for _, c := range []string{"dly", "ctl"} {
		recs = append(recs, level("q", c, "2", "08T04:50:00Z"), level("q", c, "3", "08T05:10:00Z"),
			member(c, "ann", "08T04:55:00Z"), member(c, "dan", "08T04:30:00Z"), member(c, "bob", "08T05:40:00Z"), member(c, "eve", "08T05:45:00Z"))
	}
	apply(recs)
	got = dayBucketTables(t, pool)
	if g, w := lines(got, "dly"), lines(got, "ctl"); g != w {
		t.Errorf("dly after new readings:\n%s\nwant as ctl's:\n%s", g, w)
	}
	sched := periods.NewSchedule(periods.Calendar{Cadence: periods.Daily, AnchorTime: "23:00", Zone: "America/Havana"})
	p, err := sched.PeriodAt(at("08T04:00:00Z"))
	if err != nil {
		t.Fatal(err)
	}
	g, err := ledger.ReadGauge(ctx, pool, "dly", "seats", p, now)
	if err != nil {
		t.Fatal(err)
	}
	rs, err := ledger.GaugeReadings(ctx, pool, "dly", "seats")
	if err != nil {
		t.Fatal(err)
	}
	if w := ledger.RecomputeGauge(rs, p.Start, p.End); !g.UnitSeconds.Equal(w.UnitSeconds) || !g.Max.Equal(w.Max) {
		t.Errorf("dly's period: unit_seconds %s max %s, want %s and %s from its readings", g.UnitSeconds, g.Max, w.UnitSeconds, w.Max)
	}
	us, err := ledger.ReadUniques(ctx, pool, "dly", "mau", p)
	if err != nil {
		t.Fatal(err)
	}
	recount, err := ledger.RecountUniques(ctx, pool, "dly", p)
	if err != nil {
		t.Fatal(err)
	}
	if len(us) != 1 || us[0].Count != 5 || recount["mau"] != 5 || fmt.Sprint(us[0].Days) != fmt.Sprintf("[{%s 3} {%s 4}]",
		at("08T04:00:00Z"), at("08T05:00:00Z")) {
		t.Errorf("dly's members: %+v (recount %v), want 5: 3 on the 7th (ann, bob, dan), 4 on the 8th (ann, bob, cat, eve)", us, recount)
	}
}
