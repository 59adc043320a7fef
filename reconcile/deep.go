package reconcile

import (
	"cmp"
	"context"
	"fmt"
	"sort"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"

	"github.com/tally-ledger/tally/internal/pgcopy"
	"github.com/tally-ledger/tally/ledger"
)

// DeepSource re-reads usage from Kafka for the deep check, without the
// ledger's code path.
type DeepSource interface {
	// Read passes to emit every record of the given customers that Kafka
	// still holds below ingest's position (applied: a partition without
	// one is read to its end), each partition's in the order Kafka holds
	// them, and returns which partition holds each customer's messages,
	// which partitions lost their oldest messages to retention, and how
	// many messages it left unread past the position. It keeps none of
	// the records: a topic holds weeks of usage, and emit stores each
	// where the check reads it back (an error from emit ends the read).
	Read(ctx context.Context, customers []string, applied Positions, emit func(StreamID, KafkaRecord) error) (*KafkaView, error)
}

// Positions is ingest's position in the ledger a run reads: per topic and
// partition, the offset of the next message to consume. Ingest commits a
// micro-batch's records and its position in one transaction, so the
// run's snapshot holds exactly the messages below it (applied or
// dead-lettered); those past it are compared by a later run.
type Positions map[string]map[int]int64

// StreamID names a stream.
type StreamID struct {
	Producer string
	Epoch    int64
	Customer string
	Meter    string
}

// KafkaView says where the metering topic holds some customers' messages.
type KafkaView struct {
	// Topic read (its dead letters are left to their own check).
	Topic string
	// Partition of each customer found (a customer's messages share one).
	Partition map[string]int
	// Partitions whose first messages retention deleted: what they held
	// cannot be recomputed.
	Incomplete map[int]bool
	// Unread counts the messages past ingest's position, not read.
	Unread int64
}

// KafkaRecord is one record as the ledger would apply it
// (ledger.FromWire), and where Kafka holds it: its message's
// partition and offset, and its index in the message's records (as a
// dead letter names it). The deep check recomputes counters' totals;
// gauge and unique streams (Shape) it compares by position only.
type KafkaRecord struct {
	ledger.Record
	Partition int
	Offset    int64
	Index     int
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
// The records read go, a few thousand at a time, into the run's temporary
// table deep_kafka (created with the run's transaction, see check), and
// Postgres recomputes and compares: the run holds no more of the topic in
// memory than one such chunk, however much of it Kafka keeps.
//
// It reads as its steps: read Kafka into deep_kafka → compare usage →
// compare streams → report what was not checked → the check's verdict.
func (rc *Reconciler) deep(ctx context.Context, tx pgx.Tx, r *runner, tg target) error {
	if rc.cfg.Deep == nil {
		r.run.Checks = append(r.run.Checks, Check{Name: CheckDeep, Status: "skipped", Detail: "no Kafka brokers configured for the deep check"})
		return fmt.Errorf("--deep needs Kafka brokers (TALLY_KAFKA_BROKERS)")
	}
	start := time.Now()
	applied, err := positions(ctx, tx)
	if err != nil {
		return err
	}
	conflicting, err := conflictingOperations(ctx, tx, tg.customers)
	if err != nil {
		return err
	}
	kept := &deepRecords{conn: tx.Conn(), progress: rc.progress, said: start, conflicting: conflicting}
	view, err := rc.cfg.Deep.Read(ctx, tg.customers, applied, func(id StreamID, k KafkaRecord) error { return kept.add(ctx, id, k) })
	if err != nil {
		return err
	}
	if err := kept.flush(ctx); err != nil {
		return err
	}
	rc.progress("deep check: %d records read from Kafka in %s\n", kept.read, time.Since(start).Round(time.Millisecond))

	before := r.found
	var checked []string
	notChecked := map[string]bool{}
	for _, c := range tg.customers {
		if view.checkable(c) {
			checked = append(checked, c)
		} else {
			notChecked[c] = true
		}
	}
	args := tg.args()
	args["checked"], args["topic"] = checked, view.Topic
	if err := compareUsage(ctx, tx, r, args); err != nil {
		return err
	}
	streams, byPosition, err := compareStreams(ctx, tx, r, args)
	if err != nil {
		return err
	}
	skipped := reportNotChecked(r, view, notChecked)
	c := deepVerdict(streams, r.found-before-len(skipped), len(skipped), time.Since(start))
	if byPosition > 0 {
		c.Detail += fmt.Sprintf("; %d of them gauge or unique streams, compared by their last seq only (their levels and members: %s)", byPosition, CheckKinds)
	}
	if view.Unread > 0 {
		c.Detail += fmt.Sprintf("; %d messages past ingest's position not read (not applied yet: a later run compares them)", view.Unread)
	}
	r.run.Checks = append(r.run.Checks, c)
	return nil
}

// conflictingOperations reads the operation ids of the customers'
// conflicts: only records under one of them can be one (a producer's
// fault, rare), so only those are hashed (ledger.ConflictHash) to find
// out.
func conflictingOperations(ctx context.Context, tx pgx.Tx, customers []string) (map[uuid.UUID]bool, error) {
	rows, err := tx.Query(ctx, qConflictingOperations, customers)
	if err != nil {
		return nil, err
	}
	ids, err := pgx.CollectRows(rows, pgx.RowTo[uuid.UUID])
	if err != nil {
		return nil, err
	}
	out := make(map[uuid.UUID]bool, len(ids))
	for _, id := range ids {
		out[id] = true
	}
	return out, nil
}

// positions reads ingest's position in the run's snapshot.
func positions(ctx context.Context, tx pgx.Tx) (Positions, error) {
	rows, err := tx.Query(ctx, qIngestPositions)
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	out := Positions{}
	for rows.Next() {
		var topic string
		var partition int
		var next int64
		if err := rows.Scan(&topic, &partition, &next); err != nil {
			return nil, err
		}
		if out[topic] == nil {
			out[topic] = map[int]int64{}
		}
		out[topic][partition] = next
	}
	return out, rows.Err()
}

// deepKafkaTable holds, for one run, the records the deep check read from
// Kafka, with their place in Kafka's order (ord). It is temporary (the
// run's connection's own) and is created before the run's read-only
// transaction, which may write to it but not create it.
const (
	deepKafkaTable = `CREATE TEMPORARY TABLE deep_kafka (ord bigint NOT NULL, producer text NOT NULL, epoch bigint NOT NULL, customer text NOT NULL, meter text NOT NULL,
  seq bigint NOT NULL, total numeric NOT NULL, occurred_at timestamptz NOT NULL, partition bigint NOT NULL, "offset" bigint NOT NULL, record_index bigint NOT NULL,
  shape text NOT NULL, operation_id uuid NOT NULL, conflict_hash bytea)`
	deepKafkaDrop    = `DROP TABLE IF EXISTS pg_temp.deep_kafka`
	deepKafkaCopy    = `COPY pg_temp.deep_kafka (ord, producer, epoch, customer, meter, seq, total, occurred_at, partition, "offset", record_index, shape, operation_id, conflict_hash) FROM STDIN (FORMAT binary)`
	deepChunkRecords = 5000
)

var deepKafkaColumns = []string{"ord", "producer", "epoch", "customer", "meter", "seq", "total", "occurred_at", "partition", "offset", "record_index", "shape", "operation_id", "conflict_hash"}

// deepRecords sends the records Kafka gives the deep check to deep_kafka,
// deepChunkRecords at a time, saying every ten seconds how many it has
// read.
type deepRecords struct {
	conn *pgx.Conn
	// conflicting: the operation ids of the run's customers' conflicts.
	conflicting map[uuid.UUID]bool
	progress    func(format string, args ...any)
	pending     []deepRecord
	read        int64 // records read, the order of the next one
	said        time.Time
	buf         []byte
}

// deepRecord is a record read and its stream.
type deepRecord struct {
	id StreamID
	k  KafkaRecord
}

func (d *deepRecords) add(ctx context.Context, id StreamID, k KafkaRecord) error {
	d.pending = append(d.pending, deepRecord{id, k})
	if len(d.pending) < deepChunkRecords {
		return nil
	}
	if err := d.flush(ctx); err != nil {
		return err
	}
	if time.Since(d.said) >= 10*time.Second {
		d.said = time.Now()
		d.progress("deep check: %d records read from Kafka\n", d.read)
	}
	return nil
}

func (d *deepRecords) flush(ctx context.Context) error {
	if len(d.pending) == 0 {
		return nil
	}
	first := d.read
	var err error
	d.buf, err = pgcopy.Stream(d.buf[:0], len(d.pending), len(deepKafkaColumns), func(buf []byte, i int) ([]byte, error) {
		id, k := d.pending[i].id, d.pending[i].k
		buf = pgcopy.Int8(buf, first+int64(i))
		buf = pgcopy.Text(buf, id.Producer)
		buf = pgcopy.Int8(buf, id.Epoch)
		buf = pgcopy.Text(buf, id.Customer)
		buf = pgcopy.Text(buf, id.Meter)
		buf = pgcopy.Int8(buf, k.Seq)
		if buf, err = pgcopy.Numeric(buf, k.Total); err != nil {
			return nil, err
		}
		buf = pgcopy.Time(buf, k.OccurredAt)
		buf = pgcopy.Int8(buf, int64(k.Partition))
		buf = pgcopy.Int8(buf, k.Offset)
		buf = pgcopy.Int8(buf, int64(k.Index))
		buf = pgcopy.Text(buf, cmp.Or(string(k.Shape), string(ledger.Counter)))
		buf = pgcopy.Bytes(buf, k.OperationID[:])
		if !d.conflicting[k.OperationID] {
			return pgcopy.Null(buf), nil // no conflict under its operation id
		}
		return pgcopy.Bytes(buf, ledger.ConflictHash(k.Record)), nil
	})
	if err != nil {
		return err
	}
	if err := pgcopy.In(ctx, d.conn, "deep_kafka", deepKafkaColumns, deepKafkaCopy, d.buf, int64(len(d.pending))); err != nil {
		return fmt.Errorf("keeping the records read: %w", err)
	}
	d.read += int64(len(d.pending))
	clear(d.pending)
	d.pending = d.pending[:0]
	return nil
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

// compareUsage finds, per checked customer and meter in order, where the
// period's usage the ledger holds differs from what Kafka's records
// recompute (qDeepUsageCompare).
func compareUsage(ctx context.Context, tx pgx.Tx, r *runner, args pgx.NamedArgs) error {
	rows, err := tx.Query(ctx, qDeepUsageCompare, args)
	if err != nil {
		return err
	}
	defer rows.Close()
	for rows.Next() {
		var customer, meter string
		var start time.Time
		var held, kafka numeric
		if err := rows.Scan(&customer, &meter, &start, &held, &kafka); err != nil {
			return err
		}
		l, kf := held.dec(), kafka.dec()
		diff := l.Sub(kf)
		r.find(Finding{Kind: KindDeepMismatch, Severity: Discrepancy, Customer: customer, Meter: meter, Period: &start, Amount: &diff,
			Detail: fmt.Sprintf("Kafka's messages recompute %s of usage in this period; the ledger holds %s for it", kf, l)})
	}
	return rows.Err()
}

// compareStreams finds, both ways and in order, the checked customers'
// streams whose state the ledger and Kafka's records disagree on
// (qDeepStreamsCompare), and returns how many streams it compared and how
// many of them carry levels or members (gauges, unique meters): those it
// compares by position only.
func compareStreams(ctx context.Context, tx pgx.Tx, r *runner, args pgx.NamedArgs) (streams, byPosition int, err error) {
	rows, err := tx.Query(ctx, qDeepStreamsCompare, args)
	if err != nil {
		return 0, 0, err
	}
	defer rows.Close()
	for rows.Next() {
		var id StreamID
		var lseq, kseq *int64
		var ltotal, ktotal nullNumeric
		var shape *string
		if err := rows.Scan(&id.Customer, &id.Meter, &id.Producer, &id.Epoch, &lseq, &ltotal, &kseq, &ktotal, &shape); err != nil {
			return 0, 0, err
		}
		streams++
		if shape != nil && *shape != "counter" {
			byPosition++
		}
		l, k := ltotal.dec(), ktotal.dec()
		stream := fmt.Sprintf("%s/%d", id.Producer, id.Epoch)
		switch {
		case lseq == nil:
			r.find(Finding{Kind: KindDeepMismatch, Severity: Discrepancy, Customer: id.Customer, Meter: id.Meter, Stream: stream, Amount: &k,
				Detail: fmt.Sprintf("Kafka holds this stream up to seq %d (total %s) but the ledger has no such stream", *kseq, k)})
		case kseq == nil:
			r.find(Finding{Kind: KindDeepMismatch, Severity: Discrepancy, Customer: id.Customer, Meter: id.Meter, Stream: stream, Amount: &l,
				Detail: fmt.Sprintf("the ledger has this stream up to seq %d (total %s) but Kafka, which lost no messages, holds none of it", *lseq, l)})
		case !l.Equal(k) || *lseq != *kseq:
			diff := l.Sub(k)
			r.find(Finding{Kind: KindDeepMismatch, Severity: Discrepancy, Customer: id.Customer, Meter: id.Meter, Stream: stream, Amount: &diff,
				Detail: fmt.Sprintf("Kafka's messages end at seq %d total %s; the ledger at seq %d total %s", *kseq, k, *lseq, l)})
		}
	}
	return streams, byPosition, rows.Err()
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
