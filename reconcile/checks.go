package reconcile

import (
	"cmp"
	"context"
	"fmt"
	"maps"
	"slices"
	"strings"
	"time"

	"github.com/google/uuid"
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

// args are the named arguments of the statements over the targets (see
// queries.go); not strict, since not every statement uses all of them.
func (tg target) args() pgx.NamedArgs {
	return pgx.NamedArgs{"customers": tg.customers, "starts": tg.starts, "ends": tg.ends, "all": tg.all}
}

// checkRollups recomputes every rollup bucket of the targets from records
// and entries (one pass over the period's records), and builds the
// per-meter totals on the way.
func (r *runner) checkRollups(ctx context.Context, tx pgx.Tx, tg target) error {
	// qRollupsCheck says how it filters.
	if _, err := tx.Exec(ctx, qSortOff); err != nil {
		return err
	}
	rows, err := tx.Query(ctx, qRollupsCheck, tg.args())
	if err != nil {
		return err
	}
	defer rows.Close()
	hourly := r.rollups // rollup totals per customer and meter
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
	if _, err := tx.Exec(ctx, qSortOn); err != nil {
		return err
	}
	if err := r.checkDailyRollups(ctx, tx, tg, hourly); err != nil {
		return err
	}
	return r.breakdown(ctx, tx, tg)
}

// checkDailyRollups checks that the daily rollups (what the usage API
// serves by day) add up, per customer and meter, to the hourly rollups
// just checked against the ledger. Which day of the period an amount
// shows on moves no money; how much the days hold does. (Checking every
// day against its hours cost a fifth of a whole run.)
func (r *runner) checkDailyRollups(ctx context.Context, tx pgx.Tx, tg target, hourly map[[2]string]decimal.Decimal) error {
	rows, err := tx.Query(ctx, qDailyRollupsSum, tg.args())
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
func (r *runner) breakdown(ctx context.Context, tx pgx.Tx, tg target) error {
	rows, err := tx.Query(ctx, qBreakdown, tg.args())
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

// streamTotals sums each stream's billed deltas from where a run last
// found it adding up (stream_checks; over its whole life in a deep run):
// records are never changed, and one arriving at or below a stream's last
// seq is a late fill, billed nothing, so records that added up stay added
// up. A stream that does not add up is a finding; one that adds up further
// than stream_checks says is noted in the run's stream_checks_found, for
// the run to store. Postgres sums and compares: the run reads only the
// streams that do not add up, never every stream of its customers (a
// stream is never deleted: each epoch of each producer stays).
func (r *runner) streamTotals(ctx context.Context, tx pgx.Tx, tg target) error {
	if _, err := tx.Exec(ctx, qJITOff); err != nil {
		return err
	}
	args := tg.args()
	args["whole"] = r.whole
	var whole, all int64
	if err := tx.QueryRow(ctx, qStreamsWhole, args).Scan(&whole, &all); err != nil {
		return err
	}
	// Summed whole: in a run of every customer, a tenth or more of the
	// streams in one pass over the records; otherwise stream by stream.
	read := streamWholeFew
	if tg.all && whole*10 >= all {
		read = streamWholeMany
	}
	rows, err := tx.Query(ctx, fmt.Sprintf(qStreamTotals, read), args)
	if err != nil {
		return err
	}
	var customer, meter, name string
	var fromSeq, n int64
	var last, fromBilled, billed numeric
	_, err = pgx.ForEachRow(rows, []any{&customer, &meter, &name, &last, &fromSeq, &fromBilled, &billed, &n}, func() error {
		total := fromBilled.dec().Add(billed.dec())
		diff := total.Sub(last.dec())
		detail := fmt.Sprintf("%d records billed %s in all, but the stream's last total is %s", n, total, last.dec())
		if fromSeq > 0 {
			detail = fmt.Sprintf("%d records after seq %d billed %s; with the %s billed up to it (found adding up by an earlier run) that is %s, but the stream's last total is %s",
				n, fromSeq, billed.dec(), fromBilled.dec(), total, last.dec())
		}
		r.find(Finding{Kind: KindStreamMismatch, Severity: Discrepancy, Customer: customer, Meter: meter, Stream: name, Amount: &diff, Detail: detail})
		return nil
	})
	if err != nil {
		return err
	}
	_, err = tx.Exec(ctx, qJITReset)
	return err
}

// checkStreams: per stream of the targets' customers, billed deltas must
// add up to its last total (streamTotals); open gaps billed in a target
// period are listed with their amounts.
func (r *runner) checkStreams(ctx context.Context, tx pgx.Tx, tg target) error {
	if err := r.streamTotals(ctx, tx, tg); err != nil {
		return err
	}
	rows, err := tx.Query(ctx, qOpenGaps, tg.args())
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
	rows, err := tx.Query(ctx, qConflicts, tg.args())
	if err != nil {
		return err
	}
	for rows.Next() {
		var c, m, stream, reason, value, occurred string
		var op uuid.UUID
		var seq int64
		var at time.Time
		if err := rows.Scan(&c, &m, &stream, &reason, &seq, &op, &value, &occurred, &at); err != nil {
			rows.Close()
			return err
		}
		r.find(Finding{Kind: KindConflict, Severity: Discrepancy, Customer: c, Meter: m, Stream: stream,
			Detail: fmt.Sprintf("%s: seq %d (operation %s, %s, occurred %s) lost to an earlier record on %s; the first write stands",
				reason, seq, op, value, occurred, at.UTC().Format(time.RFC3339))})
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
	rows, err = tx.Query(ctx, qDeadLettersPending, tg.args())
	if err != nil {
		return err
	}
	for rows.Next() {
		var c, reason, detail, key string
		var id uuid.UUID
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
	rows, err = tx.Query(ctx, qOffsetJumpsPending, tg.args())
	if err != nil {
		return err
	}
	defer rows.Close()
	for rows.Next() {
		var topic, detail string
		var id uuid.UUID
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
	rows, err := tx.Query(ctx, qLateUsage, tg.args())
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
	rows, err = tx.Query(ctx, qLedgerFindings, tg.args())
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
	rows, err := tx.Query(ctx, qAbandonedStreams, tg.args())
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
	rows, err := tx.Query(ctx, qConservation)
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
// a lagged quota was exceeded (enforce mode) or its decision was stale. It
// is billed like any usage; finance decides what to do about it.
func (r *runner) checkOverage(ctx context.Context, tx pgx.Tx, tg target) error {
	rows, err := tx.Query(ctx, qOverage, tg.args())
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
		r.find(Finding{Kind: KindOverage, Severity: Notice, Customer: c, Meter: m, Amount: &a, Detail: overageDetail(exceeded, stale, over)})
	}
	if err := rows.Err(); err != nil {
		return err
	}
	return r.checkScopeOverage(ctx, tx, tg)
}

// checkScopeOverage reports what the lagged quotas of pools and the global
// scope that concern the targets admitted over: a finding of no one
// customer (many share the scope), its scope in the detail, its period
// the scope's.
func (r *runner) checkScopeOverage(ctx context.Context, tx pgx.Tx, tg target) error {
	rows, err := tx.Query(ctx, qScopeOverage, tg.args())
	if err != nil {
		return err
	}
	defer rows.Close()
	for rows.Next() {
		var scope, m string
		var start time.Time
		var exceeded, stale, over numeric
		if err := rows.Scan(&scope, &m, &start, &exceeded, &stale, &over); err != nil {
			return err
		}
		a, period := exceeded.dec().Add(stale.dec()), start.UTC()
		r.find(Finding{Kind: KindOverage, Severity: Notice, Meter: m, Period: &period, Amount: &a,
			Detail: scope + "/" + m + ": " + overageDetail(exceeded, stale, over)})
	}
	return rows.Err()
}

func overageDetail(exceeded, stale, over numeric) string {
	return fmt.Sprintf("%s admitted while the quota was exceeded and %s while its decision was stale (at most %s over the limit)",
		exceeded.dec(), stale.dec(), over.dec())
}
