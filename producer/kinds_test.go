package producer_test

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/tally-ledger/tally/producer"
)

// Levels and members travel like totals: durable first, one seq per
// record, idempotent by key; Close ends a gauge's level at 0 and repeats a
// unique stream's last member.
func TestRecordLevelAndMember(t *testing.T) {
	c := newCluster(t, 1)
	p := newProducer(t, producer.Config{Brokers: c.Addrs, Dir: t.TempDir()})
	ctx := context.Background()
	at := time.Date(2026, 12, 2, 9, 0, 0, 0, time.UTC)
	for _, err := range []error{
		p.RecordLevel(ctx, "acme", "seats", d("12"), at),
		p.RecordLevel(ctx, "acme", "seats", d("14"), at.Add(time.Minute), producer.Key("sync-2")),
		p.RecordLevel(ctx, "acme", "seats", d("14"), at.Add(time.Minute), producer.Key("sync-2")), // a retry: nothing new
		p.RecordMember(ctx, "acme", "mau", "user-7", at),
		p.RecordMember(ctx, "acme", "mau", "user-9", at.Add(time.Second)),
	} {
		if err != nil {
			t.Fatal(err)
		}
	}
	var reused *producer.KeyReusedError
	if err := p.RecordLevel(ctx, "acme", "seats", d("15"), at, producer.Key("sync-2")); !errors.As(err, &reused) {
		t.Fatalf("a key reused for another level: %v", err)
	}
	if err := p.RecordMember(ctx, "acme", "mau", "", at); err == nil || !strings.Contains(err.Error(), "member") {
		t.Fatalf("an empty member: %v", err)
	}
	if err := p.RecordLevel(ctx, "acme", "seats", d("-1"), at); err == nil {
		t.Fatal("a negative level was accepted")
	}
	if err := p.Close(ctx); err != nil {
		t.Fatal(err)
	}
	var got []string
	for _, b := range readBatches(t, c, 1) {
		for _, r := range b.Records {
			got = append(got, fmt.Sprintf("%s %d %s %v %s final=%v", r.Meter, r.Seq, r.Shape(), r.Level.Decimal, r.Member, r.Final))
		}
	}
	want := []string{"seats 1 gauge 12  final=false", "seats 2 gauge 14  final=false", "mau 1 unique 0 user-7 final=false",
		"mau 2 unique 0 user-9 final=false"}
	finals := map[string]bool{"mau 3 unique 0 user-9 final=true": true, "seats 3 gauge 0  final=true": true}
	if len(got) != len(want)+len(finals) {
		t.Fatalf("records\n%s", strings.Join(got, "\n"))
	}
	for i, w := range want {
		if got[i] != w {
			t.Errorf("record %d: %q, want %q", i, got[i], w)
		}
	}
	for _, g := range got[len(want):] {
		if !finals[g] {
			t.Errorf("final record %q", g)
		}
	}
}

// A unique stream's final record repeats its last member at the time that
// member was recorded: Close, days or a period later, must not make the
// member active again then (the ledger would count it in Close's day and
// period, where it was never seen).
func TestCloseDoesNotSightTheLastMemberAgain(t *testing.T) {
	c := newCluster(t, 1)
	p := newProducer(t, producer.Config{Brokers: c.Addrs, Dir: t.TempDir()})
	ctx := context.Background()
	seen := time.Now().UTC().Add(-40 * 24 * time.Hour).Truncate(time.Microsecond)
	if err := p.RecordMember(ctx, "acme", "mau", "user-7", seen); err != nil {
		t.Fatal(err)
	}
	if err := p.Close(ctx); err != nil {
		t.Fatal(err)
	}
	var finals int
	for _, b := range readBatches(t, c, 1) {
		for _, r := range b.Records {
			if !r.Final {
				continue
			}
			finals++
			if r.Member != "user-7" || !r.OccurredAt.Equal(seen) {
				t.Errorf("the final record sights %q at %s; user-7 was last seen at %s", r.Member, r.OccurredAt.Format(time.RFC3339Nano), seen.Format(time.RFC3339Nano))
			}
		}
	}
	if finals != 1 {
		t.Fatalf("%d final records, want 1", finals)
	}
}

// A gauge's readings are in time order by seq (docs/design.md §16): the
// ledger refuses one stamped before the reading before it as a conflict.
// RecordLevel, which gives the seqs, refuses such a level rather than
// return nil for a reading that would never count; and Close ends a level
// stamped ahead of the clock at that level's time, not before it.
func TestRecordLevelKeepsReadingsInTimeOrder(t *testing.T) {
	c := newCluster(t, 1)
	p := newProducer(t, producer.Config{Brokers: c.Addrs, Dir: t.TempDir()})
	ctx := context.Background()
	at := time.Now().UTC().Truncate(time.Microsecond)
	if err := p.RecordLevel(ctx, "acme", "seats", d("3"), at.Add(-time.Hour)); err != nil {
		t.Fatal(err)
	}
	if err := p.RecordLevel(ctx, "acme", "seats", d("5"), at.Add(-2*time.Hour)); err == nil || !strings.Contains(err.Error(), "before") {
		t.Fatalf("a level stamped before the stream's last reading: %v", err)
	}
	if err := p.RecordLevel(ctx, "acme", "seats", d("4"), at.Add(-time.Hour)); err != nil { // the same instant is in order
		t.Fatal(err)
	}
	ahead := at.Add(2 * time.Minute)
	if err := p.RecordLevel(ctx, "acme", "seats", d("6"), ahead); err != nil {
		t.Fatal(err)
	}
	if err := p.Close(ctx); err != nil {
		t.Fatal(err)
	}
	var got []string
	var last time.Time
	for _, b := range readBatches(t, c, 1) {
		for _, r := range b.Records {
			got = append(got, fmt.Sprintf("%d %s final=%v", r.Seq, r.Level.Decimal, r.Final))
			if r.OccurredAt.Before(last) {
				t.Errorf("seq %d at %s is before the reading before it (%s)", r.Seq, r.OccurredAt.Format(time.RFC3339Nano), last.Format(time.RFC3339Nano))
			}
			last = r.OccurredAt
		}
	}
	if want := "1 3 final=false,2 4 final=false,3 6 final=false,4 0 final=true"; strings.Join(got, ",") != want {
		t.Errorf("records %s, want %s", strings.Join(got, ","), want)
	}
}
