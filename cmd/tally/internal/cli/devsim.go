package cli

import (
	"context"
	"fmt"
	"log/slog"
	"path/filepath"
	"sync"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/shopspring/decimal"

	"github.com/tally-ledger/tally/ledger"
	"github.com/tally-ledger/tally/producer"
	"github.com/tally-ledger/tally/quota"
)

// The simulated usage of tally dev: two customers metered through the
// producer SDK, and a quota on the first that goes ok → warning → exceeded
// within a few minutes.
const (
	simCustomer = "demo-acme"
	simMeter    = "api_calls"
	simRate     = 20 // demo-acme api_calls per second
	// The demo quota is set at start to the period's usage so far plus
	// this many seconds of simulated traffic: warning at 80% of it.
	simHeadroom = 120
)

// simulate records usage until ctx ends, and runs the demo gateways
// against the API at apiURL (with token), metering what they admit. Its
// producer state lives in dir, so a restarted tally dev continues the same
// streams.
func simulate(ctx context.Context, brokers []string, dir string, pool *pgxpool.Pool, log *slog.Logger, apiURL, token string) error {
	p, err := producer.New(producer.Config{
		Brokers: brokers, Producer: "dev-simulator", Dir: filepath.Join(dir, "simulator"),
		Logger: log.With("component", "simulator"), BlockWhenFull: true,
	})
	if err != nil {
		return fmt.Errorf("simulator: %w", err)
	}
	defer func() {
		// Stop, not Close: the next tally dev continues this epoch.
		if err := p.Stop(context.WithoutCancel(ctx)); err != nil {
			log.Warn("simulator: stop", "err", err)
		}
	}()
	if err := demoQuota(ctx, pool); err != nil {
		log.Warn("simulator: no demo quota", "err", err)
	}
	if err := demoKinds(ctx, pool); err != nil {
		log.Warn("simulator: no seats gauge or active-users meter", "err", err)
	}
	var admitted atomic.Int64
	var gateways sync.WaitGroup
	defer gateways.Wait()
	gateways.Go(func() {
		if err := demoGateways(ctx, apiURL, token, dir, pool, log, &admitted); err != nil && ctx.Err() == nil {
			log.Warn("simulator: no demo gateways", "err", err)
		}
	})
	t := time.NewTicker(time.Second)
	defer t.Stop()
	for tick := 0; ; tick++ {
		select {
		case <-ctx.Done():
			return nil
		case now := <-t.C:
			for _, u := range []struct {
				customer, meter string
				q               decimal.Decimal
			}{
				{simCustomer, simMeter, decimal.NewFromInt(simRate)},
				{"demo-globex", "api_calls", decimal.NewFromInt(int64(3 + tick%5))},
				{"demo-globex", "storage_gb_hours", decimal.RequireFromString("0.125")},
				{gwCustomer, gwMeter, decimal.NewFromInt(admitted.Swap(0))},
			} {
				if u.q.IsZero() {
					continue
				}
				if err := p.Record(ctx, u.customer, u.meter, u.q, now); err != nil {
					if ctx.Err() != nil {
						return nil
					}
					return fmt.Errorf("simulator: %w", err)
				}
			}
			if err := simulateKinds(ctx, p, tick, now); err != nil {
				if ctx.Err() != nil {
					return nil
				}
				return fmt.Errorf("simulator: %w", err)
			}
		}
	}
}

// The gauge and unique meters of tally dev (docs/design.md §16): demo-acme's
// seats in use, which change every half minute, and its active users, a
// few of a pool of 40 seen each second.
const (
	simSeats = "seats"
	simUsers = "active_users"
)

// demoKinds declares the demo's seats gauge and active-users meter.
func demoKinds(ctx context.Context, pool *pgxpool.Pool) error {
	return pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
		if _, err := ledger.DeclareMeter(ctx, tx, ledger.Meter{Meter: simSeats, Kind: ledger.Gauge, Unit: "seat",
			Description: "seats in use"}, time.Now()); err != nil {
			return err
		}
		_, err := ledger.DeclareMeter(ctx, tx, ledger.Meter{Meter: simUsers, Kind: ledger.Unique, Unit: "user",
			Description: "distinct active users"}, time.Now())
		return err
	})
}

func simulateKinds(ctx context.Context, p *producer.Producer, tick int, now time.Time) error {
	if tick%30 == 0 {
		seats := decimal.NewFromInt(int64(10 + (tick/30)%7*2)) // 10, 12, ... 22, 10, ...
		if err := p.RecordLevel(ctx, simCustomer, simSeats, seats, now); err != nil {
			return err
		}
	}
	for i := range 3 {
		user := fmt.Sprintf("user-%02d", (tick*7+i*13)%40)
		if err := p.RecordMember(ctx, simCustomer, simUsers, user, now); err != nil {
			return err
		}
	}
	return nil
}

// demoQuota gives demo-acme's api_calls a limit a couple of minutes ahead
// of its usage, so the decisions move while you watch.
func demoQuota(ctx context.Context, pool *pgxpool.Pool) error {
	var used string
	if err := pool.QueryRow(ctx, `SELECT coalesce(sum(quantity), 0)::text FROM rollups
		WHERE customer = $1 AND meter = $2 AND period_start = (SELECT max(period_start) FROM rollups WHERE customer = $1)`,
		simCustomer, simMeter).Scan(&used); err != nil {
		return err
	}
	limit := decimal.RequireFromString(used).Add(decimal.NewFromInt(simRate * simHeadroom)).Truncate(0)
	_, err := quota.PutRuleDB(ctx, pool, quota.RuleInput{
		Customer: simCustomer, Meter: simMeter, Limit: limit, Mode: quota.Enforce, OnStale: quota.Allow,
		StaleAfter: 5 * time.Minute, Actor: "tally dev", Reason: "demo quota: exceeded about two minutes after start",
	})
	return err
}
