package reconcile

import (
	"context"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/shopspring/decimal"
)

// DeepSource re-reads usage from Kafka for the deep check: for every
// stream of the given customers, the highest-seq record it can still find
// and whether retention may have hidden older messages.
type DeepSource interface {
	StreamTotals(ctx context.Context, customers []string) (map[StreamID]StreamTotal, error)
}

// StreamID names a stream.
type StreamID struct {
	Producer string
	Epoch    int64
	Customer string
	Meter    string
}

// StreamTotal is what Kafka still holds of a stream.
type StreamTotal struct {
	LastSeq   int64
	LastTotal decimal.Decimal
	Complete  bool // false: retention deleted some of the topic's messages
}

// deep compares stream totals recomputed from Kafka's messages (without
// the ledger's code path) with the ledger's stream state.
func (rc *Reconciler) deep(ctx context.Context, tx pgx.Tx, r *runner, tg target) error {
	if rc.cfg.Deep == nil {
		r.run.Checks = append(r.run.Checks, Check{Name: CheckDeep, Status: "skipped", Detail: "no Kafka brokers configured for the deep check"})
		return fmt.Errorf("--deep needs Kafka brokers (TALLY_KAFKA_BROKERS)")
	}
	start := time.Now()
	fromKafka, err := rc.cfg.Deep.StreamTotals(ctx, tg.customers)
	if err != nil {
		return err
	}
	rows, err := tx.Query(ctx, `SELECT producer, epoch, customer, meter, last_seq, last_total FROM streams WHERE customer = ANY($1)`, tg.customers)
	if err != nil {
		return err
	}
	ledger := map[StreamID]StreamTotal{}
	for rows.Next() {
		var id StreamID
		var st StreamTotal
		var total numeric
		if err := rows.Scan(&id.Producer, &id.Epoch, &id.Customer, &id.Meter, &st.LastSeq, &total); err != nil {
			rows.Close()
			return err
		}
		st.LastTotal = total.dec()
		ledger[id] = st
	}
	rows.Close()
	if err := rows.Err(); err != nil {
		return err
	}
	before := len(r.run.Findings)
	for id, k := range fromKafka {
		l, ok := ledger[id]
		stream := fmt.Sprintf("%s/%d", id.Producer, id.Epoch)
		switch {
		case !ok:
			r.find(Finding{Kind: KindDeepMismatch, Severity: Discrepancy, Customer: id.Customer, Meter: id.Meter, Stream: stream, Amount: &k.LastTotal,
				Detail: fmt.Sprintf("Kafka holds this stream up to seq %d (total %s) but the ledger has no such stream", k.LastSeq, k.LastTotal)})
		case !l.LastTotal.Equal(k.LastTotal) || l.LastSeq != k.LastSeq:
			diff := l.LastTotal.Sub(k.LastTotal)
			r.find(Finding{Kind: KindDeepMismatch, Severity: Discrepancy, Customer: id.Customer, Meter: id.Meter, Stream: stream, Amount: &diff,
				Detail: fmt.Sprintf("Kafka's messages end at seq %d total %s; the ledger at seq %d total %s", k.LastSeq, k.LastTotal, l.LastSeq, l.LastTotal)})
		}
	}
	complete := true
	for _, k := range fromKafka {
		complete = complete && k.Complete
	}
	c := Check{Name: CheckDeep, Status: "ok", Detail: fmt.Sprintf("%d streams recomputed from Kafka in %s", len(fromKafka), time.Since(start).Round(time.Millisecond))}
	if n := len(r.run.Findings) - before; n > 0 {
		c.Status, c.Detail = "findings", fmt.Sprintf("%d findings; %s", n, c.Detail)
	}
	if !complete {
		c.Detail += "; retention removed older messages, so streams absent from Kafka were not compared"
	}
	r.run.Checks = append(r.run.Checks, c)
	return nil
}
