package reconcile_test

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/google/uuid"

	"github.com/tally-ledger/tally/ledger"
	"github.com/tally-ledger/tally/periods"
	"github.com/tally-ledger/tally/reconcile"
)

// TestDeadLetterOfUnknownCustomerBlocksEveryClose: every message of a new
// customer was refused, so the ledger never saw it. Its dead letter is
// reported by the run and blocks every close until it is accepted.
func TestDeadLetterOfUnknownCustomerBlocksEveryClose(t *testing.T) {
	e := newEnv(t)
	oct := time.Date(2026, 10, 10, 0, 0, 0, 0, time.UTC)
	e.apply(rec("gw", 1, "acme", 1, "10", "10", oct))
	e.exec(`INSERT INTO ingest_partitions (topic, partition, next_offset, messages_in, messages_rejected) VALUES ('tally.meter-batches', 0, 8, 8, 1)`)
	dl := uuid.MustParse("019a3c8e-7a40-7000-8000-0000000000d3")
	e.exec(`INSERT INTO dead_letters (id, topic, partition, "offset", reason, detail, key, raw, created_at)
		VALUES ($1, 'tally.meter-batches', 0, 7, 'schema', 'unknown field', 'newco', '{}', $2)`, dl, oct)
	e.now = time.Date(2026, 11, 3, 0, 0, 0, 0, time.UTC)
	r := e.run(reconcile.Options{Period: "2026-10-01", Close: true})
	dls := findings(t, r, reconcile.KindDeadLetter)
	if r.Status != reconcile.StatusDiscrepancies || len(dls) != 1 || !strings.Contains(dls[0].Detail, "newco") || len(r.Closed) != 0 {
		t.Fatalf("run: %s closed %v %+v", r.Status, r.Closed, r.Findings)
	}
	if _, err := e.close("acme", "2026-10-01"); !errors.Is(err, periods.ErrNotReconciled) {
		t.Fatalf("close: %v", err)
	}
	// Accepting needs who and why, and a dead letter that exists.
	if err := reconcile.Accept(context.Background(), e.pool, reconcile.Acceptance{Kind: reconcile.AcceptDeadLetter, ID: dl}); err == nil {
		t.Fatal("accepted without actor and reason")
	}
	if err := reconcile.Accept(context.Background(), e.pool, reconcile.Acceptance{Kind: reconcile.AcceptDeadLetter, ID: uuid.New(),
		Actor: "alice", Reason: "x"}); !errors.Is(err, reconcile.ErrLossNotFound) {
		t.Fatalf("accepting a missing dead letter: %v", err)
	}
	if err := reconcile.Accept(context.Background(), e.pool, reconcile.Acceptance{Kind: reconcile.AcceptDeadLetter, ID: dl,
		Actor: "alice", Reason: "test traffic of a customer that never signed"}); err != nil {
		t.Fatal(err)
	}
	r = e.run(reconcile.Options{Period: "2026-10-01", Close: true})
	if r.Status != reconcile.StatusClean || len(r.Closed) != 1 {
		t.Fatalf("after accepting: %s closed %v %+v", r.Status, r.Closed, r.Findings)
	}
}

// TestOffsetJumpBlocksCloses: Kafka deleted messages before ingest read
// them; whose usage they held is unknown, so every period that had started
// is dirty until the jump is accepted.
func TestOffsetJumpBlocksCloses(t *testing.T) {
	e := newEnv(t)
	e.apply(rec("gw", 1, "acme", 1, "10", "10", nov))
	jump := uuid.MustParse("019a3c8e-7a40-7000-8000-0000000000e1")
	e.exec(`INSERT INTO ingest_offset_jumps (id, topic, partition, from_offset, to_offset, detected_at, detail)
		VALUES ($1, 'tally.meter-batches', 0, 10, 25, $2, '15 messages deleted unread')`, jump, nov)
	// October is not closed: the lost messages may hold its late usage.
	if r := e.run(reconcile.Options{Period: "2026-10-01"}); len(findings(t, r, reconcile.KindOffsetJump)) != 1 {
		t.Fatalf("October: %+v", r.Findings)
	}
	r := e.run(reconcile.Options{Period: "2026-11-01"})
	j := findings(t, r, reconcile.KindOffsetJump)
	if r.Status != reconcile.StatusDiscrepancies || len(j) != 1 || !strings.Contains(j[0].Detail, "offsets 10-24") {
		t.Fatalf("run: %s %+v", r.Status, r.Findings)
	}
	if err := reconcile.Accept(context.Background(), e.pool, reconcile.Acceptance{Kind: reconcile.AcceptOffsetJump, ID: jump,
		Actor: "alice", Reason: "load test topic"}); err != nil {
		t.Fatal(err)
	}
	if r := e.run(reconcile.Options{Period: "2026-11-01"}); r.Status != reconcile.StatusClean {
		t.Fatalf("after accepting: %s %+v", r.Status, r.Findings)
	}
}

// TestConflictReportedWhereDetected: a conflict on late usage of a closed
// period is reported by the run of the period it was detected in, which
// gates a close.
func TestConflictReportedWhereDetected(t *testing.T) {
	e := newEnv(t)
	oct := time.Date(2026, 10, 10, 0, 0, 0, 0, time.UTC)
	e.apply(rec("gw", 1, "acme", 1, "10", "10", oct))
	e.now = time.Date(2026, 11, 3, 0, 0, 0, 0, time.UTC)
	if r := e.run(reconcile.Options{Period: "2026-10-01", Close: true}); len(r.Closed) != 1 {
		t.Fatalf("october: %s %v", r.Status, r.Closed)
	}
	e.now = time.Date(2026, 11, 10, 0, 0, 0, 0, time.UTC)
	if o := e.apply(rec("gw", 1, "acme", 1, "12", "", oct)); o[0].Kind != ledger.Conflict {
		t.Fatalf("setup: %v", o[0].Kind)
	}
	r := e.run(reconcile.Options{Period: "2026-11-01"})
	if c := findings(t, r, reconcile.KindConflict); r.Status != reconcile.StatusDiscrepancies || len(c) != 1 {
		t.Fatalf("november: %s %+v", r.Status, r.Findings)
	}
}
