package admission_test

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/shopspring/decimal"

	"github.com/tally-ledger/tally/admission"
	"github.com/tally-ledger/tally/ledger"
	"github.com/tally-ledger/tally/quota"
)

func TestIssueIsExactAndRefusalCarriesData(t *testing.T) {
	e := newEnv(t)
	ctx := context.Background()
	e.rule("acme", "tokens", d("100"))

	g, err := e.store.Issue(ctx, admission.IssueRequest{Holder: "gw1", Generation: 1, Customer: "acme", Meter: "tokens",
		Amount: d("60.5"), TTL: 30 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	if !g.Amount.Equal(d("60.5")) || g.Period != "2026-12-01" || !g.ReclaimAt.Equal(g.ValidUntil.Add(admission.DefaultMaxSkew)) {
		t.Fatalf("grant %+v", g)
	}
	_, err = e.store.Issue(ctx, admission.IssueRequest{Holder: "gw2", Generation: 1, Customer: "acme", Meter: "tokens",
		Amount: d("40"), TTL: 30 * time.Second})
	ex, ok := errors.AsType[*admission.BudgetExhaustedError](err)
	if !ok {
		t.Fatalf("want BudgetExhaustedError, got %v", err)
	}
	if ex.Binding != "customer:acme/tokens" || !ex.Available.Equal(d("39.5")) || ex.RetryAfter != 35*time.Second {
		t.Fatalf("refusal %+v", ex)
	}
	// min_amount accepts what is left, exactly.
	g2, err := e.store.Issue(ctx, admission.IssueRequest{Holder: "gw2", Generation: 1, Customer: "acme", Meter: "tokens",
		Amount: d("40"), MinAmount: decimal.NewNullDecimal(d("10"))})
	if err != nil || !g2.Amount.Equal(d("39.5")) {
		t.Fatalf("min_amount grant %+v, %v", g2, err)
	}
	b := e.budget("acme", "tokens")
	if !b.Consumed.Equal(d("100")) || !b.Available.IsZero() || !b.Live.Equal(d("100")) {
		t.Fatalf("budget %+v", b)
	}
	// Releasing with its final spend frees exactly the unspent part.
	if _, err := e.store.Release(ctx, admission.Report{Grant: g.ID, Holder: "gw1", Generation: 1, Spent: d("20.25")}); err != nil {
		t.Fatal(err)
	}
	b = e.budget("acme", "tokens")
	// It went back to the budget: not stranded.
	if !b.Available.Equal(d("40.25")) || !b.Stranded.IsZero() {
		t.Fatalf("after release: %+v", b)
	}
}

func TestIssueRefusesLaggedAndMissingRules(t *testing.T) {
	e := newEnv(t)
	ctx := context.Background()
	req := admission.IssueRequest{Holder: "gw1", Generation: 1, Customer: "acme", Meter: "tokens", Amount: d("1")}
	if _, err := e.store.Issue(ctx, req); !isNotExact(err, "") {
		t.Fatalf("no rule: %v", err)
	}
	if _, err := quota.PutRuleDB(ctx, e.pool, quota.RuleInput{Customer: "acme", Meter: "tokens", Limit: d("5"),
		EffectiveAt: e.clock.Now(), Actor: "test"}); err != nil {
		t.Fatal(err)
	}
	if _, err := e.store.Issue(ctx, req); !isNotExact(err, "lagged") {
		t.Fatalf("lagged rule: %v", err)
	}
}

func isNotExact(err error, admissionMode string) bool {
	ne, ok := errors.AsType[*admission.NotExactError](err)
	return ok && ne.Admission == admissionMode
}

func TestSilentHolderIsNotReclaimedBeforeValidUntilPlusMaxSkew(t *testing.T) {
	e := newEnv(t)
	ctx := context.Background()
	e.rule("acme", "tokens", d("100"))
	g, err := e.store.Issue(ctx, admission.IssueRequest{Holder: "gw1", Generation: 1, Customer: "acme", Meter: "tokens",
		Amount: d("70"), TTL: 10 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	// Heartbeat late: past valid_until, 1µs before reclaim. Still live, the
	// holder may still report, and nobody else gets its capacity.
	e.clock.Advance(10*time.Second + admission.DefaultMaxSkew - time.Microsecond)
	if got, _ := e.store.Get(ctx, g.ID); got.State != "live" {
		t.Fatalf("reclaimed early: %+v", got)
	}
	if _, err := e.store.Issue(ctx, admission.IssueRequest{Holder: "gw2", Generation: 1, Customer: "acme", Meter: "tokens",
		Amount: d("31")}); err == nil {
		t.Fatal("capacity of a live grant handed out")
	}
	g, err = e.store.Renew(ctx, admission.Report{Grant: g.ID, Holder: "gw1", Generation: 1, Spent: d("30"), TTL: 10 * time.Second})
	if err != nil {
		t.Fatalf("late renew within max_skew: %v", err)
	}
	// Then silence until the renewed reclaim time.
	e.clock.Advance(10*time.Second + admission.DefaultMaxSkew - time.Microsecond)
	if got, _ := e.store.Get(ctx, g.ID); got.State != "live" {
		t.Fatalf("reclaimed early after renew: %+v", got)
	}
	e.clock.Advance(time.Microsecond)
	got, err := e.store.Get(ctx, g.ID)
	if err != nil || got.State != "ended" || got.EndReason != "expired" {
		t.Fatalf("at reclaim_at: %+v %v", got, err)
	}
	// Ended without a final report: fully spent. Its unspent part is stranded.
	b := e.budget("acme", "tokens")
	if !b.Consumed.Equal(d("70")) || !b.Stranded.Equal(d("40")) || !b.Live.IsZero() {
		t.Fatalf("budget %+v", b)
	}
	// A final report after reclaim corrects the record, frees nothing.
	late, err := e.store.Release(ctx, admission.Report{Grant: g.ID, Holder: "gw1", Generation: 1, Spent: d("40")})
	if err != nil || !late.LateReport || late.EndReason != "expired" {
		t.Fatalf("release after reclaim: %+v %v", late, err)
	}
	b = e.budget("acme", "tokens")
	if !b.Consumed.Equal(d("70")) || !b.Stranded.Equal(d("30")) || !b.Live.IsZero() {
		t.Fatalf("budget after the late report %+v", b)
	}
	if _, err := e.store.Issue(ctx, admission.IssueRequest{Holder: "gw2", Generation: 1, Customer: "acme", Meter: "tokens",
		Amount: d("30")}); err != nil {
		t.Fatalf("the rest: %v", err)
	}
}

func TestOlderGenerationIsRefused(t *testing.T) {
	e := newEnv(t)
	ctx := context.Background()
	e.rule("acme", "tokens", d("100"))
	issue := func(holder string, gen int64) (admission.Grant, error) {
		return e.store.Issue(ctx, admission.IssueRequest{Holder: holder, Generation: gen, Customer: "acme", Meter: "tokens", Amount: d("10")})
	}
	old, err := issue("gw1", 1)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := issue("gw1", 2); err != nil { // gw1 restarted
		t.Fatal(err)
	}
	stale := func(err error) bool {
		se, ok := errors.AsType[*admission.StaleGenerationError](err)
		return ok && se.Current == 2 && se.Generation == 1
	}
	if _, err := e.store.Renew(ctx, admission.Report{Grant: old.ID, Holder: "gw1", Generation: 1, Spent: d("1")}); !stale(err) {
		t.Fatalf("renew from generation 1: %v", err)
	}
	if _, err := e.store.Release(ctx, admission.Report{Grant: old.ID, Holder: "gw1", Generation: 1, Spent: d("1")}); !stale(err) {
		t.Fatalf("release from generation 1: %v", err)
	}
	if _, err := issue("gw1", 1); !stale(err) {
		t.Fatalf("issue to generation 1: %v", err)
	}
	// The new generation does not inherit the old one's grant, nor does
	// another holder manage it.
	for _, r := range []admission.Report{{Holder: "gw1", Generation: 2}, {Holder: "gw2", Generation: 1}} {
		r.Grant, r.Spent = old.ID, d("0")
		if _, err := e.store.Release(ctx, r); err == nil {
			t.Fatalf("%s/%d released another's grant", r.Holder, r.Generation)
		} else if _, ok := errors.AsType[*admission.FencedError](err); !ok {
			t.Fatalf("%s/%d: %v", r.Holder, r.Generation, err)
		}
	}
	if b := e.budget("acme", "tokens"); !b.Consumed.Equal(d("20")) {
		t.Fatalf("budget %+v", b)
	}
}

func TestSpentIsMonotonicAndBounded(t *testing.T) {
	e := newEnv(t)
	ctx := context.Background()
	e.rule("acme", "tokens", d("100"))
	g, err := e.store.Issue(ctx, admission.IssueRequest{Holder: "gw1", Generation: 1, Customer: "acme", Meter: "tokens", Amount: d("10")})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := e.store.Renew(ctx, admission.Report{Grant: g.ID, Holder: "gw1", Generation: 1, Spent: d("5")}); err != nil {
		t.Fatal(err)
	}
	for _, spent := range []string{"4.99", "10.01"} {
		_, err := e.store.Release(ctx, admission.Report{Grant: g.ID, Holder: "gw1", Generation: 1, Spent: d(spent)})
		if _, ok := errors.AsType[*admission.SpentError](err); !ok {
			t.Fatalf("spent %s: %v", spent, err)
		}
	}
}

func TestRuleChangesNeverHandOutFreshAllowance(t *testing.T) {
	e := newEnv(t)
	ctx := context.Background()
	e.rule("acme", "tokens", d("100"))
	issue := func(amt string) error {
		_, err := e.store.Issue(ctx, admission.IssueRequest{Holder: "gw1", Generation: 1, Customer: "acme", Meter: "tokens", Amount: d(amt)})
		return err
	}
	if err := issue("80"); err != nil {
		t.Fatal(err)
	}
	e.clock.Advance(time.Second)
	e.rule("acme", "tokens", d("50")) // below consumed: no new grants
	if err := issue("1"); err == nil {
		t.Fatal("issued while consumed > lowered limit")
	} else if ex, ok := errors.AsType[*admission.BudgetExhaustedError](err); !ok || !ex.Available.IsZero() {
		t.Fatalf("lowered: %v", err)
	}
	e.clock.Advance(time.Second)
	e.rule("acme", "tokens", d("120")) // raised: 40 free at once, not 120
	if err := issue("40.000000001"); err == nil {
		t.Fatal("raising handed out a fresh allowance")
	}
	if err := issue("40"); err != nil {
		t.Fatalf("raised: %v", err)
	}
	if b := e.budget("acme", "tokens"); !b.Consumed.Equal(d("120")) || b.RuleVersion != 3 {
		t.Fatalf("budget %+v", b)
	}
}

func TestBypassReportsAreIdempotent(t *testing.T) {
	e := newEnv(t)
	ctx := context.Background()
	e.rule("acme", "tokens", d("100"))
	if _, err := e.store.Issue(ctx, admission.IssueRequest{Holder: "gw1", Generation: 1, Customer: "acme", Meter: "tokens", Amount: d("1")}); err != nil {
		t.Fatal(err)
	}
	rep := admission.BypassReport{Holder: "gw1", Generation: 1, ReportID: "r1", Items: []admission.BypassItem{{
		Customer: "acme", Meter: "tokens", Amount: d("7.5"), Admissions: 3, FirstAt: e.clock.Now(), LastAt: e.clock.Now(),
	}}}
	for range 2 {
		if err := e.store.RecordBypasses(ctx, rep); err != nil {
			t.Fatal(err)
		}
	}
	if b := e.budget("acme", "tokens"); !b.Bypassed.Equal(d("7.5")) || !b.Consumed.Equal(d("1")) {
		t.Fatalf("budget %+v", b)
	}
}

// A gateway's grants are issued while its releases are in flight: an
// issue that brings no new generation locks its holder's row shared, as a
// release does, so neither waits for the other. One that does bring a new
// generation — including one this Store believed its holder already had,
// the row having been reset since — still takes the row exclusively.
func TestIssueDoesNotWaitForItsHoldersReleases(t *testing.T) {
	e := newEnv(t)
	ctx := context.Background()
	e.rule("acme", "tokens", d("100"))
	issue := func(ctx context.Context, gen int64) (admission.Grant, error) {
		return e.store.Issue(ctx, admission.IssueRequest{Holder: "gw1", Generation: gen, Customer: "acme", Meter: "tokens", Amount: d("10")})
	}
	// Generation 3 from the start (a jump of at most MaxGenerationStep).
	if _, err := issue(ctx, 3); err != nil {
		t.Fatal(err)
	}
	// What a release batch of gw1 holds until it commits.
	tx := e.holding(`SELECT generation FROM admission_holders WHERE holder = 'gw1' FOR SHARE`)
	done := make(chan error, 1)
	go func() {
		_, err := issue(ctx, 3)
		done <- err
	}()
	select {
	case err := <-done:
		if err != nil {
			t.Fatalf("an issue while a release of its holder is in flight: %v", err)
		}
	case <-time.After(3 * time.Second):
		t.Error("an issue waited for a release of its holder still in flight")
		if err := tx.Rollback(ctx); err != nil {
			t.Fatal(err)
		}
		if err := <-done; err != nil {
			t.Fatal(err)
		}
	}
	if err := tx.Rollback(ctx); err != nil && !errors.Is(err, pgx.ErrTxClosed) {
		t.Fatal(err)
	}
	// Another process resets gw1's generation; this Store still believes
	// it is 3. The issue under generation 3 brings it back to 3.
	if _, err := e.pool.Exec(ctx, `UPDATE admission_holders SET generation = 1 WHERE holder = 'gw1'`); err != nil {
		t.Fatal(err)
	}
	if _, err := issue(ctx, 3); err != nil {
		t.Fatalf("an issue bringing a generation the Store believed in: %v", err)
	}
	var gen int64
	if err := e.pool.QueryRow(ctx, `SELECT generation FROM admission_holders WHERE holder = 'gw1'`).Scan(&gen); err != nil {
		t.Fatal(err)
	}
	if gen != 3 {
		t.Fatalf("gw1's generation %d, want 3", gen)
	}
	if _, err := issue(ctx, 2); err == nil {
		t.Fatal("an issue to generation 2 after 3 was accepted")
	}
	if b := e.budget("acme", "tokens"); !b.Consumed.Equal(d("30")) {
		t.Fatalf("budget %+v, want 30 consumed", b)
	}
}

// Many callers of two API processes (two Stores on one database), some
// giving up while queued or while their batch runs, most of them bringing
// a holder's first grant: every caller is answered (no batch dies in a
// deadlock over holder rows created meanwhile), both Stores keep issuing
// afterwards, and each budget's consumed is exactly what its grants took.
func TestConcurrentIssuesOfTwoProcessesAllAnswered(t *testing.T) {
	e := newEnv(t)
	stores := []*admission.Store{e.store, e.otherProcess()}
	customers := []string{"c1", "c2", "c3", "c4"}
	for _, c := range customers {
		e.rule(c, "tokens", d("100000"))
	}
	ctx := context.Background()
	var wg sync.WaitGroup
	for i := range 400 {
		wg.Go(func() {
			cctx := ctx
			if i%5 == 0 {
				var cancel context.CancelFunc
				cctx, cancel = context.WithTimeout(ctx, time.Duration(i%7)*time.Millisecond)
				defer cancel()
			}
			_, err := stores[i%2].Issue(cctx, admission.IssueRequest{Holder: fmt.Sprintf("gw%d", i%10), Generation: 1,
				Customer: customers[i%len(customers)], Meter: "tokens", Amount: d("1")})
			if err != nil && cctx.Err() == nil {
				t.Errorf("issue %d: %v", i, err)
			}
		})
	}
	wg.Wait()
	for _, c := range customers {
		for _, s := range stores {
			if _, err := s.Issue(ctx, admission.IssueRequest{Holder: "gw0", Generation: 1, Customer: c, Meter: "tokens",
				Amount: d("1")}); err != nil {
				t.Fatalf("%s: an issue after the storm: %v", c, err)
			}
		}
		var issued decimal.Decimal
		if err := e.pool.QueryRow(ctx, `SELECT coalesce(sum(amount), 0) FROM admission_grants WHERE customer = $1`, c).
			Scan(&issued); err != nil {
			t.Fatal(err)
		}
		if b := e.budget(c, "tokens"); !b.Consumed.Equal(issued) {
			t.Errorf("%s: budget consumed %s, grants issued %s", c, b.Consumed, issued)
		}
	}
}

// A holder's first grant, when another process created the holder's row
// after this batch locked its holders and a transaction of that process
// (a release batch) holds the row and waits for this batch's budget row:
// the batch gives its locks up and runs again, where an upsert of the
// holder row would wait for that transaction, which waits for the batch
// (a deadlock, one of the two killed).
func TestIssueOfAHolderCreatedMeanwhileDoesNotDeadlock(t *testing.T) {
	e := newEnv(t)
	ctx := context.Background()
	e.rule("acme", "tokens", d("100"))
	if _, err := e.store.Issue(ctx, admission.IssueRequest{Holder: "gw-old", Generation: 1, Customer: "acme",
		Meter: "tokens", Amount: d("1")}); err != nil {
		t.Fatal(err)
	}
	waiting := func(n int) {
		t.Helper()
		for deadline := time.Now().Add(5 * time.Second); e.lockWaiters("") < n; time.Sleep(10 * time.Millisecond) {
			if time.Now().After(deadline) {
				t.Fatalf("fewer than %d transactions waiting for a lock", n)
			}
		}
	}
	// Another process's batch holds acme's budget row.
	first := e.holding(`SELECT 1 FROM admission_budgets WHERE customer = 'acme' FOR UPDATE`)
	issued := make(chan error, 1)
	go func() {
		_, err := e.store.Issue(ctx, admission.IssueRequest{Holder: "gw-new", Generation: 1, Customer: "acme",
			Meter: "tokens", Amount: d("1")})
		issued <- err
	}()
	waiting(1) // the batch locked its holders (gw-new has no row) and waits for acme's row
	// The other process gives gw-new its first grant's row, and a release
	// batch of gw-new locks it, then waits for acme's row.
	if _, err := e.pool.Exec(ctx, `INSERT INTO admission_holders (holder, generation, seen_at) VALUES ('gw-new', 1, now())`); err != nil {
		t.Fatal(err)
	}
	release := e.holding(`SELECT 1 FROM admission_holders WHERE holder = 'gw-new' FOR SHARE`)
	locked := make(chan error, 1)
	go func() {
		_, err := release.Exec(ctx, `SELECT 1 FROM admission_budgets WHERE customer = 'acme' FOR UPDATE`)
		locked <- err
	}()
	waiting(2)
	if err := first.Rollback(ctx); err != nil {
		t.Fatal(err)
	}
	if err := <-locked; err != nil {
		t.Fatalf("the release batch: %v", err)
	}
	if err := release.Commit(ctx); err != nil {
		t.Fatal(err)
	}
	if err := <-issued; err != nil {
		t.Fatalf("gw-new's first grant: %v", err)
	}
	if b := e.budget("acme", "tokens"); !b.Consumed.Equal(d("2")) {
		t.Fatalf("budget %+v, want 2 consumed", b)
	}
}

// A refusal says what other holders' live grants still hold on the budget
// that refused, by the spend they have reported: capacity that may come
// back. The refused holder's own grants, ended grants and grants past
// valid_until are not counted; a pool's refusal counts the grants drawn
// from the pool, whoever the customer.
func TestRefusalSaysWhatOtherHoldersHold(t *testing.T) {
	e := newEnv(t)
	ctx := context.Background()
	e.rule("acme", "calls", d("100"))
	held := func(holder, customer string, amt string) decimal.Decimal {
		t.Helper()
		_, err := e.issue(holder, customer, d(amt))
		ex, ok := errors.AsType[*admission.BudgetExhaustedError](err)
		if !ok {
			t.Fatalf("%s asking %s of %s: want a refusal, got %v", holder, amt, customer, err)
		}
		return ex.Held
	}
	g1, err := e.issue("gw1", "acme", d("60"))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := e.store.Renew(ctx, admission.Report{Grant: g1.ID, Holder: "gw1", Generation: 1, Spent: d("15.5")}); err != nil {
		t.Fatal(err)
	}
	if h := held("gw2", "acme", "41"); !h.Equal(d("44.5")) {
		t.Fatalf("gw1 holds 60, spent 15.5: held %s, want 44.5", h)
	}
	if h := held("gw1", "acme", "41"); !h.IsZero() {
		t.Fatalf("gw1's own grant counted: held %s", h)
	}
	g2, err := e.issue("gw2", "acme", d("40"))
	if err != nil {
		t.Fatal(err)
	}
	if h := held("gw3", "acme", "1"); !h.Equal(d("84.5")) {
		t.Fatalf("gw1 and gw2 hold 44.5 and 40: held %s, want 84.5", h)
	}
	e.release(g1, d("60"))
	if h := held("gw2", "acme", "1"); !h.IsZero() {
		t.Fatalf("gw1 released everything spent, gw2 is asking: held %s, want 0", h)
	}
	// Past valid_until a grant's capacity no longer comes back: it is
	// reclaimed as spent.
	e.clock.Advance(g2.ValidUntil.Sub(e.clock.Now()) + time.Second)
	if h := held("gw3", "acme", "1"); !h.IsZero() {
		t.Fatalf("gw2's grant is past valid_until: held %s, want 0", h)
	}

	// A pool that refuses: the grants drawn from it by its members.
	e.rule("b", "calls", d("100"))
	e.rule("c", "calls", d("100"))
	e.putPool("team", "b", "c")
	e.scopeRule("pool:team", "calls", d("10"))
	if _, err := e.issue("gw1", "b", d("7")); err != nil {
		t.Fatal(err)
	}
	_, err = e.issue("gw2", "c", d("4"))
	ex, ok := errors.AsType[*admission.BudgetExhaustedError](err)
	if !ok || ex.Binding != "pool:team/calls" || !ex.Held.Equal(d("7")) {
		t.Fatalf("pool refusal: %+v, %v; want pool:team/calls holding 7 elsewhere", ex, err)
	}
}

// A grant request that arrives while an issue batch is in flight starts a
// batch of its own at once when it locks none of that batch's rows (and
// two are not in flight already): it does not wait for one that is stuck
// on a row another transaction holds. One that shares a row waits for
// the next batch.
func TestIssueDoesNotWaitForTheBatchInFlight(t *testing.T) {
	e := newEnv(t)
	ctx := context.Background()
	e.rule("acme", "tokens", d("100"))
	e.rule("globex", "tokens", d("100"))
	issue := func(ctx context.Context, customer string) error {
		_, err := e.store.Issue(ctx, admission.IssueRequest{Holder: "gw1", Generation: 1, Customer: customer, Meter: "tokens", Amount: d("10")})
		return err
	}
	for _, c := range []string{"acme", "globex"} { // every row created
		if err := issue(ctx, c); err != nil {
			t.Fatal(err)
		}
	}
	// acme's row held by another transaction: a batch with acme waits.
	tx := e.holding(`SELECT 1 FROM admission_budgets WHERE customer = 'acme' FOR UPDATE`)
	stuck := make(chan error, 1)
	go func() { stuck <- issue(ctx, "acme") }()
	for waiting := false; !waiting; time.Sleep(10 * time.Millisecond) {
		var n int
		if err := e.pool.QueryRow(ctx, `SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() AND wait_event_type = 'Lock'`).Scan(&n); err != nil {
			t.Fatal(err)
		}
		waiting = n > 0 // acme's batch waits for its row
	}
	gctx, cancel := context.WithTimeout(ctx, 3*time.Second)
	defer cancel()
	if err := issue(gctx, "globex"); err != nil {
		t.Errorf("globex's grant while acme's batch waits for a row: %v; want it issued in a batch of its own", err)
	}
	// Another request for acme's row waits for the batch in flight and
	// goes in the next one: a second batch on that row would only queue
	// on its lock.
	again := make(chan error, 1)
	go func() { again <- issue(ctx, "acme") }()
	time.Sleep(500 * time.Millisecond)
	var waiting int
	if err := e.pool.QueryRow(ctx, `SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() AND wait_event_type = 'Lock'`).Scan(&waiting); err != nil {
		t.Fatal(err)
	}
	if waiting != 1 {
		t.Errorf("%d transactions wait for acme's row; want only the batch in flight", waiting)
	}
	if err := tx.Rollback(ctx); err != nil {
		t.Fatal(err)
	}
	for _, ch := range []chan error{stuck, again} {
		if err := <-ch; err != nil {
			t.Fatal(err)
		}
	}
	for c, want := range map[string]string{"acme": "30", "globex": "20"} {
		if b := e.budget(c, "tokens"); !b.Consumed.Equal(d(want)) {
			t.Fatalf("%s: %+v, want %s consumed", c, b, want)
		}
	}
}

// A bypass is an admission that happened: one stamped more than the
// ledger's clock skew ahead of Tally's clock, or before the instants whose
// periods a period reference can name, is refused naming its field, and
// nothing of the report is stored (it would count in a future period's, or
// an unnameable period's, books). One just inside the skew is stored.
func TestBypassTimesAreInstantsThatHappened(t *testing.T) {
	e := newEnv(t)
	ctx := context.Background()
	e.rule("acme", "tokens", d("100"))
	now := e.clock.Now()
	item := func(first, last time.Time) admission.BypassItem {
		return admission.BypassItem{Customer: "acme", Meter: "tokens", Amount: d("1"), Admissions: 1, FirstAt: first, LastAt: last}
	}
	for _, c := range []struct {
		name        string
		first, last time.Time
		field       string
	}{
		{"future", now.AddDate(3, 0, 0), now.AddDate(3, 0, 0), "items[1].last_at"},
		{"last ahead", now, now.Add(ledger.MaxClockSkew + time.Second), "items[1].last_at"},
		{"year 9999", time.Date(9999, 12, 31, 0, 0, 0, 0, time.UTC), time.Date(9999, 12, 31, 0, 0, 0, 0, time.UTC), "items[1].last_at"},
		{"before 1970", time.Date(1969, 12, 31, 0, 0, 0, 0, time.UTC), now, "items[1].first_at"},
		{"year 1", time.Date(1, 1, 1, 0, 0, 1, 0, time.UTC), time.Date(1, 1, 1, 0, 0, 1, 0, time.UTC), "items[1].first_at"},
	} {
		rep := admission.BypassReport{Holder: "gw1", Generation: 1, ReportID: "r-" + strings.ReplaceAll(c.name, " ", "-"),
			Items: []admission.BypassItem{item(now, now), item(c.first, c.last)}}
		rep.Items[1].Meter = "other"
		err := e.store.RecordBypasses(ctx, rep)
		var fe *admission.FieldError
		if !errors.As(err, &fe) || fe.Field != c.field {
			t.Errorf("%s: got %v, want a field error on %s", c.name, err, c.field)
		}
	}
	var n int
	if err := e.pool.QueryRow(ctx, `SELECT count(*) FROM admission_bypasses`).Scan(&n); err != nil || n != 0 {
		t.Fatalf("%d bypasses stored (%v), want none", n, err)
	}
	ahead := now.Add(ledger.MaxClockSkew)
	if err := e.store.RecordBypasses(ctx, admission.BypassReport{Holder: "gw1", Generation: 1, ReportID: "ok",
		Items: []admission.BypassItem{item(ahead, ahead)}}); err != nil {
		t.Fatalf("a bypass within the clock skew: %v", err)
	}
}
