package reconcile_test

import (
	"context"
	"fmt"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/shopspring/decimal"

	"github.com/tally-ledger/tally/admission"
	"github.com/tally-ledger/tally/internal/pgtest"
	"github.com/tally-ledger/tally/ledger"
	"github.com/tally-ledger/tally/quota"
	"github.com/tally-ledger/tally/reconcile"
)

// statements counts the statements sent on the connections of a pool.
type statements struct{ n atomic.Int64 }

func (s *statements) TraceQueryStart(ctx context.Context, _ *pgx.Conn, _ pgx.TraceQueryStartData) context.Context {
	s.n.Add(1)
	return ctx
}

func (s *statements) TraceQueryEnd(context.Context, *pgx.Conn, pgx.TraceQueryEndData) {}

// tracedEnv is newEnv on a pool whose statements are counted.
func tracedEnv(t *testing.T) (*env, *statements) {
	cfg, err := pgxpool.ParseConfig(pgtest.NewURL(t))
	if err != nil {
		t.Fatal(err)
	}
	st := &statements{}
	cfg.ConnConfig.Tracer = st
	pool, err := pgxpool.NewWithConfig(context.Background(), cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pool.Close)
	e := &env{t: t, pool: pool, now: time.Date(2026, 11, 20, 12, 0, 0, 0, time.UTC)}
	clock := func() time.Time { return e.now }
	if e.l, err = ledger.New(ledger.Config{Clock: clock}); err != nil {
		t.Fatal(err)
	}
	if e.rc, err = reconcile.New(reconcile.Config{Pool: pool, Clock: clock}); err != nil {
		t.Fatal(err)
	}
	return e, st
}

// TestRunStatementsDoNotGrowWithExactBudgets: a run is set-based over its
// customers, so the number of statements it sends does not depend on how
// many customers have an exact budget (the billed usage of each budget was
// once read by a statement of its own).
func TestRunStatementsDoNotGrowWithExactBudgets(t *testing.T) {
	e, st := tracedEnv(t)
	ctx := context.Background()
	s, err := admission.New(e.pool, admission.Config{Now: func() time.Time { return e.now }})
	if err != nil {
		t.Fatal(err)
	}
	budget := func(c string) {
		if _, err := quota.PutRuleDB(ctx, e.pool, quota.RuleInput{Customer: c, Meter: "calls", Limit: decimal.NewFromInt(100),
			Admission: quota.Exact, EffectiveAt: time.Date(2026, 11, 1, 0, 0, 0, 0, time.UTC), Actor: "test"}); err != nil {
			t.Fatal(err)
		}
		e.apply(rec("gw", 1, c, 1, "10", "10", nov))
		if _, err := s.Issue(ctx, admission.IssueRequest{Holder: "gw1", Generation: 1, Customer: c, Meter: "calls",
			Amount: decimal.NewFromInt(20)}); err != nil {
			t.Fatal(err)
		}
	}
	count := func() int64 {
		before := st.n.Load()
		r := e.run(reconcile.Options{Period: "2026-11-01"})
		if r.Status != reconcile.StatusClean {
			t.Fatalf("status %s: %+v", r.Status, r.Findings)
		}
		return st.n.Load() - before
	}
	budget("c0")
	one := count()
	for i := 1; i < 6; i++ {
		budget(fmt.Sprintf("c%d", i))
	}
	if six := count(); six != one {
		t.Errorf("a run sent %d statements for 1 customer with an exact budget, %d for 6", one, six)
	}
}
