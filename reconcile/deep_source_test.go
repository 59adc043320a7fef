package reconcile_test

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/segmentio/kafka-go"

	"github.com/tally-ledger/tally/amount"
	"github.com/tally-ledger/tally/ingest/wire"
	"github.com/tally-ledger/tally/internal/kafkatest"
	"github.com/tally-ledger/tally/ledger"
	"github.com/tally-ledger/tally/reconcile"
)

// TestDeepHoldsNoTopicInMemory: the deep check reads every message Kafka
// still holds of the period's customers, which in a deployment is weeks
// of a topic. What the run keeps in memory must not grow with it: here
// 300,000 records, which as Go values took about 25 MB; the run's live
// heap may grow by half of that at most (it grows by 2–5 MB).
func TestDeepHoldsNoTopicInMemory(t *testing.T) {
	const customers, seqs, perMessage = 100, 3000, 100
	e := newEnv(t)
	kc := kafkatest.New(t, kafkatest.Options{Topics: []kafkatest.Topic{{Name: "tally.meter-batches", Partitions: 2}}})
	var msgs []kafka.Message
	for c := range customers {
		customer := fmt.Sprintf("c%03d", c)
		var recs []ledger.Record
		for s := int64(1); s <= seqs; s++ {
			recs = append(recs, ledger.Record{OperationID: uuid.New(),
				Stream: ledger.StreamKey{Producer: "gw", Epoch: 1, Customer: customer, Meter: "calls"},
				Seq:    s, Total: amount.MustParse(fmt.Sprintf("%d.5", s*3)), OccurredAt: nov.Add(time.Duration(s) * time.Second)})
		}
		e.apply(recs...)
		for i := 0; i < len(recs); i += perMessage {
			b := wire.Batch{Schema: wire.Schema, BatchID: uuid.Must(uuid.NewV7()), Producer: "gw", Epoch: 1, SentAt: nov}
			for _, r := range recs[i : i+perMessage] {
				b.Records = append(b.Records, wire.Record{OperationID: r.OperationID, Customer: customer, Meter: "calls", Seq: r.Seq,
					Total: r.Total, OccurredAt: r.OccurredAt})
			}
			v, err := wire.Encode(b)
			if err != nil {
				t.Fatal(err)
			}
			msgs = append(msgs, kafka.Message{Key: []byte(customer), Value: v})
		}
	}
	kc.Produce(t, "tally.meter-batches", msgs...)
	msgs = nil

	rc, err := reconcile.New(reconcile.Config{Pool: e.pool, Clock: func() time.Time { return e.now },
		Deep: reconcile.KafkaSource{Brokers: kc.Addrs, Topic: "tally.meter-batches"}})
	if err != nil {
		t.Fatal(err)
	}
	var r *reconcile.Run
	before, grew, took := heapGrowth(func() { r, err = rc.Run(context.Background(), reconcile.Options{Period: "2026-11-01", Deep: true}) })
	if err != nil || r.Status != reconcile.StatusClean {
		t.Fatalf("deep run: %v %s %+v", err, r.Status, r.Findings)
	}
	if c := deepCheck(r); c.Status != "ok" || !strings.HasPrefix(c.Detail, fmt.Sprintf("%d streams recomputed", customers)) {
		t.Fatalf("deep check: %+v", c)
	}
	t.Logf("live heap %d MB before the run, grew by at most %.1f MB during it (%s)", before>>20, float64(grew)/(1<<20), took)
	// Holding the records took 24.5 MB (with -race) at most here.
	if grew > 12<<20 {
		t.Fatalf("the deep check's live heap grew by %.1f MB for %d records: it holds the topic in memory",
			float64(grew)/(1<<20), customers*seqs)
	}
}

// records is a DeepSource of records given in Kafka's order, all on
// partition 0; fail, when set, ends the read after them.
type records struct {
	ids  []reconcile.StreamID
	recs []reconcile.KafkaRecord
	fail error
}

func (s *records) add(rs ...ledger.Record) {
	for _, r := range rs {
		s.ids = append(s.ids, reconcile.StreamID{Producer: r.Stream.Producer, Epoch: r.Stream.Epoch, Customer: r.Stream.Customer, Meter: r.Stream.Meter})
		s.recs = append(s.recs, reconcile.KafkaRecord{Record: r})
	}
}

func (s *records) Read(ctx context.Context, customers []string, _ reconcile.Positions, emit func(reconcile.StreamID, reconcile.KafkaRecord) error) (*reconcile.KafkaView, error) {
	view := &reconcile.KafkaView{Partition: map[string]int{}, Incomplete: map[int]bool{}}
	for i, id := range s.ids {
		view.Partition[id.Customer] = 0
		if err := emit(id, s.recs[i]); err != nil {
			return nil, err
		}
	}
	return view, s.fail
}

// appliedAndRead applies sent to the ledger, in order, and returns a
// Reconciler whose deep check reads them back from a records source, as
// Kafka would hold them.
func appliedAndRead(t *testing.T, e *env, sent ...ledger.Record) *reconcile.Reconciler {
	t.Helper()
	e.apply(sent...)
	src := &records{}
	src.add(sent...)
	rc, err := reconcile.New(reconcile.Config{Pool: e.pool, Clock: func() time.Time { return e.now }, Deep: src})
	if err != nil {
		t.Fatal(err)
	}
	return rc
}

// TestDeepTakesTheFirstRecordOfEachSeq: Kafka holds a stream's records
// out of order, sent twice, and once with another total under a seq
// already taken (a producer's fault the ledger answered as a conflict);
// the deep check recomputes as the ledger applied them, the first of each
// seq in Kafka's order, each record's growth in the period it occurred in.
func TestDeepTakesTheFirstRecordOfEachSeq(t *testing.T) {
	e := newEnv(t)
	oct := time.Date(2026, 10, 30, 0, 0, 0, 0, time.UTC)
	sent := []ledger.Record{
		rec("gw", 1, "acme", 2, "15", "", oct), // October: 15 of growth from 0, billed in October
		rec("gw", 1, "acme", 1, "10", "", oct),
		rec("gw", 1, "acme", 3, "21", "", nov), // November: 6
		rec("gw", 1, "acme", 2, "15", "", oct), // sent again
		rec("gw", 1, "acme", 4, "24.5", "", nov),
		rec("gw", 1, "acme", 4, "30", "", nov), // seq 4 again, another total: a conflict
		rec("gw", 2, "acme", 1, "1", "", nov),
	}
	rc := appliedAndRead(t, e, sent...)
	deepFindings := func() (out []string) {
		t.Helper()
		r, err := rc.Run(context.Background(), reconcile.Options{Period: "2026-11-01", Customer: "acme", Deep: true})
		if err != nil {
			t.Fatal(err)
		}
		if c := deepCheck(r); !strings.Contains(c.Detail, "2 streams recomputed") {
			t.Fatalf("deep check: %+v", c)
		}
		for _, f := range r.Findings {
			if f.Kind == reconcile.KindDeepMismatch {
				out = append(out, f.Amount.String()+" "+f.Detail)
			}
		}
		return out
	}
	// The conflict is a finding of its own (conflicts_and_dead_letters).
	if deep := deepFindings(); len(deep) != 0 {
		t.Fatalf("deep findings %q, want none", deep)
	}
	// The ledger's November usage of acme changed by hand: Kafka
	// recomputes 10.5 (6 + 3.5 + 1).
	e.exec(`UPDATE records SET billed = billed + 2 WHERE customer = 'acme' AND seq = 4`)
	if deep, want := deepFindings(), "2 Kafka's messages recompute 10.5 of usage in this period; the ledger holds 12.5 for it"; len(deep) != 1 || deep[0] != want {
		t.Fatalf("deep findings %q, want [%q]", deep, want)
	}
}

// TestDeepRunThatFailsLeavesNothingBehind: a deep run whose read of Kafka
// fails part way says so, and the next run on the same connection starts
// clean (the records the failed run kept went with it).
func TestDeepRunThatFailsLeavesNothingBehind(t *testing.T) {
	e := newEnv(t)
	cfg := e.pool.Config()
	cfg.MaxConns = 1
	pool, err := pgxpool.NewWithConfig(context.Background(), cfg)
	if err != nil {
		t.Fatal(err)
	}
	defer pool.Close()
	recs := []ledger.Record{rec("gw", 1, "acme", 1, "10", "", nov), rec("gw", 1, "acme", 2, "15", "", nov)}
	e.apply(recs...)
	src := &records{fail: errors.New("the broker went away")}
	src.add(recs...)
	rc, err := reconcile.New(reconcile.Config{Pool: pool, Clock: func() time.Time { return e.now }, Deep: src})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := rc.Run(context.Background(), reconcile.Options{Period: "2026-11-01", Deep: true}); err == nil || !strings.Contains(err.Error(), "the broker went away") {
		t.Fatalf("deep run with a failing read: %v", err)
	}
	src.fail = nil
	r, err := rc.Run(context.Background(), reconcile.Options{Period: "2026-11-01", Deep: true})
	if err != nil || r.Status != reconcile.StatusClean {
		t.Fatalf("deep run after a failed one: %v %+v", err, r)
	}
	if c := deepCheck(r); c.Status != "ok" || !strings.HasPrefix(c.Detail, "1 streams recomputed") {
		t.Fatalf("deep check: %+v", c)
	}
}

// TestDeepSaysWhatItComparedByPositionOnly: a gauge's readings carry
// levels and a unique meter's members, not running totals; the deep check
// compares their streams' positions, and says so, leaving their levels and
// members to gauges_and_uniques.
func TestDeepSaysWhatItComparedByPositionOnly(t *testing.T) {
	e := newEnv(t)
	e.declare("seats", ledger.Gauge)
	sent := []ledger.Record{rec("gw", 1, "acme", 1, "10", "", nov), level("hr", 1, "7", nov), level("hr", 2, "9", nov.Add(time.Hour))}
	r, err := appliedAndRead(t, e, sent...).Run(context.Background(), reconcile.Options{Period: "2026-11-01", Deep: true})
	if err != nil || r.Status != reconcile.StatusClean {
		t.Fatalf("deep run: %v %+v", err, r)
	}
	if c := deepCheck(r); c.Status != "ok" || !strings.HasPrefix(c.Detail, "2 streams recomputed") ||
		!strings.Contains(c.Detail, "1 of them gauge or unique streams, compared by their last seq only (their levels and members: gauges_and_uniques)") {
		t.Fatalf("deep check: %+v", c)
	}
}

// TestDeepLeavesConflictsToTheirCheck: records the ledger answered as
// conflicts did not count: an operation id already used by another
// record, a late fill whose total lies outside its neighbours'. Each is a
// finding of conflicts_and_dead_letters; the deep check recomputes what
// the ledger applied, so it leaves them out (even when the seq is free,
// and the producer sends it again, right, later) instead of reporting
// each again as a mismatch.
func TestDeepLeavesConflictsToTheirCheck(t *testing.T) {
	e := newEnv(t)
	oct := time.Date(2026, 10, 30, 0, 0, 0, 0, time.UTC)
	first := rec("gw", 1, "acme", 1, "10", "", oct)
	reused := rec("gw", 1, "acme", 3, "25", "", nov)
	reused.OperationID = first.OperationID // seq 3 under seq 1's operation id
	sent := []ledger.Record{
		first,
		rec("gw", 1, "acme", 2, "15", "", nov),
		reused,
		rec("gw", 2, "acme", 1, "5", "", oct),
		rec("gw", 2, "acme", 3, "20", "", nov), // seq 2 missing: 15 billed in November
		rec("gw", 2, "acme", 2, "40", "", oct), // its late fill, above its neighbours' 5 and 20
		rec("gw", 3, "acme", 1, "2", "", nov),
	}
	retried := rec("gw", 3, "acme", 2, "9", "", nov)
	retried.OperationID = first.OperationID        // seq 2 under an operation id taken …
	fixed := rec("gw", 3, "acme", 2, "7", "", nov) // … then sent again with its own
	sent = append(sent, retried, fixed)
	rc := appliedAndRead(t, e, sent...)
	var conflicts int
	if err := e.pool.QueryRow(context.Background(), `SELECT count(*) FROM conflicts`).Scan(&conflicts); err != nil || conflicts != 3 {
		t.Fatalf("%d conflicts (%v), want 3", conflicts, err)
	}
	noMismatch := func(source string, r *reconcile.Run) {
		t.Helper()
		var deep []string
		conflicts := 0
		for _, f := range r.Findings {
			switch f.Kind {
			case reconcile.KindDeepMismatch:
				deep = append(deep, f.Stream+" "+f.Detail)
			case reconcile.KindConflict:
				conflicts++
			}
		}
		if c := deepCheck(r); len(deep) != 0 || conflicts != 3 || !strings.Contains(c.Detail, "3 streams recomputed") {
			t.Fatalf("%s: deep check %+v, findings %q and %d conflicts, want none and the 3 conflicts reported as such", source, c, deep, conflicts)
		}
	}
	r, err := rc.Run(context.Background(), reconcile.Options{Period: "2026-11-01", Customer: "acme", Deep: true})
	if err != nil {
		t.Fatal(err)
	}
	noMismatch("a DeepSource", r)
	// The same messages in Kafka, read by the wire decoder.
	kc := kafkatest.New(t, kafkatest.Options{Topics: []kafkatest.Topic{{Name: "tally.meter-batches", Partitions: 1}}})
	produce(t, kc, sent...)
	noMismatch("Kafka", deepRun(t, e, kc, "2026-11-01"))
}

// TestDeepCountsALateFillWhereTheLedgerKeptIt: a late fill that occurred
// in a closed period stays billed in the open period that billed its gap
// (the statement of a closed period never changes), and the ledger says
// so with a late_fill_not_reattributed notice. The deep check places each
// record's growth in the period it occurred in; it compares that with the
// ledger's usage by the same rule, the amount the notice names included,
// so the notice is not reported again as a discrepancy that blocks the
// open period's close.
func TestDeepCountsALateFillWhereTheLedgerKeptIt(t *testing.T) {
	e := newEnv(t)
	oct := time.Date(2026, 10, 30, 0, 0, 0, 0, time.UTC)
	first := rec("gw", 1, "acme", 1, "10", "10", oct)
	e.apply(first)
	e.exec(`INSERT INTO period_closes (customer, period_start, period_end, closed_at, statement, forced, reason, actor)
		VALUES ('acme', '2026-10-01T00:00:00Z', '2026-11-01T00:00:00Z', now(), '{}', true, 'test', 'test')`)
	after := rec("gw", 1, "acme", 3, "30", "10", nov) // seq 2 lost so far: its usage is billed in November
	fill := rec("gw", 1, "acme", 2, "20", "10", oct)  // it happened in closed October
	e.apply(after)
	if o := e.apply(fill); o[0].Kind != ledger.LateFill {
		t.Fatalf("the fill: %v", o[0].Kind)
	}
	src := &records{}
	src.add(first, after, fill)
	rc, err := reconcile.New(reconcile.Config{Pool: e.pool, Clock: func() time.Time { return e.now }, Deep: src})
	if err != nil {
		t.Fatal(err)
	}
	// November, which billed the gap, and closed October, where the fill
	// occurred: each reports the notice, neither a mismatch.
	for _, period := range []string{"2026-11-01", "2026-10-01"} {
		r, err := rc.Run(context.Background(), reconcile.Options{Period: period, Customer: "acme", Deep: true})
		if err != nil {
			t.Fatal(err)
		}
		var deep, notices []string
		for _, f := range r.Findings {
			switch f.Kind {
			case reconcile.KindDeepMismatch:
				deep = append(deep, f.Detail)
			case reconcile.KindNotReattributed:
				notices = append(notices, f.Detail)
			}
		}
		if len(deep) != 0 || len(notices) != 1 {
			t.Fatalf("%s: deep findings %q and notices %q, want the notice alone", period, deep, notices)
		}
	}
}

// TestDeepCountsAGapWhereTheLedgerKeptIt: a late fill splits its gap; the
// seqs below it, still missing, stay billed in the period that billed the
// gap (open_gap says how much), where Kafka's totals place their growth
// with the fill, in the period it occurred in. The deep check counts such
// a gap, on the ledger's side, where the record above it occurred, as
// Kafka does: neither period reports a mismatch.
func TestDeepCountsAGapWhereTheLedgerKeptIt(t *testing.T) {
	e := newEnv(t)
	oct := time.Date(2026, 10, 30, 0, 0, 0, 0, time.UTC)
	rc := appliedAndRead(t, e,
		rec("gw", 1, "acme", 1, "10", "10", oct),
		rec("gw", 1, "acme", 4, "40", "5", nov),                // seqs 2 and 3 missing: their 25 billed in November
		rec("gw", 1, "acme", 3, "35", "5", oct.Add(time.Hour))) // seq 3's 5 moves to October; seq 2's 20 stays
	for _, period := range []string{"2026-10-01", "2026-11-01"} {
		r, err := rc.Run(context.Background(), reconcile.Options{Period: period, Customer: "acme", Deep: true})
		if err != nil {
			t.Fatal(err)
		}
		for _, f := range r.Findings {
			if f.Kind == reconcile.KindDeepMismatch {
				t.Fatalf("%s: %s", period, f.Detail)
			}
		}
	}
}
