package chaosbench

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"sync"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/shopspring/decimal"

	"github.com/tally-ledger/tally/admission"
	"github.com/tally-ledger/tally/internal/faultproxy"
	"github.com/tally-ledger/tally/quota"
)

// The grant path under the same faults: Gateways gateways race for exact
// grants of one customer's budget through an admission store whose Postgres
// link goes through a proxy of its own (faults api-reset, api-blackhole,
// and postgres-restart cut it too). Each gateway admits a random part of
// every grant it is answered and releases the grant with that as spent. At
// the end: Σ admitted over all gateways ≤ the limit, the budget's consumed ≤
// the limit, and every grant a gateway was answered is stored with its
// amount (none lost by a restart after it was answered).

const (
	grantCustomer = "chaos-quota"
	grantMeter    = "api_calls"
)

type gateways struct {
	proxy *faultproxy.Proxy
	pool  *pgxpool.Pool
	store *admission.Store
	limit decimal.Decimal

	mu         sync.Mutex
	admitted   decimal.Decimal
	answered   map[uuid.UUID]decimal.Decimal // grant → amount answered
	refused    int                           // budget exhausted
	failed     int                           // any other error (a fault)
	unreleased int                           // releases lost to a fault (the grant is reclaimed whole)

	cancel context.CancelFunc
	wg     sync.WaitGroup
}

// startGateways puts the exact rule in place through check (not proxied)
// and starts n gateways.
func startGateways(ctx context.Context, cfg Config, check *pgxpool.Pool, pgTarget string, n int) (*gateways, error) {
	limit := cfg.GrantLimit
	if _, err := quota.PutRuleDB(ctx, check, quota.RuleInput{Customer: grantCustomer, Meter: grantMeter, Limit: limit,
		Admission: quota.Exact, Actor: "tally bench chaos"}); err != nil {
		return nil, fmt.Errorf("chaos: exact rule: %w", err)
	}
	p, err := faultproxy.Start(pgTarget)
	if err != nil {
		return nil, err
	}
	pool, err := pgxpool.New(ctx, proxiedURL(cfg.DatabaseURL, p.Addr()))
	if err != nil {
		p.Close()
		return nil, err
	}
	s, err := admission.New(pool, admission.Config{Logger: cfg.Logger})
	if err != nil {
		pool.Close()
		p.Close()
		return nil, err
	}
	g := &gateways{proxy: p, pool: pool, store: s, limit: limit, answered: map[uuid.UUID]decimal.Decimal{}}
	gctx, cancel := context.WithCancel(context.WithoutCancel(ctx))
	g.cancel = cancel
	for i := range n {
		g.wg.Add(1)
		go func() {
			defer g.wg.Done()
			g.run(gctx, fmt.Sprintf("chaos-gateway-%d", i), rand.New(rand.NewPCG(cfg.Seed, uint64(i))))
		}()
	}
	return g, nil
}

func (g *gateways) run(ctx context.Context, holder string, rng *rand.Rand) {
	for ctx.Err() == nil {
		amount := decimal.NewFromInt(1 + rng.Int64N(5))
		ictx, cancel := context.WithTimeout(ctx, 3*time.Second)
		gr, err := g.store.Issue(ictx, admission.IssueRequest{Holder: holder, Generation: 1, Customer: grantCustomer, Meter: grantMeter,
			Amount: amount, MinAmount: decimal.NewNullDecimal(decimal.NewFromInt(1)), TTL: 2 * time.Second})
		cancel()
		var exhausted *admission.BudgetExhaustedError
		switch {
		case err == nil:
		case errors.As(err, &exhausted):
			g.count(&g.refused)
			sleep(ctx, 50*time.Millisecond)
			continue
		default:
			g.count(&g.failed)
			sleep(ctx, 20*time.Millisecond)
			continue
		}
		// The gateway admits up to the grant's amount: a random part of it.
		spent := decimal.NewFromInt(rng.Int64N(gr.Amount.IntPart() + 1))
		g.mu.Lock()
		g.answered[gr.ID] = gr.Amount
		g.admitted = g.admitted.Add(spent)
		g.mu.Unlock()
		rctx, cancel := context.WithTimeout(ctx, 3*time.Second)
		// A release lost to a fault leaves the grant counted whole until
		// it is reclaimed: never more capacity, only less.
		if _, err := g.store.Release(rctx, admission.Report{Grant: gr.ID, Holder: holder, Generation: 1, Spent: spent}); err != nil {
			g.count(&g.unreleased)
		}
		cancel()
		// Paced, so that a long schedule keeps racing near the limit.
		sleep(ctx, time.Duration(20+rng.IntN(60))*time.Millisecond)
	}
}

func (g *gateways) count(n *int) {
	g.mu.Lock()
	*n++
	g.mu.Unlock()
}

func sleep(ctx context.Context, d time.Duration) {
	select {
	case <-ctx.Done():
	case <-time.After(d):
	}
}

func (g *gateways) stop() {
	if g.cancel != nil {
		g.cancel()
		g.wg.Wait()
		g.cancel = nil
	}
}

func (g *gateways) close() {
	g.stop()
	g.proxy.Pass()
	g.pool.Close()
	g.proxy.Close()
}

// GrantReport is what the racing gateways did.
type GrantReport struct {
	Granted  int             // grants answered
	Admitted decimal.Decimal // Σ admitted by the gateways
	Limit    decimal.Decimal
	Consumed decimal.Decimal // the budget's, at the end
	Refused  int             // budget exhausted
	Failed   int             // errors under faults
	// Unreleased grants lost their release to a fault: each counts whole
	// until it is reclaimed, so consumed may exceed what was admitted.
	Unreleased int
}

// check stops the gateways and checks the grant path's invariants through
// check (not proxied).
func (g *gateways) check(ctx context.Context, check *pgxpool.Pool) (GrantReport, []string, error) {
	g.stop()
	s, err := admission.New(check, admission.Config{})
	if err != nil {
		return GrantReport{}, nil, err
	}
	g.mu.Lock()
	defer g.mu.Unlock()
	rep := GrantReport{Granted: len(g.answered), Admitted: g.admitted, Limit: g.limit, Refused: g.refused, Failed: g.failed,
		Unreleased: g.unreleased}
	var problems []string
	if g.admitted.GreaterThan(g.limit) {
		problems = append(problems, fmt.Sprintf("over-admission: the gateways admitted %s against a limit of %s", g.admitted, g.limit))
	}
	bs, err := s.Budgets(ctx, grantCustomer)
	if err != nil {
		return rep, nil, err
	}
	for _, b := range bs {
		if b.Meter == grantMeter {
			rep.Consumed = b.Consumed
		}
	}
	if rep.Consumed.GreaterThan(g.limit) {
		problems = append(problems, fmt.Sprintf("over-admission: the budget consumed %s against a limit of %s", rep.Consumed, g.limit))
	}
	lost := 0
	for id, amount := range g.answered {
		gr, err := s.Get(ctx, id)
		if err != nil || !gr.Amount.Equal(amount) {
			lost++
		}
	}
	if lost > 0 {
		problems = append(problems, fmt.Sprintf("%d of %d grants answered to a gateway are not stored with their amount", lost, len(g.answered)))
	}
	return rep, problems, nil
}
