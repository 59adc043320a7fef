package ledger_test

import (
	"slices"
	"testing"
	"time"

	"github.com/tally-ledger/tally/ledger"
)

var nov = time.Date(2026, 11, 10, 9, 30, 0, 0, time.UTC)

func TestApplyInOrderDuplicatesAndConflicts(t *testing.T) {
	f := newFixture(t)
	s := recBuilder{"gw-1", 1, "acme", "api_calls"}

	out := f.apply(s.rec(1, "10", nov), s.recQ(2, "12.5", "2.5", nov), s.rec(3, "20", nov))
	if got := kinds(out); got != "applied applied applied" {
		t.Fatalf("outcomes = %s", got)
	}
	if out[1].Billed.String() != "2.5" || out[2].Billed.String() != "7.5" {
		t.Fatalf("billed = %s, %s", out[1].Billed, out[2].Billed)
	}

	// Retransmits are duplicates; a reused operation id or seq is a conflict.
	other := s.rec(2, "13", nov)
	reusedSeq := s.rec(3, "20", nov)
	reusedSeq.OperationID = opID(s, 99)
	out = f.apply(s.rec(1, "10", nov), s.rec(3, "20", nov), other, reusedSeq)
	if got := kinds(out); got != "duplicate duplicate conflict(operation_id_reused) conflict(seq_reused)" {
		t.Fatalf("outcomes = %s", got)
	}
	if got := f.scalar(`SELECT trim_scale(sum(billed))::text FROM records`); got != "20" {
		t.Fatalf("billed total = %s, want 20", got)
	}
	if got := f.scalar(`SELECT trim_scale(sum(quantity))::text FROM rollups WHERE customer = 'acme' AND meter = 'api_calls'`); got != "20" {
		t.Fatalf("rollup total = %s, want 20", got)
	}
	if got := f.scalar(`SELECT count(*)::text FROM conflicts`); got != "2" {
		t.Fatalf("conflicts = %s, want 2", got)
	}
	// The same losing record again is the same conflict, not a new row.
	f.apply(other)
	if got := f.scalar(`SELECT count(*)::text FROM conflicts`); got != "2" {
		t.Fatalf("conflicts after repeat = %s, want 2", got)
	}
	if got := f.scalar(`SELECT payload->>'total' FROM conflicts WHERE reason = 'operation_id_reused'`); got != "13" {
		t.Fatalf("losing payload total = %s, want 13", got)
	}
}

func TestApplyRejections(t *testing.T) {
	f := newFixture(t)
	s := recBuilder{"gw-1", 1, "acme", "api_calls"}
	f.apply(s.rec(1, "10", nov))

	bad := s.rec(3, "1", nov)
	bad.Seq = 0
	out := f.apply(
		s.rec(2, "9", nov),                       // total went down without a new epoch
		s.rec(3, "11", f.now.Add(6*time.Minute)), // from the future
		s.rec(4, "11", f.now.Add(5*time.Minute)), // within the allowed skew
		bad,
	)
	if got := kinds(out); got != "rejected(total_decreased) rejected(future_timestamp) applied rejected(invalid_record)" {
		t.Fatalf("outcomes = %s", got)
	}
	for i, want := range []string{
		"total 9 at seq 2 is below 10 at seq 1: a counter reset needs a new epoch",
		"occurred_at 2026-11-20T12:06:00Z is more than 5m0s ahead of the ledger clock (2026-11-20T12:00:00Z)",
		"",
		"seq: 0 is not positive",
	} {
		if out[i].Detail != want {
			t.Errorf("detail[%d] = %q, want %q", i, out[i].Detail, want)
		}
	}
	// A new epoch starts from zero.
	e2 := recBuilder{"gw-1", 2, "acme", "api_calls"}
	if got := kinds(f.apply(e2.rec(1, "3", nov))); got != "applied" {
		t.Fatalf("new epoch: %s", got)
	}
	if got := f.scalar(`SELECT trim_scale(sum(quantity))::text FROM rollups`); got != "14" {
		t.Fatalf("rollup total = %s, want 14", got)
	}
}

func TestApplyGapsAndLateFills(t *testing.T) {
	f := newFixture(t)
	s := recBuilder{"gw-1", 1, "acme", "api_calls"}
	oct := time.Date(2026, 10, 31, 23, 0, 0, 0, time.UTC)

	// Seqs 2..4 are lost (for now): their usage is billed with seq 5, in November.
	out := f.apply(s.rec(1, "10", oct), s.recQ(5, "50", "10", nov))
	if got := kinds(out); got != "applied applied" || out[1].Billed.String() != "40" {
		t.Fatalf("outcomes = %s, billed %s", got, out[1].Billed)
	}
	if got := f.scalar(`SELECT format('%s-%s %s', from_seq, to_seq, upper_total - upper_quantity - lower_total) FROM gaps`); got != "2-4 30" {
		t.Fatalf("gap = %s", got)
	}

	// Seq 3 arrives late; it happened in October, so its 5 move to October.
	out = f.apply(s.recQ(3, "25", "5", oct))
	if got := kinds(out); got != "late_fill" {
		t.Fatalf("late fill outcome = %s", got)
	}
	if got := f.scalar(`SELECT string_agg(format('%s-%s', from_seq, to_seq), ',' ORDER BY from_seq) FROM gaps`); got != "2-2,4-4" {
		t.Fatalf("gaps after fill = %s", got)
	}
	if got := f.perPeriod(); got != "2026-10=15,2026-11=35" {
		t.Fatalf("per period = %s", got)
	}
	// A fill outside its neighbours' totals is a conflict; stream total unchanged.
	out = f.apply(s.rec(4, "51", nov), s.rec(2, "20", oct))
	if got := kinds(out); got != "conflict(late_fill_out_of_bounds) late_fill" {
		t.Fatalf("outcomes = %s", got)
	}
	if got := f.scalar(`SELECT string_agg(format('%s-%s', from_seq, to_seq), ',' ORDER BY from_seq) FROM gaps`); got != "4-4" {
		t.Fatalf("gaps = %s", got)
	}
	if got := f.scalar(`SELECT trim_scale(sum(quantity))::text FROM rollups`); got != "50" {
		t.Fatalf("rollups total = %s, want 50 (the stream's last total)", got)
	}
	if got := f.perPeriod(); got != "2026-10=25,2026-11=25" {
		t.Fatalf("per period = %s", got)
	}
	if got := f.scalar(`SELECT count(*)::text FROM findings`); got != "0" {
		t.Fatalf("findings = %s", got)
	}
	// Seq 2 said total 20, but seq 3 said it grew by 5 to 25: consistent. Had
	// it said 24, that would be a quantity mismatch finding on seq 3.
}

func TestApplyQuantityMismatchAndClosedPeriod(t *testing.T) {
	f := newFixture(t)
	s := recBuilder{"gw-1", 1, "acme", "api_calls"}
	oct := time.Date(2026, 10, 15, 0, 0, 0, 0, time.UTC)
	f.exec(`INSERT INTO customers (id, schedule) VALUES ('acme', '[{"effective_from":"0001-01-01T00:00:00Z","calendar":{"cadence":"monthly","anchor_day":1,"anchor_time":"00:00","zone":"UTC"}}]')`)
	f.exec(`INSERT INTO period_closes (customer, period_start, period_end, closed_at, statement, forced, reason, actor)
		VALUES ('acme', '2026-10-01T00:00:00Z', '2026-11-01T00:00:00Z', now(), '{}', true, 'test', 'test')`)

	out := f.apply(s.recQ(1, "10", "9", oct))
	if got := kinds(out); got != "applied" {
		t.Fatalf("outcomes = %s", got)
	}
	// October is closed: billed in the current period (November) as a prior-period adjustment.
	if got := f.scalar(`SELECT format('%s %s', to_char(period_start, 'YYYY-MM-DD'), to_char(prior_period, 'YYYY-MM-DD')) FROM records`); got != "2026-11-01 2026-10-01" {
		t.Fatalf("record period = %s", got)
	}
	if got := f.scalar(`SELECT format('%s %s', kind, amount) FROM findings`); got != "quantity_mismatch -1" {
		t.Fatalf("finding = %s", got)
	}
}

// Stored NUMERICs read back exactly (fractions included), and a gap opened
// before migration 00009 (unmoved NULL) moves the amount its neighbours
// imply.
func TestApplyLoadsStoredAmountsExactly(t *testing.T) {
	f := newFixture(t)
	s := recBuilder{"gw-1", 1, "acme", "api_calls"}
	oct := time.Date(2026, 10, 31, 23, 0, 0, 0, time.UTC)

	first, last := s.rec(1, "10.25", oct), s.recQ(5, "50.75", "10.5", nov)
	if got := kinds(f.apply(first, last)); got != "applied applied" {
		t.Fatalf("outcomes = %s", got)
	}
	f.exec(`UPDATE gaps SET unmoved = NULL`)

	// A retransmit is a duplicate only if total and quantity compare equal
	// to the stored ones; the next record's delta starts from the stored total.
	out := f.apply(last, s.rec(6, "51.0001", nov))
	if got := kinds(out); got != "duplicate applied" || out[1].Billed.String() != "0.2501" {
		t.Fatalf("outcomes = %s, billed %s", got, out[1].Billed)
	}
	// Seq 3 happened in October: its 5.125 move there out of the 30 the gap billed.
	if got := kinds(f.apply(s.recQ(3, "25.125", "5.125", oct))); got != "late_fill" {
		t.Fatalf("late fill outcome = %s", got)
	}
	if got := f.perPeriod(); got != "2026-10=15.375,2026-11=35.6251" {
		t.Fatalf("per period = %s", got)
	}
	if got := f.scalar(`SELECT string_agg(format('%s-%s:%s', from_seq, to_seq, trim_scale(unmoved)), ',' ORDER BY from_seq) FROM gaps`); got != "2-2:9.75,4-4:15.125" {
		t.Fatalf("gaps = %s", got)
	}
	if got := f.scalar(`SELECT count(*)::text FROM findings`); got != "0" {
		t.Fatalf("findings = %s", got)
	}
}

// Apply keeps occurred_at in whole microseconds, in UTC, as Postgres does,
// without changing the records it is given; a retransmit whose timestamp
// carries the nanoseconds the first one had is a duplicate of it.
func TestApplyStoresMicrosecondsAndLeavesTheCallersRecords(t *testing.T) {
	f := newFixture(t)
	s := recBuilder{"gw-1", 1, "acme", "api_calls"}
	at := time.Date(2026, 11, 10, 10, 30, 0, 123456789, time.FixedZone("UTC+1", 3600))
	recs := []ledger.Record{s.rec(1, "10", at), s.rec(2, "12", at.Add(time.Nanosecond))}
	sent := slices.Clone(recs)
	if got := kinds(f.apply(recs...)); got != "applied applied" {
		t.Fatalf("outcomes = %s", got)
	}
	if !slices.EqualFunc(recs, sent, func(a, b ledger.Record) bool { return a.OccurredAt == b.OccurredAt }) {
		t.Fatalf("Apply changed its caller's records: %v, want %v", recs[0].OccurredAt, sent[0].OccurredAt)
	}
	if got := f.scalar(`SELECT string_agg(to_char(occurred_at AT TIME ZONE 'UTC', 'HH24:MI:SS.US'), ' ' ORDER BY seq) FROM records`); got != "09:30:00.123456 09:30:00.123456" {
		t.Fatalf("occurred_at stored = %s", got)
	}
	if got := kinds(f.apply(recs...)); got != "duplicate duplicate" {
		t.Fatalf("retransmit: %s", got)
	}
	// Already in UTC and whole microseconds, as ingest gives them.
	utc := s.rec(3, "13", at.UTC().Truncate(time.Microsecond))
	if got := kinds(f.apply(utc, utc)); got != "applied duplicate" {
		t.Fatalf("normalised records: %s", got)
	}
}

// A late fill whose own quantity is unknown when it arrives (none sent,
// the seq before it unseen) stays billed in its gap's period; once the
// seq before it arrives, its own quantity is its total less that seq's,
// and it moves to the period it occurred in, as a fill whose quantity was
// known would have. Here seq 6 (November) reveals the gap 1..5, seq 2
// (October, no quantity) arrives, then seq 1 (October): October bills
// seq 1's 5 and seq 2's 1, whichever batches they come in.
func TestLateFillQuantityKnownLaterMoves(t *testing.T) {
	s := recBuilder{"gw-1", 1, "acme", "api_calls"}
	oct := time.Date(2026, 10, 26, 3, 0, 0, 0, time.UTC)
	six, two, one := s.recQ(6, "36", "3", nov), s.rec(2, "6", oct.Add(6*time.Hour)), s.recQ(1, "5", "5", oct)
	billedInBatches(t, "2026-10=6,2026-11=30", map[string][][]ledger.Record{
		"one batch each":   {{six}, {two}, {one}},
		"all in one batch": {{six, two, one}},
	})
}

// The same when other fills split the gap below such a fill first: the
// part of the gap just below it still ends at the fill, in whichever
// batches the records come. Seq 8 (November) reveals 1..7; seq 4 (October,
// no quantity) and seq 2 split it; seq 3 tells seq 4's own 3, and seq 1,
// 5, 6 and 7 never come.
func TestLateFillQuantityKnownLaterMovesAfterSplits(t *testing.T) {
	s := recBuilder{"gw-1", 1, "acme", "api_calls"}
	oct := time.Date(2026, 10, 26, 3, 0, 0, 0, time.UTC)
	eight, four := s.recQ(8, "100", "1", nov), s.rec(4, "20", oct.Add(4*time.Hour))
	two, three := s.recQ(2, "12", "2", oct.Add(2*time.Hour)), s.recQ(3, "17", "5", oct.Add(3*time.Hour))
	// October: seq 2's 2, seq 3's 5 and seq 4's 3.
	billedInBatches(t, "2026-10=10,2026-11=90", map[string][][]ledger.Record{
		"one batch each":   {{eight}, {four}, {two}, {three}},
		"all in one batch": {{eight, four, two, three}},
	})
}

// billedInBatches applies each way's batches to a ledger of its own and
// checks what each period bills (perPeriod) is want.
func billedInBatches(t *testing.T, want string, ways map[string][][]ledger.Record) {
	t.Helper()
	for name, batches := range ways {
		f := newFixture(t)
		for _, b := range batches {
			f.apply(b...)
		}
		if got := f.perPeriod(); got != want {
			t.Fatalf("%s: per period %s, want %s", name, got, want)
		}
	}
}
