package admission_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/tally-ledger/tally/admission"
)

// A final spend report that reaches Tally after the grant was reclaimed
// (the gateway could not reach Tally in time, or restarted meanwhile) is
// recorded: the grant's spent becomes the truth. It frees nothing, since
// the grant's capacity counted as fully spent from its reclaim on and may
// already back other grants; stranded shrinks to what was really unspent.
func TestLateFinalReportRecordsSpentWithoutFreeing(t *testing.T) {
	e := newEnv(t)
	ctx := context.Background()
	e.rule("acme", "tokens", d("100"))
	g, err := e.store.Issue(ctx, admission.IssueRequest{Holder: "gw1", Generation: 1, Customer: "acme", Meter: "tokens",
		Amount: d("70"), TTL: 10 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := e.store.Renew(ctx, admission.Report{Grant: g.ID, Holder: "gw1", Generation: 1, Spent: d("30"), TTL: 10 * time.Second}); err != nil {
		t.Fatal(err)
	}
	e.clock.Advance(10*time.Second + admission.DefaultMaxSkew)
	// The holder restarted meanwhile: generation 2 is its newest.
	if _, err := e.store.Issue(ctx, admission.IssueRequest{Holder: "gw1", Generation: 2, Customer: "acme", Meter: "tokens",
		Amount: d("10")}); err != nil {
		t.Fatal(err)
	}
	late := admission.Report{Grant: g.ID, Holder: "gw1", Generation: 1, Spent: d("55")}
	got, err := e.store.Release(ctx, late)
	if err != nil {
		t.Fatalf("late final report refused: %v", err)
	}
	if got.State != "ended" || got.EndReason != "expired" || !got.Spent.Equal(d("55")) || !got.LateReport {
		t.Fatalf("late report answer: %+v", got)
	}
	b := e.budget("acme", "tokens")
	if !b.Consumed.Equal(d("80")) || !b.Stranded.Equal(d("15")) || !b.Live.Equal(d("10")) {
		t.Fatalf("budget after a late report: consumed %s stranded %s live %s, want 80, 15, 10", b.Consumed, b.Stranded, b.Live)
	}
	if _, err := e.store.Issue(ctx, admission.IssueRequest{Holder: "gw2", Generation: 1, Customer: "acme", Meter: "tokens",
		Amount: d("21")}); err == nil {
		t.Fatal("a late report freed capacity")
	}
	// Delivered twice (the first answer was lost): the same record.
	if got, err := e.store.Release(ctx, late); err != nil || !got.Spent.Equal(d("55")) {
		t.Fatalf("repeated late report: %+v %v", got, err)
	}
	if _, err := e.store.Release(ctx, admission.Report{Grant: g.ID, Holder: "gw1", Generation: 1, Spent: d("50")}); !isSpentError(err) {
		t.Fatalf("late report going backwards: %v", err)
	}
	if _, err := e.store.Release(ctx, admission.Report{Grant: g.ID, Holder: "gw2", Generation: 1, Spent: d("60")}); !isFenced(err) {
		t.Fatalf("late report from another holder: %v", err)
	}
	if _, err := e.store.Release(ctx, admission.Report{Grant: g.ID, Holder: "gw1", Generation: 2, Spent: d("60")}); !isFenced(err) {
		t.Fatalf("late report from another generation: %v", err)
	}
	if _, err := e.store.Renew(ctx, admission.Report{Grant: g.ID, Holder: "gw1", Generation: 1, Spent: d("60")}); err == nil {
		t.Fatal("an expired grant was renewed")
	}
}

// An older generation's report on a grant still live is refused as
// before: it would free capacity the older process may still admit from.
// Once the grant is reclaimed, the same report is accepted as late.
func TestOlderGenerationReportWaitsForReclaim(t *testing.T) {
	e := newEnv(t)
	ctx := context.Background()
	e.rule("acme", "tokens", d("100"))
	g, err := e.store.Issue(ctx, admission.IssueRequest{Holder: "gw1", Generation: 1, Customer: "acme", Meter: "tokens",
		Amount: d("40"), TTL: 10 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := e.store.Issue(ctx, admission.IssueRequest{Holder: "gw1", Generation: 2, Customer: "acme", Meter: "tokens",
		Amount: d("10")}); err != nil {
		t.Fatal(err)
	}
	rep := admission.Report{Grant: g.ID, Holder: "gw1", Generation: 1, Spent: d("25")}
	if _, err := e.store.Release(ctx, rep); !errors.As(err, new(*admission.StaleGenerationError)) {
		t.Fatalf("older generation released a live grant: %v", err)
	}
	e.clock.Advance(10*time.Second + admission.DefaultMaxSkew)
	if _, err := e.store.Release(ctx, rep); err != nil {
		t.Fatalf("late report after reclaim: %v", err)
	}
	if b := e.budget("acme", "tokens"); !b.Consumed.Equal(d("50")) || !b.Stranded.Equal(d("15")) {
		t.Fatalf("budget: consumed %s stranded %s, want 50 and 15", b.Consumed, b.Stranded)
	}
}

// stranded is one thing: capacity counted as consumed that no report says
// was admitted, the unspent part of grants that ended without a final
// report in time. A released grant's unspent part went back to the
// budget, so it is not stranded.
func TestReleasedUnspentIsNotStranded(t *testing.T) {
	e := newEnv(t)
	ctx := context.Background()
	e.rule("acme", "tokens", d("100"))
	g, err := e.store.Issue(ctx, admission.IssueRequest{Holder: "gw1", Generation: 1, Customer: "acme", Meter: "tokens", Amount: d("40")})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := e.store.Release(ctx, admission.Report{Grant: g.ID, Holder: "gw1", Generation: 1, Spent: d("10")}); err != nil {
		t.Fatal(err)
	}
	if b := e.budget("acme", "tokens"); !b.Consumed.Equal(d("10")) || !b.Stranded.IsZero() {
		t.Fatalf("budget: consumed %s stranded %s, want 10 and 0", b.Consumed, b.Stranded)
	}
}

func isSpentError(err error) bool { return errors.As(err, new(*admission.SpentError)) }
func isFenced(err error) bool     { return errors.As(err, new(*admission.FencedError)) }
