package quota_test

import (
	"context"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/tally-ledger/tally/pools"
	"github.com/tally-ledger/tally/quota"
)

// Lagged pool and global rules are evaluated like a customer's: their usage
// is the sum of their members' (from rollups), and their decisions go to
// tally.quota-decisions keyed by scope and meter.
func TestEnforcerEvaluatesPoolAndGlobalRules(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	e.follow()
	ctx := context.Background()
	err := pgx.BeginFunc(ctx, e.pool, func(tx pgx.Tx) error {
		if _, err := pools.PutTx(ctx, tx, pools.PutInput{Name: "team", Members: []string{"acme", "beta"}, Actor: "test"}, e.now()); err != nil {
			return err
		}
		for scope, limit := range map[string]string{quota.PoolScope("team"): "100", quota.Global: "100"} {
			if _, err := quota.PutScopeRuleAt(ctx, tx, quota.ScopeRuleInput{Scope: scope, Meter: "api_calls",
				Limit: dec(limit), Actor: "test"}, e.now()); err != nil {
				return err
			}
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	e.use("acme", "api_calls", 30)
	e.use("beta", "api_calls", 50)
	e.use("gamma", "api_calls", 40) // not in the pool
	rd := e.reader()
	e.start(e.config("a"))

	seen := map[string]received{}
	rd.until(10*time.Second, "pool and global decisions", func(d received) bool {
		seen[d.key] = d
		_, p := seen["pool:team/api_calls"]
		_, g := seen["global/api_calls"]
		return p && g
	})
	if d := seen["pool:team/api_calls"]; !d.Used.Equal(dec("80")) || d.State != quota.Warning || d.AsOf == nil {
		t.Fatalf("pool decision: %+v", d.Decision)
	}
	if d := seen["global/api_calls"]; !d.Used.Equal(dec("120")) || d.State != quota.Exceeded || !d.Blocks(e.now()) {
		t.Fatalf("global decision: %+v", d.Decision)
	}
}
