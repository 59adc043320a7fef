package admission_test

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/shopspring/decimal"

	"github.com/tally-ledger/tally/admission"
	"github.com/tally-ledger/tally/pools"
	"github.com/tally-ledger/tally/quota"
)

// scopeRule stores a new exact rule version of a pool or the global scope.
func (e *env) scopeRule(scope, meter string, limit decimal.Decimal) {
	e.t.Helper()
	if err := e.putLimit(scope, meter, limit); err != nil {
		e.t.Fatalf("put scope rule: %v", err)
	}
}

func (e *env) putPool(name string, members ...string) pools.Change {
	e.t.Helper()
	ch, err := e.store.PutPool(context.Background(), pools.PutInput{Name: name, Members: members, Actor: "test"})
	if err != nil {
		e.t.Fatalf("put pool %s: %v", name, err)
	}
	return ch
}

// scopeConsumed is a pool or global budget's consumed this period (zero
// before its first grant).
func (e *env) scopeConsumed(scope, meter string) decimal.Decimal {
	e.t.Helper()
	bs, err := e.store.ScopeBudgets(context.Background(), scope)
	if err != nil {
		e.t.Fatal(err)
	}
	for _, b := range bs {
		if b.Meter == meter && !e.clock.Now().Before(b.PeriodStart) && e.clock.Now().Before(b.PeriodEnd) {
			return b.Consumed
		}
	}
	return decimal.Zero
}

func (e *env) issue(holder, customer string, amt decimal.Decimal, budgets ...string) (admission.Grant, error) {
	return e.store.Issue(context.Background(), admission.IssueRequest{Holder: holder, Generation: 1, Customer: customer,
		Meter: "calls", Amount: amt, Budgets: budgets})
}

// The operator's sentence: each customer 10 calls, the free plan 15 in
// total, never more than 22 across everyone; Tally enforces all three and
// says which one refused.
func TestEveryBudgetIsEnforcedAndTheBindingOneIsNamed(t *testing.T) {
	e := newEnv(t)
	for _, c := range []string{"a", "b", "c"} {
		e.rule(c, "calls", d("10"))
	}
	e.scopeRule(quota.PoolScope("free"), "calls", d("15"))
	e.scopeRule(quota.Global, "calls", d("22"))
	e.putPool("free", "a", "b")

	g, err := e.issue("gw", "a", d("10"))
	if err != nil {
		t.Fatal(err)
	}
	if want := []string{"customer:a", "global", "pool:free"}; fmt.Sprint(g.Budgets) != fmt.Sprint(want) {
		t.Fatalf("grant drew from %v, want %v", g.Budgets, want)
	}
	refused := func(customer, amt, binding, available string) {
		t.Helper()
		_, err := e.issue("gw", customer, d(amt))
		ex, ok := errors.AsType[*admission.BudgetExhaustedError](err)
		if !ok || ex.Binding != binding || !ex.Available.Equal(d(available)) {
			t.Fatalf("issue %s to %s: want %s exhausted with %s available, got %v", amt, customer, binding, available, err)
		}
		if ex.RetryAfter <= 0 || ex.RetryAfter > admission.DefaultTTL+admission.DefaultMaxSkew {
			t.Fatalf("retry_after %v: want when the live grant is reclaimed", ex.RetryAfter)
		}
	}
	refused("a", "1", "customer:a/calls", "0")
	refused("b", "6", "pool:free/calls", "5")
	if _, err := e.issue("gw", "b", d("5")); err != nil {
		t.Fatal(err)
	}
	if _, err := e.issue("gw", "c", d("7")); err != nil {
		t.Fatal(err)
	}
	refused("c", "1", "global/calls", "0")
}

// A request refused by the global budget leaves the customer's and the
// pool's budgets exactly as they were, and stores no grant.
func TestRefusedByGlobalLeavesOtherBudgetsAsTheyWere(t *testing.T) {
	e := newEnv(t)
	e.rule("a", "calls", d("100"))
	e.scopeRule(quota.PoolScope("team"), "calls", d("1000"))
	e.scopeRule(quota.Global, "calls", d("50"))
	e.putPool("team", "a")
	if _, err := e.issue("gw", "a", d("40")); err != nil {
		t.Fatal(err)
	}
	_, err := e.issue("gw", "a", d("20"))
	if ex, ok := errors.AsType[*admission.BudgetExhaustedError](err); !ok || ex.Binding != "global/calls" || !ex.Available.Equal(d("10")) {
		t.Fatalf("want global exhausted with 10 available, got %v", err)
	}
	if b := e.budget("a", "calls"); !b.Consumed.Equal(d("40")) || !b.Live.Equal(d("40")) {
		t.Fatalf("customer budget moved: %+v", b)
	}
	for _, scope := range []string{"pool:team", "global"} {
		if c := e.scopeConsumed(scope, "calls"); !c.Equal(d("40")) {
			t.Fatalf("%s consumed %s, want 40", scope, c)
		}
	}
	gs, err := e.store.Grants(context.Background(), admission.ListRequest{Customer: "a"})
	if err != nil || len(gs) != 1 {
		t.Fatalf("grants %v %v: want only the first", gs, err)
	}
}

// Release gives back amount - spent to every budget the grant drew from; a
// request naming a subset draws only from it.
func TestReleaseFreesEveryBudgetDrawn(t *testing.T) {
	e := newEnv(t)
	e.rule("a", "calls", d("100"))
	e.scopeRule(quota.PoolScope("team"), "calls", d("100"))
	e.scopeRule(quota.Global, "calls", d("100"))
	e.putPool("team", "a")
	g, err := e.issue("gw", "a", d("40"))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := e.store.Release(context.Background(), admission.Report{Grant: g.ID, Holder: "gw", Generation: 1, Spent: d("15")}); err != nil {
		t.Fatal(err)
	}
	sub, err := e.issue("gw", "a", d("5"), "global", "pool:team")
	if err != nil {
		t.Fatal(err)
	}
	if fmt.Sprint(sub.Budgets) != "[global pool:team]" {
		t.Fatalf("subset grant drew from %v", sub.Budgets)
	}
	if c := e.budget("a", "calls").Consumed; !c.Equal(d("15")) {
		t.Fatalf("customer consumed %s, want 15", c)
	}
	for _, scope := range []string{"pool:team", "global"} {
		if c := e.scopeConsumed(scope, "calls"); !c.Equal(d("20")) {
			t.Fatalf("%s consumed %s, want 20", scope, c)
		}
	}
	if _, err := e.issue("gw", "a", d("1"), "pool:other"); err == nil {
		t.Fatal("a budget that does not apply was drawn from")
	}
}

// Joining never hands out a fresh allowance: a customer that joins brings
// what it consumed this period into the pool's count; a pool budget
// created mid-period starts at what its members consumed; leaving takes
// nothing back.
func TestJoiningBringsThePeriodsConsumption(t *testing.T) {
	e := newEnv(t)
	for _, c := range []string{"a", "b"} {
		e.rule(c, "calls", d("100"))
	}
	if _, err := e.issue("gw", "a", d("30")); err != nil { // before any pool rule
		t.Fatal(err)
	}
	e.putPool("team", "a")
	e.scopeRule(quota.PoolScope("team"), "calls", d("100"))
	if _, err := e.issue("gw", "a", d("10")); err != nil {
		t.Fatal(err)
	}
	if c := e.scopeConsumed("pool:team", "calls"); !c.Equal(d("40")) {
		t.Fatalf("pool created mid-period: consumed %s, want 30 brought + 10 drawn", c)
	}
	g, err := e.issue("gw", "b", d("25")) // b is not a member yet
	if err != nil {
		t.Fatal(err)
	}
	if fmt.Sprint(g.Budgets) != "[customer:b]" {
		t.Fatalf("non-member drew from %v", g.Budgets)
	}
	e.clock.Advance(time.Second)
	if ch := e.putPool("team", "a", "b"); fmt.Sprint(ch.Joined) != "[b]" {
		t.Fatalf("joined %v", ch.Joined)
	}
	if c := e.scopeConsumed("pool:team", "calls"); !c.Equal(d("65")) {
		t.Fatalf("after b joined: pool consumed %s, want 40 + 25", c)
	}
	_, err = e.issue("gw", "b", d("36"))
	if ex, ok := errors.AsType[*admission.BudgetExhaustedError](err); !ok || ex.Binding != "pool:team/calls" {
		t.Fatalf("b after joining: want the pool to bind, got %v", err)
	}
	e.clock.Advance(time.Second)
	e.putPool("team", "a")
	if c := e.scopeConsumed("pool:team", "calls"); !c.Equal(d("65")) {
		t.Fatalf("after b left: pool consumed %s, want 65 (leaving takes nothing back)", c)
	}
	p, err := pools.Get(context.Background(), e.pool, "team")
	if err != nil || len(p.History) != 2 || p.History[1].LeftAt == nil {
		t.Fatalf("history %+v %v: want a's stay and b's ended stay", p.History, err)
	}
}

// Requests over overlapping budgets, naming them in different orders,
// issued and released concurrently, never deadlock: the locks are taken in
// one fixed order whatever the request says.
func TestOverlappingBudgetsNeverDeadlock(t *testing.T) {
	e := newEnv(t)
	customers := []string{"a", "b", "c"}
	for _, c := range customers {
		e.rule(c, "calls", d("1000000"))
	}
	for _, p := range []string{"p", "q"} {
		e.scopeRule(quota.PoolScope(p), "calls", d("1000000"))
	}
	e.scopeRule(quota.Global, "calls", d("1000000"))
	e.putPool("p", "a", "b", "c")
	e.putPool("q", "a", "b", "c")
	orders := [][]string{
		{"customer:%s", "pool:p", "pool:q", "global"},
		{"global", "pool:q", "pool:p", "customer:%s"},
		{"pool:q", "customer:%s", "global", "pool:p"},
		nil,
	}
	var wg sync.WaitGroup
	errs := make(chan error, 64)
	for w := range 8 {
		wg.Go(func() {
			holder := fmt.Sprintf("gw%d", w)
			for i := range 25 {
				c := customers[(w+i)%len(customers)]
				var budgets []string
				for _, b := range orders[(w+i)%len(orders)] {
					if b == "customer:%s" {
						b = "customer:" + c
					}
					budgets = append(budgets, b)
				}
				g, err := e.issue(holder, c, d("1"), budgets...)
				if err != nil {
					errs <- err
					return
				}
				if _, err := e.store.Release(context.Background(), admission.Report{Grant: g.ID, Holder: holder, Generation: 1, Spent: d("1")}); err != nil {
					errs <- err
					return
				}
			}
		})
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Fatalf("concurrent issue/release over overlapping budgets: %v", err)
	}
	if c := e.scopeConsumed("global", "calls"); !c.Equal(d("200")) {
		t.Fatalf("global consumed %s, want 200 (8 holders x 25 grants, fully spent)", c)
	}
}

// A request plans its budgets before it locks them; a rule or membership
// that changed meanwhile is seen under the locks and the request is
// planned again: a customer whose rule became exact draws from it at once.
func TestRuleAndMembershipChangesApplyToTheNextRequest(t *testing.T) {
	e := newEnv(t)
	e.scopeRule(quota.PoolScope("team"), "calls", d("100"))
	e.putPool("team", "a")
	g, err := e.issue("gw", "a", d("5"))
	if err != nil || fmt.Sprint(g.Budgets) != "[pool:team]" {
		t.Fatalf("no customer rule: %v %v", g.Budgets, err)
	}
	// A customer rule that becomes exact mid-period starts at what the
	// period already consumed: a's 5, so 3 of its 8 are left.
	e.rule("a", "calls", d("8"))
	_, err = e.issue("gw", "a", d("5"))
	if ex, ok := errors.AsType[*admission.BudgetExhaustedError](err); !ok || ex.Binding != "customer:a/calls" || !ex.Available.Equal(d("3")) {
		t.Fatalf("after the customer rule became exact: %v", err)
	}
	// A global budget created mid-period starts at what everyone consumed
	// this period: a's first 5.
	e.scopeRule(quota.Global, "calls", d("12"))
	if g, err = e.issue("gw", "a", d("3")); err != nil || fmt.Sprint(g.Budgets) != "[customer:a global pool:team]" {
		t.Fatalf("after a global rule: %v %v", g.Budgets, err)
	}
	e.putPool("team")
	if g, err = e.issue("gw", "b", d("4")); err != nil || fmt.Sprint(g.Budgets) != "[global]" {
		t.Fatalf("b: %v %v", g.Budgets, err)
	}
	if _, err = e.issue("gw", "b", d("1")); err == nil {
		t.Fatal("a global budget of 12 gave 13 (5 before it, 3 to a, 4 and 1 to b)")
	}
}

// A customer's first grant of the period (its budget row is new, so a join
// cannot see it to lock it) and the customer joining a pool, at the same
// moment: the pool counts the grant either way — the grant commits before
// the join brings the customer's consumption in, or it sees the new
// membership and draws from the pool itself. A trigger holds the grant's
// transaction after it decided and before it commits, while the join runs.
func TestJoinDuringAFirstGrantCountsIt(t *testing.T) {
	e := newEnv(t)
	ctx := context.Background()
	e.rule("a", "calls", d("100"))
	e.rule("b", "calls", d("100"))
	e.scopeRule(quota.PoolScope("team"), "calls", d("100"))
	e.putPool("team", "b")                                 // a is not a member
	if _, err := e.issue("gw", "b", d("10")); err != nil { // the pool's budget row exists
		t.Fatal(err)
	}

	// The test holds advisory lock (7154399, 1); the trigger makes every
	// grant insert wait for it.
	hold, err := e.pool.Acquire(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer hold.Release()
	for _, q := range []string{
		`SELECT pg_advisory_lock(7154399, 1)`,
		`CREATE FUNCTION test_hold_grant() RETURNS trigger LANGUAGE plpgsql AS $$
		 BEGIN PERFORM pg_advisory_lock_shared(7154399, 1); PERFORM pg_advisory_unlock_shared(7154399, 1); RETURN NEW; END $$`,
		`CREATE TRIGGER test_hold_grant BEFORE INSERT ON admission_grants FOR EACH ROW EXECUTE FUNCTION test_hold_grant()`,
	} {
		if _, err := hold.Exec(ctx, q); err != nil {
			t.Fatal(err)
		}
	}
	waiters := func() int { return e.lockWaiters("advisory") }
	granted := make(chan error, 1)
	go func() {
		_, err := e.issue("gw", "a", d("30"))
		granted <- err
	}()
	for deadline := time.Now().Add(10 * time.Second); waiters() < 1; time.Sleep(10 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatal("the grant never reached its insert")
		}
	}
	// The join: it either finishes now (it did not wait for the grant) or
	// waits on the grant's lock (a second advisory waiter).
	joined := make(chan struct{})
	go func() {
		defer close(joined)
		e.clock.Advance(time.Millisecond)
		e.putPool("team", "a", "b")
	}()
	for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(10 * time.Millisecond) {
		select {
		case <-joined:
		default:
			if waiters() < 2 && time.Now().Before(deadline) {
				continue
			}
		}
		break
	}
	if _, err := hold.Exec(ctx, `SELECT pg_advisory_unlock(7154399, 1)`); err != nil {
		t.Fatal(err)
	}
	if err := <-granted; err != nil {
		t.Fatal(err)
	}
	<-joined
	if c := e.scopeConsumed("pool:team", "calls"); !c.Equal(d("40")) {
		t.Fatalf("pool consumed %s after a joined with a 30 grant in flight, want 10 + 30", c)
	}
}

// Membership changed several times at one instant (the clock did not
// move, or the caller named the same effective_at): a customer listed,
// dropped and listed again at that instant is a member from it, counted
// once, and the change is not refused by the store.
func TestRejoiningAtTheInstantItLeftIsAMember(t *testing.T) {
	e := newEnv(t)
	ctx := context.Background()
	e.rule("a", "calls", d("100"))
	e.scopeRule(quota.PoolScope("team"), "calls", d("100"))
	e.putPool("team", "a", "b")
	if _, err := e.issue("gw1", "a", d("10")); err != nil {
		t.Fatal(err)
	}
	e.putPool("team", "b")
	if _, err := e.store.PutPool(ctx, pools.PutInput{Name: "team", Members: []string{"a", "b"}, Actor: "test"}); err != nil {
		t.Fatalf("a listed again at the instant it left: %v", err)
	}
	p, err := pools.Get(ctx, e.pool, "team")
	if err != nil {
		t.Fatal(err)
	}
	if !slices.Equal(p.Members, []string{"a", "b"}) {
		t.Fatalf("members %v, want [a b]", p.Members)
	}
	if _, err := e.issue("gw1", "a", d("5")); err != nil {
		t.Fatal(err)
	}
	if c := e.scopeConsumed(quota.PoolScope("team"), "calls"); !c.Equal(d("15")) {
		t.Fatalf("pool consumed %s, want 15", c)
	}
}

// Two membership changes of one pool at once, the one that waits for the
// pool's lock having read its clock first (two API processes, or one
// request overtaken by another): it applies after the other, from no
// earlier than the other's change, instead of failing on a stay that
// would end before it began. A change that names its effective_at is
// still refused when another change came after it.
func TestConcurrentPoolChangesApplyInLockOrder(t *testing.T) {
	e := newEnv(t)
	ctx := context.Background()
	e.putPool("free", "a")
	earlier := e.clock.Now().Add(time.Second)
	later := earlier.Add(time.Second)
	// The rival holds the pool's lock with its change (at the later
	// instant) not yet committed.
	tx, err := e.pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer tx.Rollback(ctx)
	if _, err := pools.PutTx(ctx, tx, pools.PutInput{Name: "free", Members: []string{"a", "b"}, Actor: "rival"}, later); err != nil {
		t.Fatal(err)
	}
	e.clock.Advance(earlier.Sub(e.clock.Now()))
	done := make(chan error, 1)
	var ch pools.Change
	go func() {
		var err error
		ch, err = e.store.PutPool(ctx, pools.PutInput{Name: "free", Members: []string{"c"}, Actor: "waiter"})
		done <- err
	}()
	time.Sleep(200 * time.Millisecond) // the waiter reads its clock and queues on the lock
	if err := tx.Commit(ctx); err != nil {
		t.Fatal(err)
	}
	if err := <-done; err != nil {
		t.Fatalf("the change that waited: %v", err)
	}
	if !ch.At.Equal(later) || fmt.Sprint(ch.Left) != "[a b]" || fmt.Sprint(ch.Joined) != "[c]" {
		t.Fatalf("the change that waited: %+v, want a and b left and c joined at %s", ch, later)
	}
	p, err := pools.Get(ctx, e.pool, "free")
	if err != nil {
		t.Fatal(err)
	}
	if fmt.Sprint(p.Members) != "[c]" {
		t.Fatalf("members %v, want [c]", p.Members)
	}
	for _, s := range p.History {
		if s.LeftAt != nil && s.LeftAt.Before(s.JoinedAt) {
			t.Fatalf("a stay ends before it began: %+v", s)
		}
	}
	_, err = e.store.PutPool(ctx, pools.PutInput{Name: "free", Members: []string{"a"}, EffectiveAt: earlier, Actor: "late"})
	var fe *pools.FieldError
	if !errors.As(err, &fe) || fe.Field != "effective_at" {
		t.Fatalf("a change effective before the latest: %v, want an effective_at error", err)
	}
}
