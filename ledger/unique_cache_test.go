package ledger_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/prometheus/client_golang/prometheus"
	"pgregory.net/rapid"

	"github.com/tally-ledger/tally/ledger"
)

// A Ledger remembers the members it counted in a period, and checks what
// it remembers against unique_counts in every transaction. These tests
// change the period behind its back: another Ledger (another process)
// counts a member, and a transaction of its own rolls back after it
// counted one.

// twoWriters is a fixture with a unique meter "mau", and another
// process's Ledger on its database.
func twoWriters(t *testing.T) (*fixture, *ledger.Ledger) {
	f := newFixture(t)
	if err := f.declare("mau", ledger.Unique); err != nil {
		t.Fatal(err)
	}
	return f, secondLedger(t, f)
}

// secondLedger is another process's Ledger on f's database.
func secondLedger(t testing.TB, f *fixture) *ledger.Ledger {
	t.Helper()
	l, err := ledger.New(ledger.Config{Clock: func() time.Time { return f.now }})
	if err != nil {
		t.Fatal(err)
	}
	return l
}

// fataler is what applyWith needs of a test (testing.TB or *rapid.T).
type fataler interface {
	Helper()
	Fatal(args ...any)
	Fatalf(format string, args ...any)
}

// applyWith applies recs with l in one transaction, committed or rolled
// back.
func applyWith(t fataler, f *fixture, l *ledger.Ledger, commit bool, recs ...ledger.Record) []ledger.Outcome {
	t.Helper()
	ctx := context.Background()
	tx, err := f.pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = tx.Rollback(ctx) }()
	out, err := l.Apply(ctx, tx, recs)
	if err != nil {
		t.Fatalf("apply: %v", err)
	}
	if commit {
		if err := tx.Commit(ctx); err != nil {
			t.Fatal(err)
		}
	}
	return out
}

func (f *fixture) uniqueCounts() string {
	f.t.Helper()
	return f.scalar(`SELECT string_agg(per_day || ':' || members, ' ' ORDER BY per_day) FROM unique_counts`)
}

// TestMembersCountedElsewhereAreSeen: a member counted by another Ledger
// after this one last wrote the period is not counted again when this
// one sees it.
func TestMembersCountedElsewhereAreSeen(t *testing.T) {
	f, other := twoWriters(t)
	s1 := recBuilder{"gw-1", 1, "acme", "mau"}
	s2 := recBuilder{"gw-2", 1, "acme", "mau"}
	f.apply(s1.member(1, "bob", nov))
	applyWith(t, f, other, true, s2.member(1, "ann", nov.Add(time.Hour)))
	f.apply(s1.member(2, "ann", nov.Add(2*time.Hour)), s1.member(3, "bob", nov.Add(3*time.Hour)))
	if got := f.uniqueCounts(); got != "false:2 true:2" {
		t.Fatalf("counts (per_day:members) = %s, want bob and ann once in the period and the day", got)
	}
}

// TestRolledBackMembersAreForgotten: a Ledger counted ann in a
// transaction that rolled back, and another Ledger then counted carl, so
// the period holds as many members as the first Ledger's rolled-back
// transaction left it believing. Ann, seen again, is counted.
func TestRolledBackMembersAreForgotten(t *testing.T) {
	f, other := twoWriters(t)
	s1 := recBuilder{"gw-1", 1, "acme", "mau"}
	s2 := recBuilder{"gw-2", 1, "acme", "mau"}
	f.apply(s1.member(1, "bob", nov))
	if out := applyWith(t, f, f.l, false, s1.member(2, "ann", nov.Add(time.Hour))); kinds(out) != "applied" {
		t.Fatalf("rolled back: %s", kinds(out))
	}
	applyWith(t, f, other, true, s2.member(1, "carl", nov.Add(time.Hour)))
	if out := f.apply(s1.member(2, "ann", nov.Add(2*time.Hour))); kinds(out) != "applied" {
		t.Fatalf("again: %s", kinds(out))
	}
	if got := f.uniqueCounts(); got != "false:3 true:3" {
		t.Fatalf("counts (per_day:members) = %s, want bob, carl and ann", got)
	}
	if got := f.scalar(`SELECT count(*) FILTER (WHERE counted)::text FROM unique_readings`); got != "3" {
		t.Fatalf("counted readings = %s, want 3", got)
	}
}

// TestPropertyUniqueCountsManyWriters is TestPropertyUniqueCounts with
// every micro-batch applied by one of five Ledgers (with the default room
// for member days, room for a few, or none; indexing periods from their
// first reading, after a few or after the default), and some
// micro-batches applied once in a transaction that rolls back before they
// are applied for good.
func TestPropertyUniqueCountsManyWriters(t *testing.T) {
	f := newFixture(t)
	if err := f.declare("mau", ledger.Unique); err != nil {
		t.Fatal(err)
	}
	var ls []*ledger.Ledger
	for _, c := range []struct{ days, indexAfter int }{{0, 0}, {5, 8}, {-1, 12}, {0, -1}, {-1, -1}} {
		l, err := ledger.New(ledger.Config{Clock: func() time.Time { return f.now }, UniqueMemberDays: c.days, UniqueIndexAfter: c.indexAfter})
		if err != nil {
			t.Fatal(err)
		}
		ls = append(ls, l)
	}
	iteration := 0
	rapid.Check(t, func(rt *rapid.T) {
		iteration++
		f.applyBatch = func(recs []ledger.Record) []ledger.Outcome {
			l := rapid.SampledFrom(ls).Draw(rt, "ledger")
			if rapid.IntRange(0, 3).Draw(rt, "rollback") == 0 {
				applyWith(rt, f, rapid.SampledFrom(ls).Draw(rt, "rolled back by"), false, recs...)
			}
			return applyWith(rt, f, l, true, recs...)
		}
		defer func() { f.applyBatch = nil }()
		checkUniqueSchedule(rt, f, fmt.Sprintf("w%d", iteration))
	})
}

// TestConcurrentWritersOfOnePeriod: two Ledgers count members of one
// period at once, each on its own streams, in many small transactions;
// the counts are the distinct members.
func TestConcurrentWritersOfOnePeriod(t *testing.T) {
	f := newFixture(t)
	if err := f.declare("mau", ledger.Unique); err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	ls := []*ledger.Ledger{f.l, secondLedger(t, f)}
	errs := make(chan error, len(ls))
	for w, l := range ls {
		go func() {
			b := recBuilder{fmt.Sprintf("gw-%d", w), 1, "acme", "mau"}
			for seq := int64(1); seq <= 60; seq++ {
				m := seq % 40 // the writers go over the members in opposite orders
				if w == 1 {
					m = 39 - m
				}
				r := b.member(seq, fmt.Sprintf("user-%d", m), nov.Add(time.Duration(seq)*time.Minute))
				if err := pgx.BeginFunc(ctx, f.pool, func(tx pgx.Tx) error {
					_, err := l.Apply(ctx, tx, []ledger.Record{r})
					return err
				}); err != nil {
					errs <- err
					return
				}
			}
			errs <- nil
		}()
	}
	for range ls {
		if err := <-errs; err != nil {
			t.Fatal(err)
		}
	}
	want := f.scalar(`SELECT count(DISTINCT member)::text FROM unique_readings`)
	if got := f.uniqueCounts(); got != "false:"+want+" true:"+want {
		t.Fatalf("counts (per_day:members) = %s, want %s distinct members in the period and the day", got, want)
	}
}

// TestUniqueMetricsSayHowMembersWereFound: a period is remembered from its
// first member on, read whole once another Ledger wrote it, and looked up
// member by member by a Ledger that remembers nothing.
func TestUniqueMetricsSayHowMembersWereFound(t *testing.T) {
	f, other := twoWriters(t)
	reg := prometheus.NewRegistry()
	l, err := ledger.New(ledger.Config{Clock: func() time.Time { return f.now }, Registerer: reg})
	if err != nil {
		t.Fatal(err)
	}
	none, err := ledger.New(ledger.Config{Clock: func() time.Time { return f.now }, UniqueMemberDays: -1})
	if err != nil {
		t.Fatal(err)
	}
	s1 := recBuilder{"gw-1", 1, "acme", "mau"}
	s2 := recBuilder{"gw-2", 1, "acme", "mau"}
	s3 := recBuilder{"gw-3", 1, "acme", "mau"}
	applyWith(t, f, l, true, s1.member(1, "bob", nov))
	applyWith(t, f, l, true, s1.member(2, "ann", nov.Add(time.Hour)))
	applyWith(t, f, other, true, s2.member(1, "carl", nov.Add(time.Hour)))
	applyWith(t, f, l, true, s1.member(3, "carl", nov.Add(2*time.Hour)))
	applyWith(t, f, none, true, s3.member(1, "dan", nov.Add(3*time.Hour)))
	got := uniqueMetrics(t, reg)
	if got["member days"] != 3 {
		t.Errorf("member days remembered = %v, want bob, ann and carl's", got["member days"])
	}
	if got["remembered"] != 2 || got["read"] != 1 || got["looked_up"] != 0 {
		t.Errorf("periods by how = %v, want 2 remembered, 1 read (after the other Ledger wrote), none looked up", got)
	}
	if f.uniqueCounts() != "false:4 true:4" {
		t.Errorf("counts (per_day:members) = %s, want bob, ann, carl and dan", f.uniqueCounts())
	}
}

// TestPeriodTooLargeToRememberIsLookedUp: an indexed period another
// Ledger wrote, with more member days than half this Ledger's bound, is
// not read whole: its members are looked up one by one, and counted once.
func TestPeriodTooLargeToRememberIsLookedUp(t *testing.T) {
	f, _ := twoWriters(t)
	reg := prometheus.NewRegistry()
	l, err := ledger.New(ledger.Config{Clock: func() time.Time { return f.now }, UniqueMemberDays: 4, UniqueIndexAfter: -1, Registerer: reg})
	if err != nil {
		t.Fatal(err)
	}
	other, err := ledger.New(ledger.Config{Clock: func() time.Time { return f.now }, UniqueIndexAfter: -1})
	if err != nil {
		t.Fatal(err)
	}
	s1 := recBuilder{"gw-1", 1, "acme", "mau"}
	s2 := recBuilder{"gw-2", 1, "acme", "mau"}
	applyWith(t, f, other, true, s2.member(1, "bob", nov), s2.member(2, "ann", nov), s2.member(3, "ann", nov.Add(24*time.Hour)))
	applyWith(t, f, l, true, s1.member(1, "ann", nov.Add(25*time.Hour)), s1.member(2, "carl", nov.Add(25*time.Hour)))
	got := uniqueMetrics(t, reg)
	if got["looked_up"] != 1 || got["read"] != 0 {
		t.Errorf("periods by how = %v, want the period of 3 member days looked up (bound 4)", got)
	}
	if want := "false:3 true:2 true:2"; f.uniqueCounts() != want {
		t.Errorf("counts (per_day:members) = %s, want %s", f.uniqueCounts(), want)
	}
}

// uniqueMetrics gathers the ledger's unique metrics from reg: the periods
// by how ("remembered", "read", "looked_up"), "member days" and the
// periods "indexed".
func uniqueMetrics(t *testing.T, reg *prometheus.Registry) map[string]float64 {
	t.Helper()
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	got := map[string]float64{}
	for _, mf := range mfs {
		for _, m := range mf.GetMetric() {
			switch mf.GetName() {
			case "tally_ledger_unique_periods_total":
				got[m.GetLabel()[0].GetValue()] = m.GetCounter().GetValue()
			case "tally_ledger_unique_member_days":
				got["member days"] = m.GetGauge().GetValue()
			case "tally_ledger_unique_periods_indexed_total":
				got["indexed"] = m.GetCounter().GetValue()
			}
		}
	}
	return got
}

// TestPeriodIndexedOnceLarge: a period of fewer readings than
// Config.UniqueIndexAfter keeps no member index entries, and a Ledger
// that remembers nothing reads it whole through its streams; the batch
// that takes it to the bound indexes its counted readings, once, and from
// then on a Ledger that remembers nothing looks its members up in the
// index. Every member and member day counts once throughout.
func TestPeriodIndexedOnceLarge(t *testing.T) {
	f, _ := twoWriters(t)
	reg := prometheus.NewRegistry()
	none, err := ledger.New(ledger.Config{Clock: func() time.Time { return f.now }, UniqueMemberDays: -1, UniqueIndexAfter: 5, Registerer: reg})
	if err != nil {
		t.Fatal(err)
	}
	regL := prometheus.NewRegistry()
	l, err := ledger.New(ledger.Config{Clock: func() time.Time { return f.now }, UniqueIndexAfter: 5, Registerer: regL})
	if err != nil {
		t.Fatal(err)
	}
	s1 := recBuilder{"gw-1", 1, "acme", "mau"}
	s2 := recBuilder{"gw-2", 1, "acme", "mau"}
	state := func() string {
		t.Helper()
		return f.scalar(`SELECT (SELECT string_agg(DISTINCT indexed::text, ',') FROM unique_counts) || ' / ' ||
			(SELECT count(*) FILTER (WHERE counted AND indexed) || ' of ' || count(*) FILTER (WHERE counted) FROM unique_readings)`)
	}
	applyWith(t, f, l, true, s1.member(1, "ann", nov), s1.member(2, "bob", nov), s1.member(3, "ann", nov.Add(time.Hour)))
	if got, want := state(), "false / 0 of 2"; got != want {
		t.Fatalf("after 3 readings (period indexed / counted readings indexed): %s, want %s", got, want)
	}
	// Read whole through its streams: ann again, carl new.
	applyWith(t, f, none, true, s2.member(1, "ann", nov.Add(2*time.Hour)))
	if got := uniqueMetrics(t, reg); got["read"] != 1 || got["looked_up"] != 0 {
		t.Errorf("periods by how = %v, want the period read whole", got)
	}
	if got, want := state(), "false / 0 of 2"; got != want {
		t.Fatalf("after 4 readings: %s, want %s", got, want)
	}
	// The fifth reading indexes the period: bob again, carl new.
	applyWith(t, f, l, true, s1.member(4, "bob", nov.Add(24*time.Hour)), s1.member(5, "carl", nov.Add(2*time.Hour)))
	if got, want := state(), "true / 4 of 4"; got != want {
		t.Fatalf("after 6 readings: %s, want %s", got, want)
	}
	if got := uniqueMetrics(t, regL)["indexed"]; got != 1 {
		t.Errorf("periods indexed = %v, want 1", got)
	}
	// Looked up in the index from now on: dan new, ann and bob again.
	applyWith(t, f, none, true, s2.member(2, "dan", nov.Add(25*time.Hour)), s2.member(3, "ann", nov.Add(26*time.Hour)),
		s2.member(4, "bob", nov.Add(27*time.Hour)))
	if got := uniqueMetrics(t, reg); got["read"] != 1 || got["looked_up"] != 1 || got["indexed"] != 0 {
		t.Errorf("periods by how = %v, want the period read once, then looked up (and indexed by the other Ledger)", got)
	}
	if got, want := state(), "true / 6 of 6"; got != want {
		t.Fatalf("after 9 readings: %s, want %s", got, want)
	}
	if want := "false:4 true:3 true:3"; f.uniqueCounts() != want {
		t.Errorf("counts (per_day:members) = %s, want %s", f.uniqueCounts(), want)
	}
	// The next period of a customer whose period reached the bound is
	// indexed from its first reading; the one after a small period is not.
	f.now = nov.AddDate(0, 2, 1)
	applyWith(t, f, l, true, s1.member(6, "erin", nov.AddDate(0, 1, 0)))
	if got, want := state(), "true / 7 of 7"; got != want {
		t.Fatalf("after December's first reading: %s, want %s", got, want)
	}
	applyWith(t, f, l, true, s1.member(7, "erin", nov.AddDate(0, 2, 0)))
	if got, want := state(), "false,true / 7 of 8"; got != want {
		t.Fatalf("after January's first reading: %s, want %s", got, want)
	}
	if got := uniqueMetrics(t, regL)["indexed"]; got != 1 {
		t.Errorf("periods indexed = %v, want 1 (December was indexed from the start)", got)
	}
}
