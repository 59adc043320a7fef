package ledger_test

import (
	"context"
	"errors"
	"fmt"
	"sort"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/shopspring/decimal"
	"pgregory.net/rapid"

	"github.com/tally-ledger/tally/ledger"
)

var errRollback = errors.New("simulated crash before commit")

// TestPropertyLedgerInvariants generates streams (several producers,
// epochs, customers and meters, decimal quantities, usage across a period
// boundary) and random delivery schedules (duplicates, reorders, drops of
// middle records, whole micro-batches delivered again, transactions rolled
// back), then checks docs/design.md §3's invariants after every schedule:
//   - per stream, billed total = last delivered total = stream state;
//   - per customer, meter, period and hour, rollups = records + entries;
//   - every record lies in its (stream, period)'s seq range, and each range
//     is exactly its records' (the reads of a period go through it);
//   - open gaps are exactly the undelivered seqs below the last delivered one;
//   - re-applying the whole schedule changes nothing;
//   - records in = sum of outcomes, with applied + late_fill = distinct records;
//   - when nothing was lost and every record carries its quantity, each
//     period holds exactly the usage that occurred in it;
//   - re-attribution never moves more than the gaps held, whatever the
//     quantities say: per stream and period, what its records billed plus
//     what moved in or out is never negative, and what moved out of a
//     stream's periods is at most what its records billed beyond their own
//     quantities (the gaps' amounts).
//
// More schedules: go test ./ledger -run Property -rapid.checks=5000
func TestPropertyLedgerInvariants(t *testing.T) {
	f := newFixture(t)
	f.now = time.Date(2026, 11, 6, 0, 0, 0, 0, time.UTC)
	iteration := 0
	rapid.Check(t, func(rt *rapid.T) {
		iteration++
		ns := fmt.Sprintf("it%d", iteration) // fresh customers and producers per schedule
		checkSchedule(rt, f, ns)
	})
	// Guard against a generator that stopped producing the hard cases.
	for what, sql := range map[string]string{
		"re-attributions": `SELECT count(*) FROM entries WHERE kind = 'reattribution'`,
		"late fills":      `SELECT count(*) FROM records WHERE late_fill`,
		"open gaps":       `SELECT count(*) FROM gaps`,
		"findings":        `SELECT count(*) FROM findings`,
	} {
		if n := f.scalar(sql); n == "0" {
			t.Errorf("the schedules produced no %s", what)
		} else {
			t.Logf("%s: %s", what, n)
		}
	}
}

type genStream struct {
	b       recBuilder
	records []ledger.Record
}

func checkSchedule(rt *rapid.T, f *fixture, ns string) {
	ctx := context.Background()
	nStreams := rapid.IntRange(1, 4).Draw(rt, "streams")
	var streams []*genStream
	var all []ledger.Record
	base := time.Date(2026, 10, 30, 0, 0, 0, 0, time.UTC) // October ends in 2 days
	// Customer c2's calendar is in a zone where usage at 00:xx UTC falls on
	// the previous local day (St John's: a half-hour offset), so its daily
	// rollups differ from UTC days; c1 keeps the default (UTC).
	zone := rapid.SampledFrom([]string{"UTC", "America/New_York", "America/St_Johns"}).Draw(rt, "zone")
	if _, err := f.pool.Exec(ctx, `INSERT INTO customers (id, schedule) VALUES ($1, $2)`, ns+"-c2",
		`[{"effective_from":"0001-01-01T00:00:00Z","calendar":{"cadence":"monthly","anchor_day":1,"anchor_time":"00:00","zone":"`+zone+`"}}]`); err != nil {
		rt.Fatal(err)
	}
	for i := 0; i < nStreams; i++ {
		b := recBuilder{
			producer: ns + "-p" + rapid.SampledFrom([]string{"a", "b"}).Draw(rt, "producer"),
			epoch:    rapid.Int64Range(1, 2).Draw(rt, "epoch"),
			customer: ns + "-c" + rapid.SampledFrom([]string{"1", "2"}).Draw(rt, "customer"),
			meter:    rapid.SampledFrom([]string{"calls", "bytes"}).Draw(rt, "meter"),
		}
		dup := false
		for _, s := range streams {
			dup = dup || s.b == b
		}
		if dup {
			continue
		}
		s := &genStream{b: b}
		n := rapid.IntRange(1, 25).Draw(rt, "records")
		total := decimal.Zero
		// Usage before seq novFrom happened in October, the rest in November.
		novFrom := rapid.IntRange(1, n+1).Draw(rt, "novFrom")
		for seq := int64(1); seq <= int64(n); seq++ {
			q := decimal.New(rapid.Int64Range(0, 100000).Draw(rt, "q"), -int32(rapid.IntRange(0, 3).Draw(rt, "scale")))
			total = total.Add(q)
			at := base.Add(time.Duration(seq) * time.Minute)
			if seq >= int64(novFrom) {
				at = at.Add(72 * time.Hour)
			}
			r := b.rec(seq, total.String(), at)
			switch rapid.IntRange(0, 19).Draw(rt, "quantity") {
			case 0, 1: // not sent
			case 2: // sent, but wrong: total wins and a finding is recorded
				r.Quantity = decimal.NewNullDecimal(q.Add(decimal.New(1, -3)))
			case 3: // sent, and far too large (still within the total's growth since seq 1)
				r.Quantity = decimal.NewNullDecimal(decimal.Min(total, q.Mul(decimal.NewFromInt(3)).Add(decimal.NewFromInt(7))))
			default:
				r.Quantity = decimal.NewNullDecimal(q)
			}
			s.records = append(s.records, r)
			all = append(all, r)
		}
		streams = append(streams, s)
	}

	// A delivery: some records dropped, some duplicated, shuffled, cut into micro-batches.
	var deliveries []ledger.Record
	dropped := map[uuid.UUID]bool{}
	for _, r := range all {
		if rapid.IntRange(0, 9).Draw(rt, "drop") == 0 {
			dropped[r.OperationID] = true
			continue
		}
		deliveries = append(deliveries, r)
		if rapid.IntRange(0, 4).Draw(rt, "dup") == 0 {
			deliveries = append(deliveries, r)
		}
	}
	perm := rapid.Permutation(deliveries).Draw(rt, "order")
	// Mostly in order, sometimes shuffled: mix the two.
	if rapid.Bool().Draw(rt, "shuffle") {
		deliveries = perm
	}
	var batches [][]ledger.Record
	for len(deliveries) > 0 {
		n := rapid.IntRange(1, 8).Draw(rt, "batch")
		if n > len(deliveries) {
			n = len(deliveries)
		}
		batches = append(batches, deliveries[:n])
		deliveries = deliveries[n:]
		if rapid.IntRange(0, 5).Draw(rt, "redeliver") == 0 {
			batches = append(batches, batches[len(batches)-1])
		}
	}

	in, applied, dupes := 0, 0, 0
	delivered := map[uuid.UUID]bool{}
	for _, batch := range batches {
		if rapid.IntRange(0, 6).Draw(rt, "crash") == 0 {
			// The transaction dies before commit: nothing may stick.
			err := pgx.BeginFunc(ctx, f.pool, func(tx pgx.Tx) error {
				if _, err := f.l.Apply(ctx, tx, batch); err != nil {
					return err
				}
				return errRollback
			})
			if !errors.Is(err, errRollback) {
				rt.Fatalf("apply before crash: %v", err)
			}
		}
		out := f.apply(batch...)
		in += len(batch)
		for i, o := range out {
			switch o.Kind {
			case ledger.Applied, ledger.LateFill:
				applied++
				delivered[batch[i].OperationID] = true
			case ledger.Duplicate:
				dupes++
			default:
				rt.Fatalf("record %d seq %d: unexpected outcome %s %s: %s", i, batch[i].Seq, o.Kind, o.Reason, o.Detail)
			}
		}
	}
	if applied != len(delivered) || applied+dupes != in {
		rt.Fatalf("conservation: in %d, applied+late_fill %d (distinct %d), duplicate %d", in, applied, len(delivered), dupes)
	}

	before := snapshot(rt, f, ns)
	for _, s := range streams {
		checkStream(rt, f, s, delivered)
	}
	checkRollups(rt, f, ns)
	checkMoves(rt, f, ns)

	lost := len(dropped) > 0
	allQ := true
	for i, r := range all {
		prev := decimal.Zero
		if r.Seq > 1 {
			prev = all[i-1].Total
		}
		allQ = allQ && r.Quantity.Valid && r.Quantity.Decimal.Equal(r.Total.Sub(prev))
	}
	if !lost && allQ {
		checkPeriods(rt, f, ns, all)
	}

	// Re-applying everything changes nothing.
	for _, batch := range batches {
		for i, o := range f.apply(batch...) {
			if o.Kind != ledger.Duplicate {
				rt.Fatalf("re-apply seq %d: %s, want duplicate", batch[i].Seq, o.Kind)
			}
		}
	}
	if after := snapshot(rt, f, ns); after != before {
		rt.Fatalf("re-applying changed the ledger:\nbefore %s\nafter  %s", before, after)
	}
}

func checkStream(rt *rapid.T, f *fixture, s *genStream, delivered map[uuid.UUID]bool) {
	var lastSeq int64
	lastTotal := decimal.Zero
	for _, r := range s.records {
		if delivered[r.OperationID] && r.Seq > lastSeq {
			lastSeq, lastTotal = r.Seq, r.Total
		}
	}
	var wantGaps []string
	for _, r := range s.records {
		if r.Seq < lastSeq && !delivered[r.OperationID] {
			wantGaps = append(wantGaps, fmt.Sprint(r.Seq))
		}
	}
	k := s.b
	var state, billed, gaps string
	err := f.pool.QueryRow(context.Background(), `
SELECT format('%s/%s', st.last_seq, trim_scale(st.last_total)),
       coalesce(trim_scale((SELECT sum(billed) FROM records r WHERE r.stream_id = st.id))::text, '0'),
       coalesce((SELECT string_agg(x::text, ',' ORDER BY x) FROM gaps g, generate_series(g.from_seq, g.to_seq) x WHERE g.stream_id = st.id), '')
FROM streams st WHERE producer = $1 AND epoch = $2 AND customer = $3 AND meter = $4`,
		k.producer, k.epoch, k.customer, k.meter).Scan(&state, &billed, &gaps)
	if errors.Is(err, pgx.ErrNoRows) && lastSeq == 0 {
		return
	}
	if err != nil {
		rt.Fatalf("stream %+v: %v", k, err)
	}
	want := fmt.Sprintf("%d/%s", lastSeq, lastTotal)
	if state != want {
		rt.Fatalf("stream %+v state = %s, want %s", k, state, want)
	}
	if billed != lastTotal.String() {
		rt.Fatalf("stream %+v billed %s, want last total %s", k, billed, lastTotal)
	}
	if w := joinStrings(wantGaps); gaps != w {
		rt.Fatalf("stream %+v gaps = [%s], want [%s]", k, gaps, w)
	}
}

func checkRollups(rt *rapid.T, f *fixture, ns string) {
	// mismatches fails the check when query, over the namespace's
	// customers, counts any row that differs.
	mismatches := func(what, query string) {
		var bad int
		if err := f.pool.QueryRow(context.Background(), query, ns+"-%").Scan(&bad); err != nil {
			rt.Fatal(err)
		}
		if bad != 0 {
			rt.Fatalf("%d %s", bad, what)
		}
	}
	mismatches("rollup buckets differ from records + entries", `
WITH src AS (
  SELECT customer, meter, period_start, bucket, billed AS q FROM records WHERE customer LIKE $1
  UNION ALL
  SELECT customer, meter, period_start, bucket, amount FROM entries WHERE customer LIKE $1
), want AS (SELECT customer, meter, period_start, bucket, sum(q) AS q FROM src GROUP BY 1, 2, 3, 4)
SELECT count(*) FROM want FULL JOIN (SELECT * FROM rollups WHERE customer LIKE $1) r
  USING (customer, meter, period_start, bucket)
WHERE coalesce(want.q, 0) <> coalesce(r.quantity, 0)`)
	// Every record lies in the seq range of its (stream, period), so the
	// reads of a customer's period find it (migration 00020), and no range
	// reaches past the records it covers.
	mismatches("records outside their stream period's range", `
SELECT count(*) FROM records r
WHERE r.customer LIKE $1 AND NOT EXISTS (
  SELECT 1 FROM stream_periods sp WHERE sp.customer = r.customer AND sp.period_start = r.period_start
    AND sp.stream_id = r.stream_id AND r.seq BETWEEN sp.min_seq AND sp.max_seq)`)
	mismatches("stream period ranges wider than their records", `
SELECT count(*) FROM stream_periods sp
CROSS JOIN LATERAL (SELECT min(r.seq) AS lo, max(r.seq) AS hi FROM records r
                    WHERE r.stream_id = sp.stream_id AND r.period_start = sp.period_start) AS r
WHERE sp.customer LIKE $1 AND (sp.min_seq IS DISTINCT FROM r.lo OR sp.max_seq IS DISTINCT FROM r.hi)`)
	// Daily rollups are the hourly ones summed by local date in the zone of
	// the customer's calendar (Postgres's zone rules here, Go's in the ledger).
	mismatches("daily rollups differ from the hourly ones", `
WITH want AS (
  SELECT r.customer, r.meter, r.period_start, (r.bucket AT TIME ZONE coalesce(c.schedule -> 0 -> 'calendar' ->> 'zone', 'UTC'))::date AS day,
         sum(r.quantity) AS q
  FROM rollups r LEFT JOIN customers c ON c.id = r.customer
  WHERE r.customer LIKE $1 GROUP BY 1, 2, 3, 4
)
SELECT count(*) FROM want FULL JOIN (SELECT * FROM rollups_daily WHERE customer LIKE $1) d
  USING (customer, meter, period_start, day)
WHERE coalesce(want.q, 0) <> coalesce(d.quantity, 0)`)
}

// checkMoves: re-attribution only moves usage a gap billed.
func checkMoves(rt *rapid.T, f *fixture, ns string) {
	count := func(what, query string) {
		var bad string
		if err := f.pool.QueryRow(context.Background(), query, ns+"-%").Scan(&bad); err != nil {
			rt.Fatal(err)
		}
		if bad != "" {
			rt.Fatalf("%s: %s", what, bad)
		}
	}
	count("a stream's billed amount in a period is negative after re-attribution", `
WITH src AS (
  SELECT stream_id, period_start, billed AS q FROM records WHERE customer LIKE $1
  UNION ALL
  SELECT stream_id, period_start, amount FROM entries WHERE customer LIKE $1 AND kind = 'reattribution'
)
SELECT coalesce(string_agg(format('stream %s period %s: %s', stream_id, period_start, q), '; '), '')
FROM (SELECT stream_id, period_start, sum(q) AS q FROM src GROUP BY 1, 2) s WHERE q < 0`)
	count("more moved out of a stream's periods than its gaps held", `
WITH moved AS (
  SELECT stream_id, -sum(amount) AS q FROM entries
  WHERE customer LIKE $1 AND kind = 'reattribution' AND amount < 0 GROUP BY 1
), gaps AS (
  SELECT stream_id, sum(greatest(billed - coalesce(quantity, 0), 0)) AS q FROM records
  WHERE customer LIKE $1 AND NOT late_fill GROUP BY 1
)
SELECT coalesce(string_agg(format('stream %s moved %s, gaps held at most %s', stream_id, m.q, g.q), '; '), '')
FROM moved m JOIN gaps g USING (stream_id) WHERE m.q > g.q`)
}

func checkPeriods(rt *rapid.T, f *fixture, ns string, all []ledger.Record) {
	want := map[string]decimal.Decimal{}
	for _, r := range all {
		p := "2026-11"
		if r.OccurredAt.Before(time.Date(2026, 11, 1, 0, 0, 0, 0, time.UTC)) {
			p = "2026-10"
		}
		k := r.Stream.Customer + "/" + r.Stream.Meter + "/" + p
		want[k] = want[k].Add(r.Quantity.Decimal) // allQ: quantities are exact
	}
	rows, err := f.pool.Query(context.Background(), `
SELECT customer || '/' || meter || '/' || to_char(period_start, 'YYYY-MM'), sum(quantity)::text
FROM rollups WHERE customer LIKE $1 GROUP BY 1`, ns+"-%")
	if err != nil {
		rt.Fatal(err)
	}
	got := map[string]decimal.Decimal{}
	for rows.Next() {
		var k, q string
		if err := rows.Scan(&k, &q); err != nil {
			rt.Fatal(err)
		}
		got[k] = decimal.RequireFromString(q)
	}
	if err := rows.Err(); err != nil {
		rt.Fatal(err)
	}
	for k, w := range want {
		if !got[k].Equal(w) {
			rt.Fatalf("period %s billed %s, but %s occurred in it (all periods: %v)", k, got[k], w, got)
		}
	}
}

// snapshot is everything a customer could be billed, as text.
func snapshot(rt *rapid.T, f *fixture, ns string) string {
	var s string
	err := f.pool.QueryRow(context.Background(), `
SELECT coalesce(string_agg(format('%s/%s/%s/%s=%s', customer, meter, period_start, bucket, trim_scale(quantity)), ';'
       ORDER BY customer, meter, period_start, bucket), '')
       || '|' || (SELECT count(*) FROM records WHERE customer LIKE $1)
       || '|' || (SELECT count(*) FROM entries WHERE customer LIKE $1)
       || '|' || (SELECT count(*) FROM gaps WHERE customer LIKE $1)
       || '|' || (SELECT coalesce(string_agg(format('%s/%s/%s/%s=%s', customer, meter, period_start, day, trim_scale(quantity)), ';'
                  ORDER BY customer, meter, period_start, day), '') FROM rollups_daily WHERE customer LIKE $1)
FROM rollups WHERE customer LIKE $1`, ns+"-%").Scan(&s)
	if err != nil {
		rt.Fatal(err)
	}
	return s
}

func joinStrings(s []string) string {
	sort.Slice(s, func(i, j int) bool { return len(s[i]) < len(s[j]) || len(s[i]) == len(s[j]) && s[i] < s[j] })
	out := ""
	for i, x := range s {
		if i > 0 {
			out += ","
		}
		out += x
	}
	return out
}
