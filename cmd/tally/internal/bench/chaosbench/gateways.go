package chaosbench

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"strings"
	"sync"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/shopspring/decimal"

	"github.com/tally-ledger/tally/admission"
	"github.com/tally-ledger/tally/internal/faultproxy"
	"github.com/tally-ledger/tally/quota"
	"github.com/tally-ledger/tally/tokens"
)

// The grant path under the same faults: Gateways gateways race for exact
// grants of one customer's budget through the REST API of an API process
// (tally serve --api, with Config.Process; each gateway with its own gateway
// token) or else an admission store in process, whose Postgres link goes
// through a proxy of its own (faults api-reset, api-blackhole, and
// postgres-restart cut it too). Each gateway admits a random part of
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
	pool  *pgxpool.Pool // in process only
	api   *process      // the API process, with Config.Process
	path  grantPath
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
func (r *run) startGateways(ctx context.Context, check *pgxpool.Pool, n int) (*gateways, error) {
	cfg := r.cfg
	limit := cfg.GrantLimit
	if _, err := quota.PutRuleDB(ctx, check, quota.RuleInput{Customer: grantCustomer, Meter: grantMeter, Limit: limit,
		Admission: quota.Exact, Actor: "tally bench chaos"}); err != nil {
		return nil, fmt.Errorf("chaos: exact rule: %w", err)
	}
	p, err := faultproxy.Start(cfg.PostgresTarget)
	if err != nil {
		return nil, err
	}
	g := &gateways{proxy: p, limit: limit, answered: map[uuid.UUID]decimal.Decimal{}}
	if cfg.Process != nil {
		tokens := map[string]string{}
		for i := range n {
			h := holderName(i)
			_, secret, err := createGatewayToken(ctx, check, h)
			if err != nil {
				p.Close()
				return nil, fmt.Errorf("chaos: gateway token: %w", err)
			}
			tokens[h] = secret
		}
		api, err := r.spawn(ProcessSpec{API: true, DatabaseURL: proxiedURL(cfg.DatabaseURL, p.Addr())}, adminToken())
		if err != nil {
			p.Close()
			return nil, err
		}
		g.api = api
		if err := waitReady(ctx, api, 30*time.Second); err != nil {
			g.close()
			return nil, err
		}
		g.path = newRESTPath(api.spec.Listen, tokens)
	} else {
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
		g.pool, g.path = pool, storePath{s}
	}
	gctx, cancel := context.WithCancel(context.WithoutCancel(ctx))
	g.cancel = cancel
	for i := range n {
		g.wg.Add(1)
		go func() {
			defer g.wg.Done()
			g.run(gctx, holderName(i), rand.New(rand.NewPCG(cfg.Seed, uint64(i))))
		}()
	}
	return g, nil
}

func (g *gateways) run(ctx context.Context, holder string, rng *rand.Rand) {
	for ctx.Err() == nil {
		amount := decimal.NewFromInt(1 + rng.Int64N(5))
		ictx, cancel := context.WithTimeout(ctx, 3*time.Second)
		id, granted, exhausted, err := g.path.issue(ictx, holder, amount)
		cancel()
		switch {
		case err == nil && !exhausted:
		case exhausted:
			g.count(&g.refused)
			sleep(ctx, 50*time.Millisecond)
			continue
		default:
			g.count(&g.failed)
			sleep(ctx, 20*time.Millisecond)
			continue
		}
		// The gateway admits up to the grant's amount: a random part of it.
		spent := decimal.NewFromInt(rng.Int64N(granted.IntPart() + 1))
		g.mu.Lock()
		g.answered[id] = granted
		g.admitted = g.admitted.Add(spent)
		g.mu.Unlock()
		rctx, cancel := context.WithTimeout(ctx, 3*time.Second)
		// A release lost to a fault leaves the grant counted whole until
		// it is reclaimed: never more capacity, only less.
		if err := g.path.release(rctx, holder, id, spent); err != nil {
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
	if g.api != nil {
		_ = g.api.stop()
	}
	if g.pool != nil {
		g.pool.Close()
	}
	g.proxy.Close()
}

// notReady is what the API process's /readyz says it is not ready for.
func (g *gateways) notReady(ctx context.Context) string {
	if g.api == nil {
		return ""
	}
	return g.api.notReady(ctx)
}

func holderName(i int) string { return fmt.Sprintf("chaos-gateway-%d", i) }

// adminToken is a random admin token for the API process.
func adminToken() string {
	return strings.ReplaceAll(uuid.NewString()+uuid.NewString(), "-", "")
}

func createGatewayToken(ctx context.Context, db *pgxpool.Pool, holder string) (tokens.Token, string, error) {
	return tokens.CreateGateway(ctx, db, holder, "tally bench chaos", time.Now())
}

// storePath is the grant path in process.
type storePath struct{ s *admission.Store }

func (p storePath) issue(ctx context.Context, holder string, amount decimal.Decimal) (uuid.UUID, decimal.Decimal, bool, error) {
	gr, err := p.s.Issue(ctx, admission.IssueRequest{Holder: holder, Generation: 1, Customer: grantCustomer, Meter: grantMeter,
		Amount: amount, MinAmount: decimal.NewNullDecimal(decimal.NewFromInt(1)), TTL: 2 * time.Second})
	var exhausted *admission.BudgetExhaustedError
	if errors.As(err, &exhausted) {
		return uuid.Nil, decimal.Zero, true, nil
	}
	if err != nil {
		return uuid.Nil, decimal.Zero, false, err
	}
	return gr.ID, gr.Amount, false, nil
}

func (p storePath) release(ctx context.Context, holder string, id uuid.UUID, spent decimal.Decimal) error {
	_, err := p.s.Release(ctx, admission.Report{Grant: id, Holder: holder, Generation: 1, Spent: spent})
	return err
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
