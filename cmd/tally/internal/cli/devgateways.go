package cli

import (
	"context"
	"fmt"
	"log/slog"
	"path/filepath"
	"sync"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/shopspring/decimal"

	"github.com/tally-ledger/tally/admission"
	"github.com/tally-ledger/tally/admit"
	"github.com/tally-ledger/tally/quota"
)

// The exact-admission demo of tally dev: two simulated gateways, each an
// admit SDK client with its own holder id, admit demo-initech's tokens
// from one exact budget, so their grants can be watched over REST. What
// they admit is metered too (by the simulator's producer), so the
// period's reconciliation finds no ungranted usage.
const (
	gwCustomer = "demo-initech"
	gwMeter    = "tokens"
	gwRate     = 20 // admissions per second per gateway, of cost 1
	// The exact rule's limit is set at start to what the budget has
	// consumed this period plus this much of both gateways' demand.
	gwHeadroom = time.Hour
)

var gwHolders = []string{"demo-gateway-1", "demo-gateway-2"}

// demoGateways admits until ctx ends, adding what it admitted to admitted.
// apiURL is Tally's API; token may manage every holder's grants.
func demoGateways(ctx context.Context, apiURL, token, dir string, pool *pgxpool.Pool, log *slog.Logger, admitted *atomic.Int64) error {
	log = log.With("component", "demo-gateways")
	if err := demoExactRule(ctx, pool); err != nil {
		return fmt.Errorf("demo gateways: exact rule: %w", err)
	}
	var wg sync.WaitGroup
	for _, h := range gwHolders {
		// The SDK's default HTTP client: its connections close with the
		// client, so nothing is left behind when tally dev stops.
		c, err := admit.New(admit.Config{URL: apiURL, Token: token, Holder: h, Dir: filepath.Join(dir, "gateways", h),
			Logger: log.With("holder", h)})
		if err != nil {
			return fmt.Errorf("demo gateway %s: %w", h, err)
		}
		wg.Go(func() {
			defer func() {
				// Give back what was not spent while the API still answers
				// (it may already be stopping: then the grants expire).
				cctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 3*time.Second)
				defer cancel()
				if err := c.Close(cctx); err != nil {
					log.Warn("demo gateway: close", "holder", h, "err", err)
				}
			}()
			gateway(ctx, c, log, admitted)
		})
	}
	wg.Wait()
	return nil
}

// gateway admits gwRate requests a second, spread evenly, until ctx ends.
func gateway(ctx context.Context, c *admit.Client, log *slog.Logger, admitted *atomic.Int64) {
	t := time.NewTicker(time.Second / gwRate)
	defer t.Stop()
	refused := 0
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		d, err := c.Admit(ctx, gwCustomer, gwMeter, 1)
		switch {
		case err != nil:
			if ctx.Err() == nil {
				log.Warn("demo gateway: admit", "err", err)
			}
		case d.Admitted:
			admitted.Add(1)
		default:
			if refused++; refused%100 == 1 {
				log.Info("demo gateway: refused", "binding", d.Binding, "unreachable", d.Unreachable, "retry_after", d.RetryAfter)
			}
		}
	}
}

// demoExactRule puts demo-initech's tokens on an exact rule with room for
// gwHeadroom of the gateways' demand beyond what this period consumed.
func demoExactRule(ctx context.Context, pool *pgxpool.Pool) error {
	s, err := admission.New(pool, admission.Config{})
	if err != nil {
		return err
	}
	bs, err := s.Budgets(ctx, gwCustomer)
	if err != nil {
		return err
	}
	consumed := decimal.Zero
	now := time.Now()
	for _, b := range bs {
		if b.Meter == gwMeter && !now.Before(b.PeriodStart) && now.Before(b.PeriodEnd) {
			consumed = b.Consumed
		}
	}
	demand := decimal.NewFromInt(int64(len(gwHolders)) * gwRate * int64(gwHeadroom/time.Second))
	_, err = quota.PutRuleDB(ctx, pool, quota.RuleInput{
		Customer: gwCustomer, Meter: gwMeter, Limit: consumed.Add(demand).Truncate(0), Admission: quota.Exact,
		Actor: "tally dev", Reason: "demo exact rule: two simulated gateways share this budget through the admit SDK",
	})
	return err
}
