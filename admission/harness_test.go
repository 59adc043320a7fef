package admission_test

import (
	"context"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/shopspring/decimal"
	"go.uber.org/goleak"

	"github.com/tally-ledger/tally/admission"
	"github.com/tally-ledger/tally/internal/pgtest"
	"github.com/tally-ledger/tally/quota"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// clock is a settable clock shared by the store and the test.
type clock struct {
	mu sync.Mutex
	t  time.Time
}

func (c *clock) Now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.t
}

func (c *clock) Advance(d time.Duration) {
	c.mu.Lock()
	c.t = c.t.Add(d)
	c.mu.Unlock()
}

type env struct {
	t     testing.TB
	pool  *pgxpool.Pool
	clock *clock
	store *admission.Store
}

func newEnv(t testing.TB) *env {
	t.Helper()
	pool := pgtest.New(t)
	c := &clock{t: time.Date(2026, 12, 3, 10, 0, 0, 0, time.UTC)}
	s, err := admission.New(pool, admission.Config{Now: c.Now})
	if err != nil {
		t.Fatal(err)
	}
	return &env{t: t, pool: pool, clock: c, store: s}
}

// rule stores a new exact rule version effective at the clock's now.
func (e *env) rule(customer, meter string, limit decimal.Decimal) {
	e.t.Helper()
	if err := e.putLimit(quota.CustomerScope(customer), meter, limit); err != nil {
		e.t.Fatalf("put rule: %v", err)
	}
}

// putLimit stores a new exact rule version with limit, effective at the
// clock's now, for a customer ("customer:<id>"), a pool or the global
// scope.
func (e *env) putLimit(scope, meter string, limit decimal.Decimal) error {
	ctx := context.Background()
	if c, ok := rateCustomerOf(scope); ok {
		_, err := quota.PutRuleDB(ctx, e.pool, quota.RuleInput{Customer: c, Meter: meter, Limit: limit,
			Admission: quota.Exact, EffectiveAt: e.clock.Now(), Actor: "test"})
		return err
	}
	return pgx.BeginFunc(ctx, e.pool, func(tx pgx.Tx) error {
		_, err := quota.PutScopeRuleAt(ctx, tx, quota.ScopeRuleInput{Scope: scope, Meter: meter, Limit: limit,
			Admission: quota.Exact, Actor: "test"}, e.clock.Now())
		return err
	})
}

// lockWaiters counts the test database's sessions waiting for a lock
// (of wait event event; any, when "").
func (e *env) lockWaiters(event string) int {
	e.t.Helper()
	var n int
	if err := e.pool.QueryRow(context.Background(), `SELECT count(*) FROM pg_stat_activity
		WHERE datname = current_database() AND wait_event_type = 'Lock' AND ($1 = '' OR wait_event = $1)`, event).Scan(&n); err != nil {
		e.t.Fatal(err)
	}
	return n
}

func d(s string) decimal.Decimal { return decimal.RequireFromString(s) }

// otherProcess is a second Store on the same database and clock: another
// API process.
func (e *env) otherProcess() *admission.Store {
	e.t.Helper()
	s, err := admission.New(e.pool, admission.Config{Now: e.clock.Now})
	if err != nil {
		e.t.Fatal(err)
	}
	return s
}

// holding begins a transaction that runs lock (a statement taking row
// locks) and holds them until it ends; it is rolled back at the test's
// end if still open.
func (e *env) holding(lock string) pgx.Tx {
	e.t.Helper()
	ctx := context.Background()
	tx, err := e.pool.Begin(ctx)
	if err != nil {
		e.t.Fatal(err)
	}
	e.t.Cleanup(func() { _ = tx.Rollback(ctx) })
	if _, err := tx.Exec(ctx, lock); err != nil {
		e.t.Fatal(err)
	}
	return tx
}

// budgetOrZero is the budget, or a zero one before its first grant.
func (e *env) budgetOrZero(customer, meter string) admission.Budget {
	e.t.Helper()
	bs, err := e.store.Budgets(context.Background(), customer)
	if err != nil {
		e.t.Fatal(err)
	}
	for _, b := range bs {
		if b.Meter == meter {
			return b
		}
	}
	return admission.Budget{}
}

func (e *env) budget(customer, meter string) admission.Budget {
	e.t.Helper()
	bs, err := e.store.Budgets(context.Background(), customer)
	if err != nil {
		e.t.Fatal(err)
	}
	for _, b := range bs {
		if b.Meter == meter {
			return b
		}
	}
	e.t.Fatalf("no budget %s/%s in %+v", customer, meter, bs)
	return admission.Budget{}
}
