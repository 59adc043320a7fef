package reconcile

import (
	"context"
	"encoding/json"
	"fmt"
	"slices"
	"sort"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/shopspring/decimal"

	"github.com/tally-ledger/tally/periods"
)

// DeepSource re-reads usage from Kafka for the deep check, without the
// ledger's code path.
type DeepSource interface {
	// Read returns, for the given customers, every record Kafka still holds
	// and which partitions lost their oldest messages to retention.
	Read(ctx context.Context, customers []string) (*KafkaView, error)
}

// StreamID names a stream.
type StreamID struct {
	Producer string
	Epoch    int64
	Customer string
	Meter    string
}

// KafkaView is what the metering topic still holds of some customers.
type KafkaView struct {
	Streams map[StreamID][]KafkaRecord // each in the order Kafka holds them
	// Partition of each customer found (a customer's messages share one).
	Partition map[string]int
	// Partitions whose first messages retention deleted: what they held
	// cannot be recomputed.
	Incomplete map[int]bool
}

// KafkaRecord is one record as the wire decoder read it.
type KafkaRecord struct {
	Seq        int64
	Total      decimal.Decimal
	OccurredAt time.Time
}

// deep recomputes, from Kafka's messages alone, each target's usage per
// meter in its period (per stream: the first record of each seq wins, as
// in the ledger; each record's growth of the running total belongs to the
// period it occurred in) and compares it with the usage the ledger holds
// for that period, wherever it is billed. Stream states are compared too,
// including ledger streams Kafka holds nothing of. What cannot be
// recomputed (retention deleted a partition's oldest messages) is reported
// as not checked, never as ok.
//
// It reads as its steps: read Kafka → read the ledger → recompute →
// compare usage → compare streams → report what was not checked → the
// check's verdict.
func (rc *Reconciler) deep(ctx context.Context, tx pgx.Tx, r *runner, tg target) error {
	if rc.cfg.Deep == nil {
		r.run.Checks = append(r.run.Checks, Check{Name: CheckDeep, Status: "skipped", Detail: "no Kafka brokers configured for the deep check"})
		return fmt.Errorf("--deep needs Kafka brokers (TALLY_KAFKA_BROKERS)")
	}
	start := time.Now()
	view, err := rc.cfg.Deep.Read(ctx, tg.customers)
	if err != nil {
		return err
	}
	scheds, err := schedules(ctx, tx, tg.customers)
	if err != nil {
		return err
	}
	period := map[string]time.Time{}
	for i, c := range tg.customers {
		period[c] = tg.starts[i]
	}
	held, err := readLedgerSide(ctx, tx, tg)
	if err != nil {
		return err
	}
	kafka, err := recompute(view, scheds, period)
	if err != nil {
		return err
	}

	before := r.found
	notChecked := map[string]bool{}
	for _, c := range tg.customers {
		if !view.checkable(c) {
			notChecked[c] = true
		}
	}
	compareUsage(r, held.usage, kafka.usage, period, notChecked)
	streams := compareStreams(r, view, held.streams, kafka.streams, notChecked)
	skipped := reportNotChecked(r, view, notChecked)
	r.run.Checks = append(r.run.Checks, deepVerdict(streams, r.found-before-len(skipped), len(skipped), time.Since(start)))
	return nil
}

// streamState is where a stream ended: its last seq and running total.
type streamState struct {
	seq   int64
	total decimal.Decimal
}

// customerMeter is a customer and a meter.
type customerMeter = [2]string

// deepSide is one side of the deep check: the period's usage per customer
// and meter, and every stream's state.
type deepSide struct {
	usage   map[customerMeter]decimal.Decimal
	streams map[StreamID]streamState
}

// checkable says whether a customer's usage can be recomputed: the
// partition holding its messages is whole; a customer Kafka holds nothing
// of is checkable only when every partition is whole (its messages may
// have been on a truncated one).
func (v *KafkaView) checkable(customer string) bool {
	if p, ok := v.Partition[customer]; ok {
		return !v.Incomplete[p]
	}
	return len(v.Incomplete) == 0
}

// readLedgerSide reads the targets' stream states and the usage the ledger
// holds for their periods.
func readLedgerSide(ctx context.Context, tx pgx.Tx, tg target) (deepSide, error) {
	side := deepSide{usage: map[customerMeter]decimal.Decimal{}, streams: map[StreamID]streamState{}}
	rows, err := tx.Query(ctx, qDeepStreams, tg.args())
	if err != nil {
		return side, err
	}
	for rows.Next() {
		var id StreamID
		var st streamState
		var total numeric
		if err := rows.Scan(&id.Producer, &id.Epoch, &id.Customer, &id.Meter, &st.seq, &total); err != nil {
			rows.Close()
			return side, err
		}
		st.total = total.dec()
		side.streams[id] = st
	}
	rows.Close()
	if err := rows.Err(); err != nil {
		return side, err
	}
	rows, err = tx.Query(ctx, qDeepUsage, tg.args())
	if err != nil {
		return side, err
	}
	for rows.Next() {
		var c, m string
		var q numeric
		if err := rows.Scan(&c, &m, &q); err != nil {
			rows.Close()
			return side, err
		}
		side.usage[customerMeter{c, m}] = q.dec()
	}
	rows.Close()
	return side, rows.Err()
}

// recompute is the Kafka side: per checkable stream, the first record of
// each seq, in seq order; each record's growth of the running total counts
// in the period it occurred in, when that is the customer's period.
func recompute(view *KafkaView, scheds map[string]periods.Schedule, period map[string]time.Time) (deepSide, error) {
	side := deepSide{usage: map[customerMeter]decimal.Decimal{}, streams: map[StreamID]streamState{}}
	for id, recs := range view.Streams {
		if !view.checkable(id.Customer) {
			continue
		}
		first := map[int64]KafkaRecord{}
		for _, k := range recs {
			if _, ok := first[k.Seq]; !ok {
				first[k.Seq] = k
			}
		}
		seqs := make([]int64, 0, len(first))
		for s := range first {
			seqs = append(seqs, s)
		}
		slices.Sort(seqs)
		prev := decimal.Zero
		for _, s := range seqs {
			k := first[s]
			p, err := scheds[id.Customer].PeriodAt(k.OccurredAt)
			if err != nil {
				return side, fmt.Errorf("customer %q: %w", id.Customer, err)
			}
			if p.Start.Equal(period[id.Customer]) {
				key := customerMeter{id.Customer, id.Meter}
				side.usage[key] = side.usage[key].Add(k.Total.Sub(prev))
			}
			prev = k.Total
		}
		last := first[seqs[len(seqs)-1]]
		side.streams[id] = streamState{seq: last.Seq, total: last.Total}
	}
	return side, nil
}

// compareUsage finds, per customer and meter in order, where the period's
// usage the ledger holds differs from what Kafka recomputes.
func compareUsage(r *runner, held, recomputed map[customerMeter]decimal.Decimal, period map[string]time.Time, notChecked map[string]bool) {
	keys := map[customerMeter]bool{}
	for k := range held {
		keys[k] = true
	}
	for k := range recomputed {
		keys[k] = true
	}
	sorted := make([]customerMeter, 0, len(keys))
	for k := range keys {
		sorted = append(sorted, k)
	}
	sort.Slice(sorted, func(i, j int) bool {
		return sorted[i][0] < sorted[j][0] || sorted[i][0] == sorted[j][0] && sorted[i][1] < sorted[j][1]
	})
	for _, k := range sorted {
		if notChecked[k[0]] {
			continue
		}
		l, kf := held[k], recomputed[k]
		if !l.Equal(kf) {
			diff := l.Sub(kf)
			p := period[k[0]]
			r.find(Finding{Kind: KindDeepMismatch, Severity: Discrepancy, Customer: k[0], Meter: k[1], Period: &p, Amount: &diff,
				Detail: fmt.Sprintf("Kafka's messages recompute %s of usage in this period; the ledger holds %s for it", kf, l)})
		}
	}
}

// compareStreams finds, both ways and in order, streams whose state the
// ledger and Kafka disagree on, and returns how many streams it compared.
func compareStreams(r *runner, view *KafkaView, ledger, kafka map[StreamID]streamState, notChecked map[string]bool) int {
	ids := make([]StreamID, 0, len(ledger)+len(kafka))
	for id := range ledger {
		ids = append(ids, id)
	}
	for id := range kafka {
		if _, ok := ledger[id]; !ok {
			ids = append(ids, id)
		}
	}
	slices.SortFunc(ids, func(a, b StreamID) int {
		return strings.Compare(fmt.Sprint(a.Customer, "\x00", a.Meter, "\x00", a.Producer, "\x00", a.Epoch),
			fmt.Sprint(b.Customer, "\x00", b.Meter, "\x00", b.Producer, "\x00", b.Epoch))
	})
	streams := 0
	for _, id := range ids {
		if notChecked[id.Customer] || !view.checkable(id.Customer) {
			continue
		}
		streams++
		l, inLedger := ledger[id]
		k, inKafka := kafka[id]
		stream := fmt.Sprintf("%s/%d", id.Producer, id.Epoch)
		switch {
		case !inLedger:
			r.find(Finding{Kind: KindDeepMismatch, Severity: Discrepancy, Customer: id.Customer, Meter: id.Meter, Stream: stream, Amount: &k.total,
				Detail: fmt.Sprintf("Kafka holds this stream up to seq %d (total %s) but the ledger has no such stream", k.seq, k.total)})
		case !inKafka:
			diff := l.total
			r.find(Finding{Kind: KindDeepMismatch, Severity: Discrepancy, Customer: id.Customer, Meter: id.Meter, Stream: stream, Amount: &diff,
				Detail: fmt.Sprintf("the ledger has this stream up to seq %d (total %s) but Kafka, which lost no messages, holds none of it", l.seq, l.total)})
		case !l.total.Equal(k.total) || l.seq != k.seq:
			diff := l.total.Sub(k.total)
			r.find(Finding{Kind: KindDeepMismatch, Severity: Discrepancy, Customer: id.Customer, Meter: id.Meter, Stream: stream, Amount: &diff,
				Detail: fmt.Sprintf("Kafka's messages end at seq %d total %s; the ledger at seq %d total %s", k.seq, k.total, l.seq, l.total)})
		}
	}
	return streams
}

// reportNotChecked records, in order, each customer whose usage could not
// be recomputed and why, and returns them.
func reportNotChecked(r *runner, view *KafkaView, notChecked map[string]bool) []string {
	var skipped []string
	for c := range notChecked {
		skipped = append(skipped, c)
	}
	sort.Strings(skipped)
	for _, c := range skipped {
		why := "Kafka holds none of its messages and retention deleted the oldest messages of some partition"
		if p, ok := view.Partition[c]; ok {
			why = fmt.Sprintf("retention deleted the oldest messages of partition %d, which holds its messages", p)
		}
		r.find(Finding{Kind: KindDeepNotChecked, Severity: Notice, Customer: c,
			Detail: "not checked against Kafka: " + why})
	}
	return skipped
}

// deepVerdict is the deep check's line in the run: ok, findings, or
// not_checked when some customers could not be recomputed.
func deepVerdict(streams, findings, skipped int, took time.Duration) Check {
	c := Check{Name: CheckDeep, Status: "ok", Detail: fmt.Sprintf("%d streams recomputed from Kafka in %s", streams, took.Round(time.Millisecond))}
	if findings > 0 {
		c.Status, c.Detail = "findings", fmt.Sprintf("%d findings; %s", findings, c.Detail)
	}
	if skipped > 0 {
		if c.Status == "ok" {
			c.Status = "not_checked"
		}
		c.Detail += fmt.Sprintf("; %d customers not checked: retention deleted messages they may have had", skipped)
	}
	return c
}

// schedules loads the calendars of some customers.
func schedules(ctx context.Context, tx pgx.Tx, customers []string) (map[string]periods.Schedule, error) {
	rows, err := tx.Query(ctx, qSchedulesOf, customers)
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	out := make(map[string]periods.Schedule, len(customers))
	for rows.Next() {
		var id string
		var raw []byte
		if err := rows.Scan(&id, &raw); err != nil {
			return nil, err
		}
		var s periods.Schedule
		if err := json.Unmarshal(raw, &s); err != nil {
			return nil, fmt.Errorf("customer %q: stored calendar: %w", id, err)
		}
		out[id] = s
	}
	return out, rows.Err()
}
