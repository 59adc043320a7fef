package reconcile_test

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/shopspring/decimal"
	"pgregory.net/rapid"

	"github.com/tally-ledger/tally/amount"
	"github.com/tally-ledger/tally/ledger"
	"github.com/tally-ledger/tally/periods"
	"github.com/tally-ledger/tally/reconcile"
)

const monthlyUTC = `[{"effective_from":"0001-01-01T00:00:00Z","calendar":{"cadence":"monthly","anchor_day":1,"anchor_time":"00:00","zone":"UTC"}}]`

// stream plans one customer's stream for the property tests: seq i has
// total sum(q[1..i]); seqs are sent in any order, some never.
type stream struct {
	customer string
	totals   []string // index seq-1
	sent     map[int64]bool
}

func newStream(rt *rapid.T, customer string) *stream {
	s := &stream{customer: customer, sent: map[int64]bool{}}
	total := 0
	for range rapid.IntRange(1, 6).Draw(rt, "seqs") {
		total += rapid.IntRange(0, 50).Draw(rt, "q")
		s.totals = append(s.totals, fmt.Sprint(total))
	}
	return s
}

// next draws a seq not sent yet (a new one or a late fill), or 0.
func (s *stream) next(rt *rapid.T) int64 {
	var free []int64
	for i := range s.totals {
		if !s.sent[int64(i+1)] {
			free = append(free, int64(i+1))
		}
	}
	if len(free) == 0 {
		return 0
	}
	return rapid.SampledFrom(free).Draw(rt, "seq")
}

func (s *stream) record(seq int64, at time.Time) ledger.Record {
	prev := "0"
	if seq > 1 {
		prev = s.totals[seq-2]
	}
	q := amount.MustParse(s.totals[seq-1]).Sub(amount.MustParse(prev))
	r := rec("gw", 1, s.customer, seq, s.totals[seq-1], "", at)
	if s.sent[seq-1] || seq == 1 {
		r.Quantity.Decimal, r.Quantity.Valid = q, true
	}
	return r
}

func (s *stream) anySent(rt *rapid.T) int64 {
	var sent []int64
	for seq := range s.sent {
		sent = append(sent, seq)
	}
	if len(sent) == 0 {
		return 0
	}
	slicesSort(sent)
	return rapid.SampledFrom(sent).Draw(rt, "sent")
}

func slicesSort(s []int64) {
	for i := 1; i < len(s); i++ {
		for j := i; j > 0 && s[j] < s[j-1]; j-- {
			s[j], s[j-1] = s[j-1], s[j]
		}
	}
}

func (e *env) deadLetter(key string) uuid.UUID {
	id := uuid.Must(uuid.NewV7())
	e.exec(`INSERT INTO dead_letters (id, topic, partition, "offset", reason, detail, key, raw, created_at)
		VALUES ($1, 'tally.meter-batches', 0, 1, 'schema', 'refused', $2, '{}', $3)`, id, []byte(key), e.now)
	return id
}

func (e *env) accept(kind string, id uuid.UUID) {
	e.t.Helper()
	if err := reconcile.Accept(context.Background(), e.pool, reconcile.Acceptance{Kind: kind, ID: id, Actor: "test", Reason: "property test"}); err != nil {
		e.t.Fatal(err)
	}
}

// TestPropertyCloseGate: random interleavings of usage (gaps and late
// fills included), conflicts, dead letters (of the customer and of one the
// ledger never saw), acceptances, runs and closes of an October that
// awaits its close. A close succeeds exactly when the newest run was clean,
// no usage or conflict came since and no dead letter is pending; a closed statement equals what a fresh run
// at close time finds, and that run is clean.
func TestPropertyCloseGate(t *testing.T) {
	e := newEnv(t)
	e.now = time.Date(2026, 11, 5, 0, 0, 0, 0, time.UTC) // October's grace is over
	oct := time.Date(2026, 10, 10, 0, 0, 0, 0, time.UTC)
	n, closes := 0, 0
	rapid.Check(t, func(rt *rapid.T) {
		n++
		c := fmt.Sprintf("g%d", n)
		e.exec(`INSERT INTO customers (id, schedule) VALUES ($1, $2)`, c, monthlyUTC)
		s := newStream(rt, c)
		conflicts := 0
		var pending []uuid.UUID
		var unowned []uuid.UUID
		ranClean, fresh, closed := false, false, false
		var frozen periods.Statement
		defer func() {
			for _, id := range unowned {
				e.accept(reconcile.AcceptDeadLetter, id)
			}
		}()
		for range rapid.IntRange(1, 14).Draw(rt, "steps") {
			switch op := rapid.SampledFrom([]string{"usage", "usage", "conflict", "dead letter", "unowned dead letter", "accept", "run", "run", "close", "close"}).Draw(rt, "op"); op {
			case "usage":
				seq := s.next(rt)
				if seq == 0 {
					continue
				}
				if o := e.apply(s.record(seq, oct)); o[0].Kind != ledger.Applied && o[0].Kind != ledger.LateFill {
					rt.Fatalf("usage seq %d came out %v: %s", seq, o[0].Kind, o[0].Detail)
				}
				s.sent[seq] = true
			case "conflict":
				seq := s.anySent(rt)
				if seq == 0 {
					continue
				}
				r := s.record(seq, oct)
				r.OperationID = uuid.New()
				r.Total = r.Total.Add(amount.MustParse("1"))
				r.Quantity.Valid = false
				// The seq is recorded (usage above checks it was applied),
				// so another total for it can only lose.
				if o := e.apply(r); o[0].Kind != ledger.Conflict {
					rt.Fatalf("a second total for seq %d came out %v, not a conflict: %s", seq, o[0].Kind, o[0].Detail)
				}
				conflicts++
			// Dead letters are judged by what is pending at close: one that
			// arrived after a clean run and was accepted before the close
			// leaves nothing the run checked changed (a fresh run is clean).
			case "dead letter":
				pending = append(pending, e.deadLetter(c))
				continue
			case "unowned dead letter":
				id := e.deadLetter("never-seen-" + c)
				pending, unowned = append(pending, id), append(unowned, id)
				continue
			case "accept":
				if len(pending) == 0 {
					continue
				}
				e.accept(reconcile.AcceptDeadLetter, pending[0])
				pending = pending[1:]
				continue
			case "run":
				r := e.run(reconcile.Options{Period: "2026-10-01", Customer: c})
				ranClean, fresh = conflicts == 0 && len(pending) == 0, true
				if got := r.Status == reconcile.StatusClean; got != ranClean {
					rt.Fatalf("run %s with %d conflicts and %d pending dead letters: %+v", r.Status, conflicts, len(pending), r.Findings)
				}
				continue
			case "close":
				st, err := e.close(c, "2026-10-01")
				if closed {
					if err != nil || billedLines(st) != billedLines(frozen) {
						rt.Fatalf("closing again: %v, %s then %s", err, billedLines(frozen), billedLines(st))
					}
					continue
				}
				if want := fresh && ranClean && len(pending) == 0; want != (err == nil) {
					rt.Fatalf("close: %v; want success %v (clean run %v, no usage or conflict since %v, %d dead letters pending)",
						err, want, ranClean, fresh, len(pending))
				}
				if err != nil {
					if !errors.Is(err, periods.ErrNotReconciled) {
						rt.Fatalf("close refused with %v", err)
					}
					continue
				}
				closed, frozen = true, st
				closes++
				r := e.run(reconcile.Options{Period: "2026-10-01", Customer: c})
				got := ""
				for _, tot := range r.Totals {
					if !tot.Billed.IsZero() {
						got += tot.Meter + "=" + tot.Billed.String() + " "
					}
				}
				if r.Status != reconcile.StatusClean || got != billedLines(st) {
					rt.Fatalf("a fresh run at close time: %s %q; the statement says %q", r.Status, got, billedLines(st))
				}
				continue
			}
			fresh = false
		}
	})
	if closes == 0 {
		t.Fatal("no close ever succeeded: the property was never exercised")
	}
}

func billedLines(st periods.Statement) string {
	s := ""
	for _, l := range st.Lines {
		if !l.Billed.IsZero() {
			s += l.Meter + "=" + l.Billed.String() + " "
		}
	}
	return s
}

// loss is something injected that may hide usage.
type loss struct {
	kind     string // dead letter, unowned dead letter, tampered stream, offset jump
	id       uuid.UUID
	customer string // "" for losses that may touch anyone
}

func (l loss) reportedBy(r *reconcile.Run) bool {
	for _, f := range r.Findings {
		if f.Severity != reconcile.Discrepancy {
			continue
		}
		switch l.kind {
		case "tampered stream":
			if f.Kind == reconcile.KindStreamMismatch && f.Customer == l.customer {
				return true
			}
		default:
			if strings.Contains(f.Detail, l.id.String()) {
				return true
			}
		}
	}
	return false
}

// TestPropertyEveryLossReportedOrCloseRefused: losses (a dead letter of a
// customer, a dead letter of a customer the ledger never saw, a tampered
// stream, messages deleted by retention before ingest read them) injected
// at random moments among usage, runs and closes of two customers. Every
// close that stands rests on a run that reported every loss that could
// touch the customer and was injected before the close.
func TestPropertyEveryLossReportedOrCloseRefused(t *testing.T) {
	e := newEnv(t)
	e.now = time.Date(2026, 11, 5, 0, 0, 0, 0, time.UTC)
	oct := time.Date(2026, 10, 10, 0, 0, 0, 0, time.UTC)
	n, closes := 0, 0
	rapid.Check(t, func(rt *rapid.T) {
		n++
		var streams []*stream
		for i := range 2 {
			c := fmt.Sprintf("l%d-%d", n, i)
			e.exec(`INSERT INTO customers (id, schedule) VALUES ($1, $2)`, c, monthlyUTC)
			streams = append(streams, newStream(rt, c))
		}
		var losses []loss
		closedAt := map[string]int{} // customer -> how many losses had been injected at its close
		defer func() {
			for _, l := range losses {
				switch l.kind {
				case "unowned dead letter":
					e.accept(reconcile.AcceptDeadLetter, l.id)
				case "offset jump":
					e.accept(reconcile.AcceptOffsetJump, l.id)
				}
			}
		}()
		for range rapid.IntRange(1, 14).Draw(rt, "steps") {
			s := rapid.SampledFrom(streams).Draw(rt, "customer")
			switch op := rapid.SampledFrom([]string{"usage", "usage", "dead letter", "unowned dead letter", "tampered stream", "offset jump",
				"run and close", "run", "close"}).Draw(rt, "op"); op {
			case "usage":
				if seq := s.next(rt); seq != 0 {
					e.apply(s.record(seq, oct))
					s.sent[seq] = true
				}
			case "dead letter":
				losses = append(losses, loss{kind: op, id: e.deadLetter(s.customer), customer: s.customer})
			case "unowned dead letter":
				losses = append(losses, loss{kind: op, id: e.deadLetter("never-seen-" + s.customer)})
			case "tampered stream":
				if len(s.sent) > 0 {
					e.exec(`UPDATE streams SET last_total = last_total + 1 WHERE customer = $1`, s.customer)
					losses = append(losses, loss{kind: op, customer: s.customer})
				}
			case "offset jump":
				id := uuid.Must(uuid.NewV7())
				e.exec(`INSERT INTO ingest_offset_jumps (id, topic, partition, from_offset, to_offset, detected_at, detail)
					VALUES ($1, 'tally.meter-batches', 0, 10, 20, $2, 'deleted unread')`, id, e.now)
				losses = append(losses, loss{kind: op, id: id})
			case "run and close":
				r := e.run(reconcile.Options{Period: "2026-10-01", Customer: s.customer, Close: true})
				if len(r.Closed) > 0 {
					if _, ok := closedAt[s.customer]; !ok {
						closedAt[s.customer] = len(losses)
					}
				}
			case "run":
				e.run(reconcile.Options{Period: "2026-10-01", Customer: s.customer})
			case "close":
				if _, err := e.close(s.customer, "2026-10-01"); err == nil {
					if _, ok := closedAt[s.customer]; !ok {
						closedAt[s.customer] = len(losses)
					}
				} else if !errors.Is(err, periods.ErrNotReconciled) {
					rt.Fatalf("close: %v", err)
				}
			}
		}
		for c, before := range closedAt {
			closes++
			st, err := periods.Store{Clock: func() time.Time { return e.now }}.Statement(context.Background(), e.pool, c, "2026-10-01")
			if err != nil || st.ReconciliationID == nil {
				rt.Fatalf("statement of %s: %v %+v", c, err, st)
			}
			r, err := reconcile.Get(context.Background(), e.pool, *st.ReconciliationID)
			if err != nil {
				rt.Fatal(err)
			}
			for _, l := range losses[:before] {
				if (l.customer == "" || l.customer == c) && !l.reportedBy(r) {
					rt.Fatalf("%s of %s closed on run %s, which does not report the %s %s injected before: %+v", c, st.Period, r.ID, l.kind, l.id, r.Findings)
				}
			}
		}
	})
	if closes == 0 {
		t.Fatal("no close ever succeeded: the property was never exercised")
	}
}

// TestPropertyDeepAgreesWithTheLedger: one stream's records occur across
// October and November (in seq order), and are sent in any order (gaps
// and late fills included, some seqs never, some twice, some under another
// record's operation id; a late fill's own quantity sent or not) and
// applied in batches of any size, with October closed at some point. Kafka holds everything sent; the deep
// check of either period finds no mismatch: the ledger bills each unit
// in the period Kafka's totals place it in, or says why not.
func TestPropertyDeepAgreesWithTheLedger(t *testing.T) {
	e := newEnv(t)
	e.now = time.Date(2026, 11, 20, 0, 0, 0, 0, time.UTC)
	start := time.Date(2026, 10, 25, 0, 0, 0, 0, time.UTC)
	n := 0
	rapid.Check(t, func(rt *rapid.T) {
		n++
		c := fmt.Sprintf("d%d", n)
		e.exec(`INSERT INTO customers (id, schedule) VALUES ($1, $2)`, c, monthlyUTC)
		s := newStream(rt, c)
		// Seq i occurs 0 to 3 days after seq i-1: the stream crosses into
		// November somewhere, or not at all.
		at := make([]time.Time, len(s.totals))
		t0 := start
		for i := range at {
			t0 = t0.Add(time.Duration(rapid.IntRange(0, 72).Draw(rt, "hours")) * time.Hour)
			at[i] = t0
		}
		// What is sent goes to Kafka at once and to the ledger in batches
		// (ingest's micro-batches), each outcome checked as it comes.
		src := &records{}
		var pending []ledger.Record
		var want []func(ledger.Outcome) bool
		send := func(r ledger.Record, ok func(ledger.Outcome) bool) {
			src.add(r)
			pending, want = append(pending, r), append(want, ok)
		}
		flush := func() {
			if len(pending) == 0 {
				return
			}
			for i, o := range e.apply(pending...) {
				if !want[i](o) {
					rt.Fatalf("seq %d (batch of %d) came out %v: %s", pending[i].Seq, len(pending), o.Kind, o.Detail)
				}
			}
			pending, want = nil, nil
		}
		var sent []ledger.Record
		closed := false
		for range rapid.IntRange(1, 12).Draw(rt, "steps") {
			switch op := rapid.SampledFrom([]string{"usage", "usage", "usage", "again", "reused", "close", "flush", "flush"}).Draw(rt, "op"); op {
			case "flush":
				flush()
			case "usage":
				seq := s.next(rt)
				if seq == 0 {
					continue
				}
				r := s.record(seq, at[seq-1])
				if !r.Quantity.Valid && rapid.Bool().Draw(rt, "quantity") {
					// Its own quantity sent (as the producer SDK does),
					// though the seq before it is not: a gap below it.
					r.Quantity = decimal.NewNullDecimal(r.Total.Sub(amount.MustParse(s.totals[seq-2])))
				}
				send(r, func(o ledger.Outcome) bool { return o.Kind == ledger.Applied || o.Kind == ledger.LateFill })
				s.sent[seq] = true
				sent = append(sent, r)
			case "again":
				if len(sent) == 0 {
					continue
				}
				send(rapid.SampledFrom(sent).Draw(rt, "again"), func(o ledger.Outcome) bool { return o.Kind == ledger.Duplicate })
			case "reused":
				// A free seq under an operation id already taken: a
				// conflict, never applied (the seq stays free).
				seq := s.next(rt)
				if seq == 0 || len(sent) == 0 {
					continue
				}
				r := s.record(seq, at[seq-1])
				r.OperationID = rapid.SampledFrom(sent).Draw(rt, "taken").OperationID
				send(r, func(o ledger.Outcome) bool { return o.Kind == ledger.Conflict })
			case "close":
				flush() // a period closes between ingest's transactions
				if !closed {
					e.exec(`INSERT INTO period_closes (customer, period_start, period_end, closed_at, statement, forced, reason, actor)
						VALUES ($1, '2026-10-01T00:00:00Z', '2026-11-01T00:00:00Z', now(), '{}', true, 'property test', 'test')`, c)
					closed = true
				}
			}
		}
		flush()
		rc, err := reconcile.New(reconcile.Config{Pool: e.pool, Clock: func() time.Time { return e.now }, Deep: src})
		if err != nil {
			rt.Fatal(err)
		}
		for _, period := range []string{"2026-10-01", "2026-11-01"} {
			r, err := rc.Run(context.Background(), reconcile.Options{Period: period, Customer: c, Deep: true})
			if err != nil {
				rt.Fatal(err)
			}
			for _, f := range r.Findings {
				if f.Kind == reconcile.KindDeepMismatch {
					rt.Fatalf("%s: %s: %s", period, f.Stream, f.Detail)
				}
			}
		}
	})
}
