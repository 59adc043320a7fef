package reconcile

import (
	"cmp"
	"context"
	"fmt"
	"maps"
	"slices"
	"strings"
	"time"

	pgxdecimal "github.com/jackc/pgx-shopspring-decimal"
	"github.com/jackc/pgx/v5"
	"github.com/shopspring/decimal"
)

// Finding kinds. Discrepancies block a period close; notices explain
// numbers but change nothing that is billed.
const (
	KindRollupMismatch   = "rollup_mismatch"        // rollups differ from ledger records and entries
	KindDailyMismatch    = "daily_rollup_mismatch"  // the daily rollups of a meter do not add up to its hourly ones
	KindStreamMismatch   = "stream_total_mismatch"  // a stream's billed deltas do not add up to its last total
	KindOpenGap          = "open_gap"               // seqs never received; their usage is billed (notice)
	KindConflict         = "conflict"               // a record lost to an earlier one with the same id or seq
	KindDeadLetter       = "dead_letter"            // refused input not replayed yet: usage may be missing
	KindOffsetJump       = "offset_jump"            // Kafka deleted messages before ingest read them: usage may be missing
	KindLateAfterClose   = "late_usage_after_close" // usage of this period billed later as a prior-period adjustment (notice)
	KindNotReattributed  = "late_fill_not_reattributed"
	KindQuantityMismatch = "quantity_mismatch" // a record's quantity disagreed with its totals; totals won (notice)
	KindAbandoned        = "abandoned_stream"  // superseded by a newer epoch without a final record (notice)
	KindConservation     = "conservation"      // ingest counters do not add up
	KindDeepMismatch     = "deep_mismatch"     // Kafka's messages recomputed independently disagree with the ledger
	KindDeepNotChecked   = "deep_not_checked"  // retention deleted messages the deep check would need (notice: not ok either)
	KindOverage          = "overage"           // usage admitted while the quota was exceeded or its decision stale (notice)
)

// Severities.
const (
	Discrepancy = "discrepancy"
	Notice      = "notice"
)

// Check names, in the order they run (docs/design.md §6).
const (
	CheckRollups      = "rollups_equal_entries"
	CheckStreams      = "stream_totals_and_gaps"
	CheckConflicts    = "conflicts_and_dead_letters"
	CheckLate         = "late_usage"
	CheckAbandoned    = "abandoned_streams"
	CheckConservation = "conservation_counters"
	CheckOverage      = "overage"
	CheckDeep         = "deep"
)

// target lists, as parallel arrays, the (customer, period) pairs of a run.
type target struct {
	all       bool // every customer that has the period (no --customer)
	customers []string
	starts    []time.Time
	ends      []time.Time
}

const targetsCTE = `t AS (SELECT * FROM unnest($1::text[], $2::timestamptz[], $3::timestamptz[]) AS t(customer, period_start, period_end))`

// checkRollups recomputes every rollup bucket of the targets from records
// and entries (one pass over the period's records), and builds the
// per-meter totals on the way.
func (r *runner) checkRollups(ctx context.Context, tx pgx.Tx, tg target) error {
	// Aggregate first, filtering on what the indexes know, then keep the
	// exact (customer, period) pairs. A run for every customer of a period
	// reads the period's records whole: no customer filter to evaluate.
	filter := "period_start = ANY($2)"
	if !tg.all {
		filter = "customer = ANY($1) AND period_start = ANY($2)"
	}
	// This query is hash-shaped; the planner's sort-based alternatives
	// for a period's million buckets are a third slower (measured with
	// BenchmarkReconcileScan). Only for this statement.
	if _, err := tx.Exec(ctx, `SET LOCAL enable_sort = off`); err != nil {
		return err
	}
	rows, err := tx.Query(ctx, `
WITH `+targetsCTE+`,
rec AS (
  SELECT customer, meter, period_start, bucket, sum(billed) AS q, count(*) AS n
  FROM records WHERE `+filter+` GROUP BY 1, 2, 3, 4
), ent AS (
  SELECT customer, meter, period_start, bucket, sum(amount) AS q, count(*) AS n
  FROM entries WHERE `+filter+` GROUP BY 1, 2, 3, 4
), want AS (
  SELECT customer, meter, period_start, bucket,
         coalesce(r.q, 0) + coalesce(e.q, 0) AS q, coalesce(r.n, 0) + coalesce(e.n, 0) AS n
  FROM rec r FULL JOIN ent e USING (customer, meter, period_start, bucket)
), got AS (
  SELECT customer, meter, period_start, bucket, quantity FROM rollups WHERE `+filter+`
), b AS (
  SELECT customer, meter, period_start, bucket, coalesce(w.q, 0) AS wq, coalesce(g.quantity, 0) AS gq, coalesce(w.n, 0) AS n
  FROM want w FULL JOIN got g USING (customer, meter, period_start, bucket)
)
SELECT customer, meter, sum(wq), sum(gq), sum(n)::bigint,
       coalesce(string_agg(format('%s: entries %s, rollup %s', bucket, trim_scale(wq), trim_scale(gq)), '; ')
                FILTER (WHERE wq <> gq), '')
FROM b JOIN t USING (customer, period_start)
GROUP BY 1, 2`, tg.customers, tg.starts, tg.ends)
	if err != nil {
		return err
	}
	defer rows.Close()
	hourly := map[[2]string]decimal.Decimal{} // rollup totals per customer and meter
	for rows.Next() {
		var c, m, bad string
		var wq, gq numeric
		var n int64
		if err := rows.Scan(&c, &m, &wq, &gq, &n, &bad); err != nil {
			return err
		}
		hourly[[2]string{c, m}] = gq.dec()
		r.scanned += n
		r.usage[c] = append(r.usage[c], meterUsage{meter: m, rows: n, sum: wq.dec()})
		t := r.total(c, m)
		t.Billed = wq.dec()
		t.Usage = t.Billed
		if bad != "" {
			diff := gq.dec().Sub(wq.dec())
			r.find(Finding{Kind: KindRollupMismatch, Severity: Discrepancy, Customer: c, Meter: m, Amount: &diff,
				Detail: "rollups differ from the ledger's records and entries: " + clip(bad, 2000)})
		}
	}
	if err := rows.Err(); err != nil {
		return err
	}
	if _, err := tx.Exec(ctx, `SET LOCAL enable_sort = on`); err != nil {
		return err
	}
	if err := r.checkDailyRollups(ctx, tx, tg, filter, hourly); err != nil {
		return err
	}
	return r.breakdown(ctx, tx, tg, filter)
}

// checkDailyRollups checks that the daily rollups (what the usage API
// serves by day) add up, per customer and meter, to the hourly rollups
// just checked against the ledger. Which day of the period an amount
// shows on moves no money; how much the days hold does. (Checking every
// day against its hours cost a fifth of a whole run.)
func (r *runner) checkDailyRollups(ctx context.Context, tx pgx.Tx, tg target, filter string, hourly map[[2]string]decimal.Decimal) error {
	rows, err := tx.Query(ctx, `
WITH `+targetsCTE+`
SELECT customer, meter, sum(quantity)
FROM rollups_daily JOIN t USING (customer, period_start)
WHERE `+filter+` GROUP BY 1, 2`, tg.customers, tg.starts, tg.ends)
	if err != nil {
		return err
	}
	defer rows.Close()
	daily := map[[2]string]decimal.Decimal{}
	for rows.Next() {
		var c, m string
		var q numeric
		if err := rows.Scan(&c, &m, &q); err != nil {
			return err
		}
		daily[[2]string{c, m}] = q.dec()
	}
	if err := rows.Err(); err != nil {
		return err
	}
	keys := slices.Collect(maps.Keys(daily))
	for k := range hourly {
		if _, ok := daily[k]; !ok {
			keys = append(keys, k)
		}
	}
	slices.SortFunc(keys, func(a, b [2]string) int { return cmp.Or(strings.Compare(a[0], b[0]), strings.Compare(a[1], b[1])) })
	for _, k := range keys {
		d, h := daily[k], hourly[k]
		if d.Equal(h) {
			continue
		}
		diff := d.Sub(h)
		r.find(Finding{Kind: KindDailyMismatch, Severity: Discrepancy, Customer: k[0], Meter: k[1], Amount: &diff,
			Detail: fmt.Sprintf("daily rollups hold %s, the hourly rollups %s", d, h)})
	}
	return nil
}

// breakdown splits each meter's billed total into usage, prior-period
// adjustments and manual adjustments. The rows it reads are rare (a
// partial index finds the prior-period ones).
func (r *runner) breakdown(ctx context.Context, tx pgx.Tx, tg target, filter string) error {
	rows, err := tx.Query(ctx, `
WITH `+targetsCTE+`
SELECT customer, meter, 'prior', sum(billed)
FROM records JOIN t USING (customer, period_start)
WHERE `+filter+` AND prior_period IS NOT NULL GROUP BY 1, 2
UNION ALL
SELECT customer, meter, 'adjustment', sum(amount)
FROM entries JOIN t USING (customer, period_start)
WHERE `+filter+` AND kind = 'adjustment' GROUP BY 1, 2`, tg.customers, tg.starts, tg.ends)
	if err != nil {
		return err
	}
	defer rows.Close()
	for rows.Next() {
		var c, m, kind string
		var amt numeric
		if err := rows.Scan(&c, &m, &kind, &amt); err != nil {
			return err
		}
		t := r.total(c, m)
		a := amt.dec()
		if kind == "prior" {
			t.PriorPeriod = a
		} else {
			t.Adjustments = a
		}
		t.Usage = t.Usage.Sub(a)
	}
	return rows.Err()
}

// checkStreams: per stream of the targets' customers, billed deltas over
// the stream's whole life must add up to its last total (one scan of the
// customers' records, all periods); open gaps billed in a target period
// are listed with their amounts.
func (r *runner) checkStreams(ctx context.Context, tx pgx.Tx, tg target) error {
	rows, err := tx.Query(ctx, `
WITH sums AS (
  SELECT stream_id, sum(billed) AS billed, count(*) AS n FROM records WHERE customer = ANY($1) GROUP BY 1
)
SELECT st.customer, st.meter, st.producer || '/' || st.epoch, st.last_total,
       coalesce(sums.billed, 0), coalesce(sums.n, 0)
FROM streams st LEFT JOIN sums ON sums.stream_id = st.id
WHERE st.customer = ANY($1) AND coalesce(sums.billed, 0) <> st.last_total`, tg.customers)
	if err != nil {
		return err
	}
	for rows.Next() {
		var c, m, stream string
		var last, billed numeric
		var n int64
		if err := rows.Scan(&c, &m, &stream, &last, &billed, &n); err != nil {
			rows.Close()
			return err
		}
		diff := billed.dec().Sub(last.dec())
		r.find(Finding{Kind: KindStreamMismatch, Severity: Discrepancy, Customer: c, Meter: m, Stream: stream, Amount: &diff,
			Detail: fmt.Sprintf("%d records billed %s in all, but the stream's last total is %s", n, billed.dec(), last.dec())})
	}
	rows.Close()
	if err := rows.Err(); err != nil {
		return err
	}

	rows, err = tx.Query(ctx, `
WITH `+targetsCTE+`
SELECT g.customer, g.meter, st.producer || '/' || st.epoch, g.from_seq, g.to_seq, g.billed_period,
       g.upper_total - g.upper_quantity - g.lower_total,
       g.upper_total - g.lower_total
FROM gaps g JOIN t ON t.customer = g.customer AND t.period_start = g.billed_period
JOIN streams st ON st.id = g.stream_id
ORDER BY 1, 2, 3, 4`, tg.customers, tg.starts, tg.ends)
	if err != nil {
		return err
	}
	defer rows.Close()
	for rows.Next() {
		var c, m, stream string
		var from, to int64
		var period time.Time
		var amt nullNumeric
		var bound numeric
		if err := rows.Scan(&c, &m, &stream, &from, &to, &period, &amt, &bound); err != nil {
			return err
		}
		f := Finding{Kind: KindOpenGap, Severity: Notice, Customer: c, Meter: m, Stream: stream, Period: &period}
		seqs := fmt.Sprintf("seq %d", from)
		if to > from {
			seqs = fmt.Sprintf("seqs %d-%d", from, to)
		}
		if amt.Valid {
			a := amt.dec()
			f.Amount = &a
			f.Detail = fmt.Sprintf("%s never arrived; their %s is billed (inside the next record's total)", seqs, a)
		} else {
			f.Detail = fmt.Sprintf("%s never arrived; their usage (at most %s, the next record sent no quantity) is billed", seqs, bound.dec())
		}
		t := r.total(c, m)
		t.OpenGaps++
		if f.Amount != nil {
			t.GapAmount = t.GapAmount.Add(*f.Amount)
		}
		r.find(f)
	}
	return rows.Err()
}

// checkConflicts lists the conflicts of a target period (the losing
// record occurred in it, or was detected in it: a conflict on late usage of
// a closed period is reported where it can still block a close), then
// dead letters and offset jumps not replayed or accepted.
func (r *runner) checkConflicts(ctx context.Context, tx pgx.Tx, tg target) error {
	rows, err := tx.Query(ctx, `
WITH `+targetsCTE+`
SELECT c.customer, c.meter, (c.payload->>'producer') || '/' || (c.payload->>'epoch'), c.reason, c.seq,
       c.operation_id::text, c.payload->>'total', c.payload->>'occurred_at', c.detected_at
FROM conflicts c JOIN t ON t.customer = c.customer
 AND ((c.payload->>'occurred_at')::timestamptz >= t.period_start AND (c.payload->>'occurred_at')::timestamptz < t.period_end
      OR c.detected_at >= t.period_start AND c.detected_at < t.period_end)
ORDER BY c.detected_at`, tg.customers, tg.starts, tg.ends)
	if err != nil {
		return err
	}
	for rows.Next() {
		var c, m, stream, reason, op, total, occurred string
		var seq int64
		var at time.Time
		if err := rows.Scan(&c, &m, &stream, &reason, &seq, &op, &total, &occurred, &at); err != nil {
			rows.Close()
			return err
		}
		r.find(Finding{Kind: KindConflict, Severity: Discrepancy, Customer: c, Meter: m, Stream: stream,
			Detail: fmt.Sprintf("%s: seq %d (operation %s, total %s, occurred %s) lost to an earlier record on %s; the first write stands",
				reason, seq, op, total, occurred, at.UTC().Format(time.RFC3339))})
	}
	rows.Close()
	if err := rows.Err(); err != nil {
		return err
	}
	if !r.hasIngest {
		return nil
	}
	// Dead letters count for every period that had started when they were
	// refused. One whose key is no known customer (every message of a new
	// customer refused) belongs to no target: it is reported without a
	// customer, which makes the whole run dirty.
	rows, err = tx.Query(ctx, `
WITH `+targetsCTE+`,
pending AS MATERIALIZED (
  SELECT d.* FROM dead_letters d
  WHERE d.replayed_at IS NULL
    AND NOT EXISTS (SELECT 1 FROM reconciliation_acceptances a WHERE a.kind = 'dead_letter' AND a.id = d.id)
)
SELECT t.customer, d.id::text, d.reason, d.detail, d.partition, d."offset", d.record_index, '' AS key
FROM pending d JOIN t ON d.key = convert_to(t.customer, 'UTF8') AND d.created_at >= t.period_start
UNION ALL
SELECT '', d.id::text, d.reason, d.detail, d.partition, d."offset", d.record_index, coalesce(encode(d.key, 'escape'), '(none)')
FROM pending d
WHERE d.created_at >= (SELECT min(period_start) FROM t)
  AND (d.key IS NULL OR NOT EXISTS (SELECT 1 FROM customers cu WHERE convert_to(cu.id, 'UTF8') = d.key))
ORDER BY 2`, tg.customers, tg.starts, tg.ends)
	if err != nil {
		return err
	}
	for rows.Next() {
		var c, id, reason, detail, key string
		var part int32
		var off int64
		var idx *int32
		if err := rows.Scan(&c, &id, &reason, &detail, &part, &off, &idx, &key); err != nil {
			rows.Close()
			return err
		}
		where := fmt.Sprintf("partition %d offset %d", part, off)
		if idx != nil {
			where += fmt.Sprintf(" record %d", *idx)
		}
		f := Finding{Kind: KindDeadLetter, Severity: Discrepancy, Customer: c,
			Detail: fmt.Sprintf("dead letter %s (%s): %s: %s; fix and replay it, or accept the loss and force the close", id, where, reason, clip(detail, 300))}
		if c == "" {
			f.Detail = fmt.Sprintf("dead letter %s (%s) keyed %q, a customer the ledger does not know: %s: %s; it blocks every close until it is replayed or accepted (tally reconcile accept)",
				id, where, clip(key, 100), reason, clip(detail, 300))
		}
		r.find(f)
	}
	rows.Close()
	if err := rows.Err(); err != nil {
		return err
	}
	// Messages Kafka deleted before ingest read them may hold anyone's
	// usage: every period that had started is dirty until accepted.
	rows, err = tx.Query(ctx, `
WITH `+targetsCTE+`
SELECT j.id::text, j.topic, j.partition, j.from_offset, j.to_offset, j.detected_at, j.detail
FROM ingest_offset_jumps j
WHERE j.detected_at >= (SELECT min(period_start) FROM t)
  AND NOT EXISTS (SELECT 1 FROM reconciliation_acceptances a WHERE a.kind = 'offset_jump' AND a.id = j.id)
ORDER BY j.detected_at`, tg.customers, tg.starts, tg.ends)
	if err != nil {
		return err
	}
	defer rows.Close()
	for rows.Next() {
		var id, topic, detail string
		var part int32
		var from, to int64
		var at time.Time
		if err := rows.Scan(&id, &topic, &part, &from, &to, &at, &detail); err != nil {
			return err
		}
		r.find(Finding{Kind: KindOffsetJump, Severity: Discrepancy,
			Detail: fmt.Sprintf("offset jump %s: %s/%d offsets %d-%d were deleted before ingest read them (detected %s): %s; whose usage they held is unknown; accept the loss (tally reconcile accept) to close",
				id, topic, part, from, to-1, at.UTC().Format(time.RFC3339), clip(detail, 300))})
	}
	return rows.Err()
}

// checkLate: usage of a target period that arrived after it closed (billed
// as prior-period adjustments elsewhere), late fills that could not be
// moved, and quantity mismatches the ledger noted, about the period or
// noted during it (one about a closed period is reported where it can
// still be seen before a close).
func (r *runner) checkLate(ctx context.Context, tx pgx.Tx, tg target) error {
	rows, err := tx.Query(ctx, `
WITH `+targetsCTE+`
SELECT r.customer, r.meter, r.period_start, sum(r.billed), count(*)
FROM records r JOIN t ON t.customer = r.customer AND r.prior_period = t.period_start
GROUP BY 1, 2, 3 ORDER BY 1, 2, 3`, tg.customers, tg.starts, tg.ends)
	if err != nil {
		return err
	}
	for rows.Next() {
		var c, m string
		var amt numeric
		var billedIn time.Time
		var n int64
		if err := rows.Scan(&c, &m, &billedIn, &amt, &n); err != nil {
			rows.Close()
			return err
		}
		a := amt.dec()
		r.find(Finding{Kind: KindLateAfterClose, Severity: Notice, Customer: c, Meter: m, Amount: &a, Period: &billedIn,
			Detail: fmt.Sprintf("%d records (%s) for this period arrived after it closed; billed in the period starting %s as a prior-period adjustment",
				n, a, billedIn.UTC().Format(time.RFC3339))})
	}
	rows.Close()
	if err := rows.Err(); err != nil {
		return err
	}
	rows, err = tx.Query(ctx, `
WITH `+targetsCTE+`
SELECT f.kind, f.customer, f.meter, coalesce(st.producer || '/' || st.epoch, ''), f.amount, f.detail
FROM findings f JOIN t ON t.customer = f.customer
 AND (t.period_start = f.period_start OR f.created_at >= t.period_start AND f.created_at < t.period_end)
LEFT JOIN streams st ON st.id = f.stream_id
ORDER BY f.created_at`, tg.customers, tg.starts, tg.ends)
	if err != nil {
		return err
	}
	defer rows.Close()
	for rows.Next() {
		var kind, c, m, stream, detail string
		var amt nullNumeric
		if err := rows.Scan(&kind, &c, &m, &stream, &amt, &detail); err != nil {
			return err
		}
		f := Finding{Kind: kind, Severity: Notice, Customer: c, Meter: m, Stream: stream, Detail: detail}
		if amt.Valid {
			a := amt.dec()
			f.Amount = &a
		}
		r.find(f)
	}
	return rows.Err()
}

// checkAbandoned: streams with usage in a target period, superseded by a
// newer epoch of the same producer, customer and meter, that never said
// final: whatever the producer had not sent when it lost its state is lost.
func (r *runner) checkAbandoned(ctx context.Context, tx pgx.Tx, tg target) error {
	// Superseded streams are few: find them from stream state, then look
	// for their records in the period.
	rows, err := tx.Query(ctx, `
WITH `+targetsCTE+`
SELECT st.customer, st.meter, st.producer || '/' || st.epoch, st.last_seq, st.last_total,
       (SELECT min(n.epoch) FROM streams n WHERE n.producer = st.producer AND n.customer = st.customer
          AND n.meter = st.meter AND n.epoch > st.epoch)
FROM streams st JOIN t ON t.customer = st.customer
WHERE st.final_seq IS DISTINCT FROM st.last_seq
  AND EXISTS (SELECT 1 FROM streams n WHERE n.producer = st.producer AND n.customer = st.customer
                AND n.meter = st.meter AND n.epoch > st.epoch)
  AND EXISTS (SELECT 1 FROM records r WHERE r.stream_id = st.id AND r.period_start = t.period_start)
ORDER BY 1, 2, 3`, tg.customers, tg.starts, tg.ends)
	if err != nil {
		return err
	}
	defer rows.Close()
	for rows.Next() {
		var c, m, stream string
		var total numeric
		var last, next int64
		if err := rows.Scan(&c, &m, &stream, &last, &total, &next); err != nil {
			return err
		}
		r.find(Finding{Kind: KindAbandoned, Severity: Notice, Customer: c, Meter: m, Stream: stream,
			Detail: fmt.Sprintf("epoch ended at seq %d (total %s) without a final record and epoch %d took over: usage the producer had not sent is lost",
				last, total.dec(), next)})
	}
	return rows.Err()
}

// checkConservation: per partition, records in = sum of outcomes, and the
// refused messages and records equal the dead letters kept for them.
func (r *runner) checkConservation(ctx context.Context, tx pgx.Tx) error {
	rows, err := tx.Query(ctx, `
SELECT p.topic, p.partition, p.records_in,
       p.records_applied + p.records_duplicate + p.records_conflict + p.records_late_fill + p.records_rejected,
       p.records_rejected + p.messages_rejected,
       (SELECT count(*) FROM dead_letters d WHERE d.topic = p.topic AND d.partition = p.partition)
FROM ingest_partitions p ORDER BY 1, 2`)
	if err != nil {
		return err
	}
	defer rows.Close()
	for rows.Next() {
		var topic string
		var part int32
		var in, outcomes, refused, dead int64
		if err := rows.Scan(&topic, &part, &in, &outcomes, &refused, &dead); err != nil {
			return err
		}
		if in != outcomes {
			r.find(Finding{Kind: KindConservation, Severity: Discrepancy,
				Detail: fmt.Sprintf("%s/%d: %d records in, but %d outcomes", topic, part, in, outcomes)})
		}
		if refused != dead {
			r.find(Finding{Kind: KindConservation, Severity: Discrepancy,
				Detail: fmt.Sprintf("%s/%d: %d messages and records refused, but %d dead letters kept", topic, part, refused, dead)})
		}
	}
	return rows.Err()
}

// numeric scans a NUMERIC straight into an exact decimal (pgx's binary
// numeric, no text round trip); NULL, NaN or infinity fail the scan.
type numeric struct{ pgxdecimal.Decimal }

func (n numeric) dec() decimal.Decimal { return decimal.Decimal(n.Decimal) }

// nullNumeric is numeric for a column that may be NULL.
type nullNumeric struct{ pgxdecimal.NullDecimal }

func (n nullNumeric) dec() decimal.Decimal { return n.NullDecimal.Decimal }

func clip(s string, n int) string {
	if len(s) <= n {
		return s
	}
	return strings.ToValidUTF8(s[:n], "") + "…"
}

// checkOverage reports usage the quota enforcer measured as admitted while
// a quota was exceeded (enforce mode) or its decision was stale. It is
// billed like any usage; finance decides what to do about it.
func (r *runner) checkOverage(ctx context.Context, tx pgx.Tx, tg target) error {
	rows, err := tx.Query(ctx, `
WITH `+targetsCTE+`
SELECT o.customer, o.meter, o.while_exceeded, o.while_stale, o.over_limit
FROM quota_overage o JOIN t USING (customer, period_start)
WHERE o.while_exceeded > 0 OR o.while_stale > 0
ORDER BY 1, 2`, tg.customers, tg.starts, tg.ends)
	if err != nil {
		return err
	}
	defer rows.Close()
	for rows.Next() {
		var c, m string
		var exceeded, stale, over numeric
		if err := rows.Scan(&c, &m, &exceeded, &stale, &over); err != nil {
			return err
		}
		a := exceeded.dec().Add(stale.dec())
		r.find(Finding{Kind: KindOverage, Severity: Notice, Customer: c, Meter: m, Amount: &a,
			Detail: fmt.Sprintf("%s admitted while the quota was exceeded and %s while its decision was stale (at most %s over the limit)",
				exceeded.dec(), stale.dec(), over.dec())})
	}
	return rows.Err()
}
