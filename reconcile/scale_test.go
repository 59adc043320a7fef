package reconcile_test

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/shopspring/decimal"

	"github.com/tally-ledger/tally/admission"
	"github.com/tally-ledger/tally/internal/pgtest"
	"github.com/tally-ledger/tally/ledger"
	"github.com/tally-ledger/tally/periods"
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

// TestNightlyReportsProgressAndStopsWhenCancelled: on a terminal, the
// nightly job says which period it is at and how far its closes are; an
// interrupted job stops where it is (no further period is run), what it
// closed stays closed, and running it again closes the rest.
func TestNightlyReportsProgressAndStopsWhenCancelled(t *testing.T) {
	e := newEnv(t) // 2026-11-20 12:00
	e.exec(`INSERT INTO customers (id, schedule, created_at) SELECT c, '[{"effective_from":"0001-01-01T00:00:00Z","calendar":{"cadence":"monthly","anchor_day":1,"anchor_time":"00:00","zone":"UTC"}}]', '2026-09-01'
	        FROM unnest(ARRAY['a', 'b', 'c']) c`)
	for i, c := range []string{"a", "b", "c"} {
		e.apply(rec("gw", 1, c, 1, "10", "10", time.Date(2026, 10, 5+i, 0, 0, 0, 0, time.UTC)))
	}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	var progress bytes.Buffer
	rc, err := reconcile.New(reconcile.Config{Pool: e.pool, Clock: func() time.Time { return e.now }, Progress: &progress,
		Logger: slog.New(onMessage{"period closed", cancel})})
	if err != nil {
		t.Fatal(err)
	}
	runs, err := rc.Nightly(ctx)
	if !errors.Is(err, context.Canceled) {
		t.Fatalf("interrupted nightly job: %v, want context.Canceled", err)
	}
	if strings.Count(err.Error(), "context canceled") != 1 {
		t.Errorf("interrupted nightly job went on with the periods after the interruption:\n%v", err)
	}
	if len(runs) != 1 || runs[0].Period != "2026-09-01" {
		t.Errorf("runs of the interrupted job: %d, want the September one only", len(runs))
	}
	for _, want := range []string{"period 1/3: 2026-09-01", "closing 2026-09-01: 1 of 3 clean periods closed"} {
		if !strings.Contains(progress.String(), want) {
			t.Errorf("progress lacks %q:\n%s", want, progress.String())
		}
	}
	progress.Reset()
	rc, err = reconcile.New(reconcile.Config{Pool: e.pool, Clock: func() time.Time { return e.now }, Progress: &progress})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := rc.Nightly(context.Background()); err != nil {
		t.Fatal(err)
	}
	for _, c := range []string{"a", "b", "c"} {
		if s := e.closedState(c, "2026-10-01"); s != periods.Closed {
			t.Errorf("%s's October after the job ran again: %s", c, s)
		}
	}
	for _, want := range []string{"period 1/3: 2026-09-01", "closing 2026-09-01: 2 of 2 clean periods closed", "closing 2026-10-01: 3 of 3 clean periods closed", "period 3/3: current"} {
		if !strings.Contains(progress.String(), want) {
			t.Errorf("progress lacks %q:\n%s", want, progress.String())
		}
	}
}

// onMessage is a log handler that calls f when a record with message msg
// is logged.
type onMessage struct {
	msg string
	f   func()
}

func (h onMessage) Enabled(context.Context, slog.Level) bool { return true }
func (h onMessage) Handle(_ context.Context, r slog.Record) error {
	if r.Message == h.msg {
		h.f()
	}
	return nil
}
func (h onMessage) WithAttrs([]slog.Attr) slog.Handler { return h }
func (h onMessage) WithGroup(string) slog.Handler      { return h }
