package ledger_test

import (
	"bytes"
	"context"
	"log/slog"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/tally-ledger/tally/ledger"
)

// TestOperationIDReusedPastLastSeq: Apply looks up only the operation ids
// of records at or below their stream's last seq; a record past it that
// reuses a recorded id (from another stream) is caught by the unique key
// when the records are written, and the batch is applied again with every
// id looked up. The outcomes, the ledger and the rollups are those of
// applying the records one at a time.
func TestOperationIDReusedPastLastSeq(t *testing.T) {
	f := newFixture(t)
	var logs bytes.Buffer
	l, err := ledger.New(ledger.Config{Clock: func() time.Time { return f.now },
		Logger: slog.New(slog.NewTextHandler(&logs, nil))})
	if err != nil {
		t.Fatal(err)
	}
	f.l = l
	s1 := recBuilder{"gw-1", 1, "acme", "api_calls"}
	s2 := recBuilder{"gw-1", 1, "acme", "bytes"}

	if got := kinds(f.apply(s1.rec(1, "10", nov))); got != "applied" {
		t.Fatalf("outcomes = %s", got)
	}
	reused := s2.rec(1, "5", nov) // past s2's last seq (0), under s1's first operation id
	reused.OperationID = opID(s1, 1)
	batch := []ledger.Record{reused, s2.rec(2, "7", nov), s1.rec(2, "12", nov)}
	if got := kinds(f.apply(batch...)); got != "conflict(operation_id_reused) applied applied" {
		t.Fatalf("outcomes = %s", got)
	}
	if !strings.Contains(logs.String(), "applying the batch again") {
		t.Fatalf("the batch was not applied again; logs: %s", logs.String())
	}
	for sql, want := range map[string]string{
		`SELECT trim_scale(sum(billed))::text FROM records`:                            "19",
		`SELECT count(*)::text FROM records`:                                           "3",
		`SELECT trim_scale(sum(quantity))::text FROM rollups WHERE customer = 'acme'`:  "19",
		`SELECT count(*)::text FROM conflicts WHERE reason = 'operation_id_reused'`:    "1",
		`SELECT count(*)::text FROM gaps`:                                              "1",
		`SELECT string_agg(meter || ':' || last_seq, ',' ORDER BY meter) FROM streams`: "api_calls:2,bytes:2",
	} {
		if got := f.scalar(sql); got != want {
			t.Errorf("%s = %s, want %s", sql, got, want)
		}
	}
	// The same batch again: everything is now at or below the last seqs.
	logs.Reset()
	if got := kinds(f.apply(batch...)); got != "conflict(operation_id_reused) duplicate duplicate" {
		t.Fatalf("outcomes again = %s", got)
	}
	if logs.Len() != 0 {
		t.Fatalf("applied again on a retransmit: %s", logs.String())
	}
}

// TestConcurrentNewOperationID: two transactions write the same new
// operation id on two streams at once. The second one's write waits for
// the first; when the first commits, the unique key refuses the second's
// write, and Apply applies its batch again, every id looked up: a
// conflict, in the same transaction, instead of an error.
func TestConcurrentNewOperationID(t *testing.T) {
	f := newFixture(t)
	ctx := context.Background()
	s1 := recBuilder{"gw-1", 1, "acme", "api_calls"}
	s2 := recBuilder{"gw-2", 1, "acme", "api_calls"}
	first := s1.rec(1, "10", nov)
	second := s2.rec(1, "4", nov)
	second.OperationID = first.OperationID
	// The customer exists already: creating it is not what the second
	// transaction waits for.
	f.apply(recBuilder{"gw-3", 1, "acme", "api_calls"}.rec(1, "1", nov))

	tx1, err := f.pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = tx1.Rollback(ctx) }()
	if out, err := f.l.Apply(ctx, tx1, []ledger.Record{first}); err != nil || kinds(out) != "applied" {
		t.Fatalf("first: %v %v", kinds(out), err)
	}

	type result struct {
		out []ledger.Outcome
		err error
	}
	done := make(chan result, 1)
	go func() {
		var r result
		r.err = pgx.BeginFunc(ctx, f.pool, func(tx pgx.Tx) error {
			var err error
			r.out, err = f.l.Apply(ctx, tx, []ledger.Record{second})
			return err
		})
		done <- r
	}()
	// The second transaction waits on the first's uncommitted id.
	f.awaitLockWait()
	if err := tx1.Commit(ctx); err != nil {
		t.Fatal(err)
	}
	r := <-done
	if r.err != nil {
		t.Fatalf("second: %v", r.err)
	}
	if got := kinds(r.out); got != "conflict(operation_id_reused)" {
		t.Fatalf("second: %s", got)
	}
	if got := f.scalar(`SELECT trim_scale(sum(billed))::text FROM records`); got != "11" {
		t.Fatalf("billed = %s, want 11", got)
	}
}
