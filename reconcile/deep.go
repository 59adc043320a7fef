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
	// A customer is checkable when the partition holding its messages is
	// whole; one Kafka holds nothing of is checkable only when every
	// partition is whole (its messages may have been on a truncated one).
	anyIncomplete := len(view.Incomplete) > 0
	checkable := func(c string) bool {
		if p, ok := view.Partition[c]; ok {
			return !view.Incomplete[p]
		}
		return !anyIncomplete
	}
	scheds, err := schedules(ctx, tx, tg.customers)
	if err != nil {
		return err
	}
	period := map[string]time.Time{}
	for i, c := range tg.customers {
		period[c] = tg.starts[i]
	}

	// Ledger side.
	rows, err := tx.Query(ctx, qDeepStreams, tg.args())
	if err != nil {
		return err
	}
	type state struct {
		seq   int64
		total decimal.Decimal
	}
	ledger := map[StreamID]state{}
	for rows.Next() {
		var id StreamID
		var st state
		var total numeric
		if err := rows.Scan(&id.Producer, &id.Epoch, &id.Customer, &id.Meter, &st.seq, &total); err != nil {
			rows.Close()
			return err
		}
		st.total = total.dec()
		ledger[id] = st
	}
	rows.Close()
	if err := rows.Err(); err != nil {
		return err
	}
	rows, err = tx.Query(ctx, qDeepUsage, tg.args())
	if err != nil {
		return err
	}
	held := map[[2]string]decimal.Decimal{}
	for rows.Next() {
		var c, m string
		var q numeric
		if err := rows.Scan(&c, &m, &q); err != nil {
			rows.Close()
			return err
		}
		held[[2]string{c, m}] = q.dec()
	}
	rows.Close()
	if err := rows.Err(); err != nil {
		return err
	}

	// Kafka side: per stream, the first record of each seq, in seq order.
	recomputed := map[[2]string]decimal.Decimal{}
	kafkaState := map[StreamID]state{}
	for id, recs := range view.Streams {
		if !checkable(id.Customer) {
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
				return fmt.Errorf("customer %q: %w", id.Customer, err)
			}
			if p.Start.Equal(period[id.Customer]) {
				key := [2]string{id.Customer, id.Meter}
				recomputed[key] = recomputed[key].Add(k.Total.Sub(prev))
			}
			prev = k.Total
		}
		last := first[seqs[len(seqs)-1]]
		kafkaState[id] = state{seq: last.Seq, total: last.Total}
	}

	before := len(r.run.Findings)
	notChecked := map[string]bool{}
	for _, c := range tg.customers {
		if !checkable(c) {
			notChecked[c] = true
		}
	}
	// Usage of the period, per customer and meter.
	keys := map[[2]string]bool{}
	for k := range held {
		keys[k] = true
	}
	for k := range recomputed {
		keys[k] = true
	}
	sorted := make([][2]string, 0, len(keys))
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
	// Stream states, both ways.
	ids := make([]StreamID, 0, len(ledger)+len(kafkaState))
	for id := range ledger {
		ids = append(ids, id)
	}
	for id := range kafkaState {
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
		if notChecked[id.Customer] || !checkable(id.Customer) {
			continue
		}
		streams++
		l, inLedger := ledger[id]
		k, inKafka := kafkaState[id]
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
	c := Check{Name: CheckDeep, Status: "ok", Detail: fmt.Sprintf("%d streams recomputed from Kafka in %s", streams, time.Since(start).Round(time.Millisecond))}
	if n := len(r.run.Findings) - before - len(skipped); n > 0 {
		c.Status, c.Detail = "findings", fmt.Sprintf("%d findings; %s", n, c.Detail)
	}
	if len(skipped) > 0 {
		if c.Status == "ok" {
			c.Status = "not_checked"
		}
		c.Detail += fmt.Sprintf("; %d customers not checked: retention deleted messages they may have had", len(skipped))
	}
	r.run.Checks = append(r.run.Checks, c)
	return nil
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
