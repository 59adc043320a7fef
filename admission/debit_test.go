package admission_test

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"
	"github.com/shopspring/decimal"

	"github.com/tally-ledger/tally/admission"
	"github.com/tally-ledger/tally/quota"
)

// withRegistry gives e a store whose metrics land on a registry of its own.
func (e *env) withRegistry() *prometheus.Registry {
	e.t.Helper()
	reg := prometheus.NewRegistry()
	s, err := admission.New(e.pool, admission.Config{Now: e.clock.Now, Registerer: reg})
	if err != nil {
		e.t.Fatal(err)
	}
	e.store = s
	return reg
}

// counted is the value of the counter name whose label is value in reg
// (0 when it has not counted).
func counted(t *testing.T, reg *prometheus.Registry, name, label, value string) float64 {
	t.Helper()
	return series(t, reg, name, map[string]string{label: value}).GetCounter().GetValue()
}

// series is the first series of name in reg whose labels include every
// one of labels (nil when there is none).
func series(t *testing.T, reg *prometheus.Registry, name string, labels map[string]string) *dto.Metric {
	t.Helper()
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range mfs {
		if mf.GetName() != name {
			continue
		}
	metrics:
		for _, m := range mf.GetMetric() {
			for _, l := range m.GetLabel() {
				if v, ok := labels[l.GetName()]; ok && v != l.GetValue() {
					continue metrics
				}
			}
			return m
		}
	}
	return nil
}

func (e *env) debit(holder string, gen int64, customer string, amt decimal.Decimal) (admission.Grant, error) {
	return e.store.Debit(context.Background(), admission.DebitRequest{ID: uuid.New(), Holder: holder, Generation: gen,
		Customer: customer, Meter: "calls", Amount: amt})
}

// A debit takes its cost from the customer's, the pool's and the global
// budget, all or nothing, names the budget that refused, and is recorded
// as a grant spent and released at once; after a holder's first, debits
// take one round trip.
func TestDebitTakesEveryBudgetAllOrNothing(t *testing.T) {
	e := newEnv(t)
	reg := e.withRegistry()
	for _, c := range []string{"a", "b", "c"} {
		e.rule(c, "calls", d("10"))
	}
	e.scopeRule(quota.PoolScope("free"), "calls", d("15"))
	e.scopeRule(quota.Global, "calls", d("22"))
	e.putPool("free", "a", "b")

	g, err := e.debit("gw", 1, "a", d("6"))
	if err != nil {
		t.Fatal(err)
	}
	if want := []string{"customer:a", "global", "pool:free"}; fmt.Sprint(g.Budgets) != fmt.Sprint(want) {
		t.Fatalf("debit drew from %v, want %v", g.Budgets, want)
	}
	if !g.Available.Valid || !g.Available.Decimal.Equal(d("4")) {
		t.Fatalf("available after the first debit %v, want a's 4", g.Available)
	}
	if !g.Spent.Equal(d("6")) || g.EndReason != "released" || g.State != "ended" || g.EndedAt == nil {
		t.Fatalf("debit record %+v: want spent 6, released, ended", g)
	}
	stored, err := e.store.Get(context.Background(), g.ID)
	if err != nil || !stored.Spent.Equal(d("6")) || stored.EndReason != "released" {
		t.Fatalf("stored debit %+v, %v", stored, err)
	}
	refused := func(customer, amt, binding, available string) {
		t.Helper()
		_, err := e.debit("gw", 1, customer, d(amt))
		ex, ok := errors.AsType[*admission.BudgetExhaustedError](err)
		if !ok || ex.Binding != binding || !ex.Available.Equal(d(available)) || ex.RetryAfter <= 0 {
			t.Fatalf("debit %s of %s: %v, want refused by %s with %s available, retry after the period's end", customer, amt, err, binding, available)
		}
	}
	refused("a", "5", "customer:a/calls", "4") // the customer's own binds
	refused("b", "10", "pool:free/calls", "9") // the pool's binds: b's own budget is untouched
	if g, err := e.debit("gw", 1, "b", d("9")); err != nil || !g.Available.Valid || !g.Available.Decimal.IsZero() {
		t.Fatalf("debit b 9: %+v, %v; want the pool's 0 left as available", g, err)
	}
	refused("c", "8", "global/calls", "7") // 6 + 9 of 22 taken
	if _, err := e.debit("gw", 1, "c", d("7")); err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct{ scope, want string }{{"pool:free", "15"}, {"global", "22"}} {
		if got := e.scopeConsumed(c.scope, "calls"); !got.Equal(d(c.want)) {
			t.Errorf("%s consumed %s, want %s", c.scope, got, c.want)
		}
	}
	for _, c := range []struct{ customer, want string }{{"a", "6"}, {"b", "9"}, {"c", "7"}} {
		if got := e.budget(c.customer, "calls").Consumed; !got.Equal(d(c.want)) {
			t.Errorf("customer %s consumed %s, want %s", c.customer, got, c.want)
		}
	}
	if n := counted(t, reg, "tally_admission_debits_total", "path", "one_round_trip"); n < 1 {
		t.Errorf("%.0f debits took one round trip, want the ones after each row was known", n)
	}
	if n := counted(t, reg, "tally_admission_debits_total", "path", "batch"); n < 1 {
		t.Errorf("%.0f debits ran as a batch, want the holder's first", n)
	}
}

// A debit sent again with its id takes nothing twice and answers with the
// debit stored; an id stored for something else is refused on the field.
func TestDebitIsTakenOnceByItsID(t *testing.T) {
	e := newEnv(t)
	e.rule("a", "calls", d("10"))
	ctx := context.Background()
	for _, fresh := range []bool{true, false} { // the batch path (a new Store), then one round trip
		if fresh {
			e.store = e.otherProcess()
		}
		req := admission.DebitRequest{ID: uuid.New(), Holder: "gw", Generation: 1, Customer: "a", Meter: "calls", Amount: d("2")}
		first, err := e.store.Debit(ctx, req)
		if err != nil {
			t.Fatal(err)
		}
		again, err := e.store.Debit(ctx, req)
		if err != nil {
			t.Fatal(err)
		}
		if again.ID != first.ID || !again.Spent.Equal(d("2")) {
			t.Fatalf("debit sent again answered %+v, want the first %+v", again, first)
		}
		req.Amount = d("3")
		_, err = e.store.Debit(ctx, req)
		if fe, ok := errors.AsType[*admission.FieldError](err); !ok || fe.Field != "id" {
			t.Fatalf("id reused for another amount: %v, want a field error on id", err)
		}
	}
	if got := e.budget("a", "calls").Consumed; !got.Equal(d("4")) {
		t.Fatalf("consumed %s after two debits of 2, each sent twice: want 4", got)
	}
}

// A debit is fenced by its holder's generation as a grant is.
func TestDebitOfAnOlderGenerationIsRefused(t *testing.T) {
	e := newEnv(t)
	e.rule("a", "calls", d("10"))
	if _, err := e.debit("gw", 2, "a", d("1")); err != nil {
		t.Fatal(err)
	}
	for range 2 { // once after this Store saw generation 2, once from another process
		_, err := e.debit("gw", 1, "a", d("1"))
		if _, ok := errors.AsType[*admission.StaleGenerationError](err); !ok {
			t.Fatalf("debit of generation 1 after 2: %v, want a stale generation", err)
		}
		e.store = e.otherProcess()
	}
	if got := e.budget("a", "calls").Consumed; !got.Equal(d("1")) {
		t.Fatalf("consumed %s, want 1", got)
	}
}

// A rule change, or a customer joining a pool, between two debits is seen
// by the second: the row is brought to the new version and the pool is
// drawn from.
func TestDebitSeesRuleAndMembershipChanges(t *testing.T) {
	e := newEnv(t)
	e.rule("a", "calls", d("10"))
	e.scopeRule(quota.PoolScope("free"), "calls", d("4"))
	if _, err := e.debit("gw", 1, "a", d("5")); err != nil {
		t.Fatal(err)
	}
	e.rule("a", "calls", d("7"))
	_, err := e.debit("gw", 1, "a", d("3"))
	if ex, ok := errors.AsType[*admission.BudgetExhaustedError](err); !ok || !ex.Available.Equal(d("2")) {
		t.Fatalf("debit of 3 after the limit fell to 7 with 5 consumed: %v, want refused with 2 available", err)
	}
	e.putPool("free", "a")
	// The pool's rows count a's 5 when it joins: a's debits are refused by
	// the pool now.
	_, err = e.debit("gw", 1, "a", d("1"))
	if ex, ok := errors.AsType[*admission.BudgetExhaustedError](err); !ok || ex.Binding != "pool:free/calls" {
		t.Fatalf("debit after joining a pool with 4 of a's 5 over: %v, want refused by pool:free", err)
	}
}

// Concurrent debits and grants of several holders on shared budgets never
// take more than a limit, never deadlock, and leave every consumed equal to
// what was debited plus what released grants spent.
func TestConcurrentDebitsAndGrantsStayWithinEveryLimit(t *testing.T) {
	e := newEnv(t)
	e.rule("a", "calls", d("50"))
	e.rule("b", "calls", d("50"))
	e.scopeRule(quota.Global, "calls", d("70"))
	ctx := context.Background()
	var mu sync.Mutex
	taken := map[string]decimal.Decimal{}
	var wg sync.WaitGroup
	for w := range 6 {
		wg.Go(func() {
			holder := fmt.Sprintf("gw%d", w)
			for i := range 30 {
				customer := []string{"a", "b"}[(w+i)%2]
				if w%3 == 0 {
					g, err := e.store.Issue(ctx, admission.IssueRequest{Holder: holder, Generation: 1, Customer: customer,
						Meter: "calls", Amount: d("2")})
					if err != nil {
						continue
					}
					if _, err := e.store.Release(ctx, admission.Report{Grant: g.ID, Holder: holder, Generation: 1, Spent: d("1")}); err != nil {
						t.Error(err)
						return
					}
					mu.Lock()
					taken[customer] = taken[customer].Add(d("1"))
					mu.Unlock()
					continue
				}
				if _, err := e.debit(holder, 1, customer, d("1")); err != nil {
					if _, ok := errors.AsType[*admission.BudgetExhaustedError](err); !ok {
						t.Error(err)
						return
					}
					continue
				}
				mu.Lock()
				taken[customer] = taken[customer].Add(d("1"))
				mu.Unlock()
			}
		})
	}
	wg.Wait()
	total := decimal.Zero
	for _, c := range []string{"a", "b"} {
		got := e.budget(c, "calls").Consumed
		if !got.Equal(taken[c]) || got.GreaterThan(d("50")) {
			t.Errorf("customer %s consumed %s, admitted %s (limit 50)", c, got, taken[c])
		}
		total = total.Add(got)
	}
	if g := e.scopeConsumed("global", "calls"); !g.Equal(total) || g.GreaterThan(d("70")) {
		t.Errorf("global consumed %s, customers %s (limit 70)", g, total)
	}
}

func TestDebitRequestValidation(t *testing.T) {
	e := newEnv(t)
	_, err := e.store.Debit(context.Background(), admission.DebitRequest{Holder: "gw", Generation: 1, Customer: "a", Meter: "calls",
		Amount: d("-1")})
	var fields []string
	for _, f := range []string{"id", "amount"} {
		if fe := fieldNamed(err, f); fe == nil {
			t.Errorf("no error on %s in %v", f, err)
		} else {
			fields = append(fields, fe.Field)
		}
	}
	if len(fields) != 2 {
		t.Fatalf("errors %v", err)
	}
}

func fieldNamed(err error, field string) *admission.FieldError {
	var joined interface{ Unwrap() []error }
	if errors.As(err, &joined) {
		for _, e := range joined.Unwrap() {
			if fe, ok := errors.AsType[*admission.FieldError](e); ok && fe.Field == field {
				return fe
			}
		}
	}
	return nil
}

// A debit sent again after it took the budget's last units answers with
// the debit stored, not with a refusal: in one round trip, and after a
// rule change sends it through an issue transaction of its own.
func TestDebitSentAgainOnAnExhaustedBudgetIsTheDebitStored(t *testing.T) {
	e := newEnv(t)
	e.rule("a", "calls", d("3"))
	ctx := context.Background()
	if _, err := e.debit("gw", 1, "a", d("1")); err != nil { // the holder's first: the rows are known from here
		t.Fatal(err)
	}
	req := admission.DebitRequest{ID: uuid.New(), Holder: "gw", Generation: 1, Customer: "a", Meter: "calls", Amount: d("2")}
	first, err := e.store.Debit(ctx, req)
	if err != nil {
		t.Fatal(err)
	}
	for _, step := range []string{"one round trip", "after a rule change"} {
		if step == "after a rule change" {
			e.clock.Advance(time.Second)
			e.rule("a", "calls", d("3"))
		}
		again, err := e.store.Debit(ctx, req)
		if err != nil || again.ID != first.ID {
			t.Fatalf("%s: the debit sent again on the exhausted budget answered %+v %v, want the debit stored", step, again, err)
		}
	}
	if got := e.budget("a", "calls").Consumed; !got.Equal(d("3")) {
		t.Fatalf("consumed %s, want 3", got)
	}
}

// A plan older than a second is still used while it is made again beside
// the request, but never decides: a global rule that turned exact since is
// drawn from by the very next grant and debit, whatever the plan said.
func TestAPlanPastItsTTLNeverDecides(t *testing.T) {
	e := newEnv(t)
	e.rule("a", "calls", d("100"))
	if _, err := e.issue("gw", "a", d("1")); err != nil {
		t.Fatal(err)
	}
	if _, err := e.debit("gw", 1, "a", d("1")); err != nil {
		t.Fatal(err)
	}
	e.clock.Advance(2 * time.Second) // past the plan's TTL, within its age
	e.scopeRule(quota.Global, "calls", d("50"))
	g, err := e.issue("gw", "a", d("1"))
	if err != nil || fmt.Sprint(g.Budgets) != "[customer:a global]" {
		t.Fatalf("grant after a global rule turned exact: %+v %v, want drawn from customer:a and global", g, err)
	}
	e.clock.Advance(2 * time.Second)
	e.scopeRule(quota.Global, "calls", d("60"))
	g, err = e.debit("gw", 1, "a", d("1"))
	if err != nil || fmt.Sprint(g.Budgets) != "[customer:a global]" {
		t.Fatalf("debit after the global rule changed: %+v %v", g, err)
	}
	if got := e.scopeConsumed("global", "calls"); !got.Equal(d("4")) {
		// Bringing the global row counted a's 2 before it; then 1 and 1.
		t.Fatalf("global consumed %s, want 4", got)
	}
}

// A rate rule that comes into force after the Store planned a customer's
// debits (its plans are reused for a second or more) is seen by the
// one-round-trip debit's own check: the debit goes the way a rate budget
// takes, and the bucket's burst is all it admits.
func TestDebitSeesARateRuleItsPlanDoesNot(t *testing.T) {
	e := newEnv(t)
	e.rule("a", "calls", d("100"))
	if _, err := e.debit("gw", 1, "a", d("1")); err != nil { // planned: no rate budget
		t.Fatal(err)
	}
	e.rateRule(quota.Global, "calls", "1", "1h", "1", 0, e.clock.Now())
	if _, err := e.debit("gw", 1, "a", d("1")); err != nil {
		t.Fatalf("first debit under a global rate of 1 an hour, burst 1: %v", err)
	}
	_, err := e.debit("gw", 1, "a", d("1"))
	if _, ok := errors.AsType[*admission.BudgetExhaustedError](err); !ok {
		t.Fatalf("second debit under a global rate of 1 an hour, burst 1: %v; want refused", err)
	}
	if b := e.budget("a", "calls"); !b.Consumed.Equal(d("2")) {
		t.Fatalf("a's budget %+v, want the two debits admitted", b)
	}
}
