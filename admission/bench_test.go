package admission_test

import (
	"context"
	"fmt"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/shopspring/decimal"

	"github.com/tally-ledger/tally/admission"
	"github.com/tally-ledger/tally/internal/pgcpu"
	"github.com/tally-ledger/tally/internal/pgtest"
	"github.com/tally-ledger/tally/pools"
	"github.com/tally-ledger/tally/quota"
)

// BenchmarkIssueHotBudget issues grants from one budget with 50 concurrent
// holders (alone, and each released at once), and reports operations/s.
// issue-customer-pool-global: each holder serves its own customer, all in
// one pool, every grant drawing from the customer's, the pool's and the
// one global budget (the hot row). Its baseline, measured in the same run
// on the same pool, is a central counter: one UPDATE ... RETURNING on the
// budget row per call, the cheapest exact check Postgres can do when every
// request takes its own transaction.
//
//	go test -run '^$' -bench HotBudget -benchtime 3000x ./admission
func BenchmarkIssueHotBudget(b *testing.B) {
	url := pgtest.NewURL(b)
	cfg, err := pgxpool.ParseConfig(url)
	if err != nil {
		b.Fatal(err)
	}
	cfg.MaxConns = 50
	pool, err := pgxpool.NewWithConfig(context.Background(), cfg)
	if err != nil {
		b.Fatal(err)
	}
	defer pool.Close()
	c := &clock{t: time.Now().UTC()}
	s, err := admission.New(pool, admission.Config{Now: c.Now})
	if err != nil {
		b.Fatal(err)
	}
	e := &env{t: b, pool: pool, clock: c, store: s}
	e.rule("acme", "tokens", decimal.NewFromInt(1_000_000_000))
	ctx := context.Background()
	const holders = 50

	run := func(b *testing.B, op func(h int) error) {
		var next atomic.Int64
		var wg sync.WaitGroup
		lat := make([][]time.Duration, holders)
		start := time.Now()
		for h := range holders {
			wg.Go(func() {
				for next.Add(1) <= int64(b.N) {
					t := time.Now()
					if err := op(h); err != nil {
						b.Error(err)
						return
					}
					lat[h] = append(lat[h], time.Since(t))
				}
			})
		}
		wg.Wait()
		b.ReportMetric(float64(b.N)/time.Since(start).Seconds(), "ops/s")
		all := slices.Concat(lat...)
		slices.Sort(all)
		if len(all) > 0 {
			b.ReportMetric(float64(all[len(all)*99/100].Microseconds())/1000, "p99-ms")
		}
	}
	b.Run("issue", func(b *testing.B) {
		run(b, func(h int) error {
			_, err := s.Issue(ctx, admission.IssueRequest{Holder: fmt.Sprintf("h%d", h), Generation: 1, Customer: "acme", Meter: "tokens", Amount: decimal.NewFromInt(1)})
			return err
		})
	})
	b.Run("issue+release", func(b *testing.B) {
		run(b, func(h int) error {
			holder := fmt.Sprintf("h%d", h)
			g, err := s.Issue(ctx, admission.IssueRequest{Holder: holder, Generation: 1, Customer: "acme", Meter: "tokens", Amount: decimal.NewFromInt(100)})
			if err != nil {
				return err
			}
			_, err = s.Release(ctx, admission.Report{Grant: g.ID, Holder: holder, Generation: 1, Spent: decimal.NewFromInt(100)})
			return err
		})
	})
	var members []string
	for h := range holders {
		c := fmt.Sprintf("cust%d", h)
		e.rule(c, "calls", decimal.NewFromInt(1_000_000_000))
		members = append(members, c)
	}
	if _, err := s.PutPool(ctx, pools.PutInput{Name: "all", Members: members, Actor: "bench"}); err != nil {
		b.Fatal(err)
	}
	e.scopeRule(quota.PoolScope("all"), "calls", decimal.NewFromInt(1_000_000_000))
	e.scopeRule(quota.Global, "calls", decimal.NewFromInt(1_000_000_000))
	b.Run("issue-customer-pool-global", func(b *testing.B) {
		run(b, func(h int) error {
			g, err := s.Issue(ctx, admission.IssueRequest{Holder: fmt.Sprintf("h%d", h), Generation: 1, Customer: members[h], Meter: "calls", Amount: decimal.NewFromInt(1)})
			if err == nil && len(g.Budgets) != 3 {
				err = fmt.Errorf("drew from %v", g.Budgets)
			}
			return err
		})
	})
	b.Run("baseline-central-counter", func(b *testing.B) {
		run(b, func(int) error {
			var consumed string
			return pool.QueryRow(ctx, `UPDATE admission_budgets SET consumed = consumed + 1
				WHERE customer = 'acme' AND meter = 'tokens' AND consumed + 1 <= "limit" RETURNING consumed::text`).Scan(&consumed)
		})
	})
}

// BenchmarkDebit debits one unit at a time from one customer's and the
// global budget, one caller, and its baseline in the same run: the central
// counter's one UPDATE ... RETURNING per request. It reports the time of
// one debit against one counter statement, which is what a gateway waits
// for on a tight budget, and the WAL each writes (wal-B/op; the server's
// WAL is shared, so other databases' writes meanwhile count too).
//
//	go test -run '^$' -bench 'BenchmarkDebit$' -benchtime 2000x ./admission
func BenchmarkDebit(b *testing.B) {
	e := newEnv(b)
	e.clock.t = time.Now().UTC()
	e.rule("acme", "tokens", decimal.NewFromInt(1_000_000_000))
	e.scopeRule(quota.Global, "tokens", decimal.NewFromInt(1_000_000_000))
	ctx := context.Background()
	if _, err := e.pool.Exec(ctx, `CREATE TABLE bench_counter (k text PRIMARY KEY, used bigint NOT NULL, lim bigint NOT NULL);
		INSERT INTO bench_counter VALUES ('acme', 0, 1000000000)`); err != nil {
		b.Fatal(err)
	}
	debit := func() error {
		_, err := e.store.Debit(ctx, admission.DebitRequest{ID: uuid.New(), Holder: "gw", Generation: 1, Customer: "acme",
			Meter: "tokens", Amount: decimal.NewFromInt(1)})
		return err
	}
	if err := debit(); err != nil { // the holder's first: its rows are known from here
		b.Fatal(err)
	}
	walAt := func() int64 {
		var n int64
		if err := e.pool.QueryRow(ctx, `SELECT pg_current_wal_lsn() - '0/0'`).Scan(&n); err != nil {
			b.Fatal(err)
		}
		return n
	}
	run := func(b *testing.B, op func() error) {
		if _, err := e.pool.Exec(ctx, "CHECKPOINT"); err != nil {
			b.Fatal(err)
		}
		from := walAt()
		pg0, _, pgOK := pgcpu.Database(ctx, e.pool, "")
		for b.Loop() {
			if err := op(); err != nil {
				b.Fatal(err)
			}
		}
		b.ReportMetric(float64(walAt()-from)/float64(b.N), "wal-B/op")
		// Postgres's CPU (its backends' own, from /proc, when it runs on
		// this host): what the machine's load moves least.
		if pg1, _, ok := pgcpu.Database(ctx, e.pool, ""); ok && pgOK {
			b.ReportMetric(float64((pg1-pg0).Microseconds())/float64(b.N), "pg-cpu-µs/op")
		}
	}
	b.Run("debit", func(b *testing.B) { run(b, debit) })
	b.Run("counter", func(b *testing.B) {
		run(b, func() error {
			var used int64
			return e.pool.QueryRow(ctx, `UPDATE bench_counter SET used = used + 1 WHERE k = 'acme' AND used + 1 <= lim RETURNING used`).Scan(&used)
		})
	})
}
