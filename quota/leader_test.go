package quota_test

import (
	"context"
	"testing"

	"github.com/tally-ledger/tally/internal/pgtest"
	"github.com/tally-ledger/tally/quota"
)

func TestLeaderSaysWhoHoldsTheLeaseAndWhetherItIsLive(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool := pgtest.New(t)
	if l, err := quota.Leader(ctx, pool, ""); err != nil || l != nil {
		t.Fatalf("no enforcer ever: %+v %v, want nil", l, err)
	}
	if _, err := pool.Exec(ctx, `INSERT INTO quota_leases (name, holder, epoch, acquired_at, expires_at)
		VALUES ($1, 'host/1/a', 3, now() - interval '1 minute', now() + interval '10 seconds')`, quota.DefaultLeaseName); err != nil {
		t.Fatal(err)
	}
	l, err := quota.Leader(ctx, pool, "")
	if err != nil || l == nil || l.Holder != "host/1/a" || l.Epoch != 3 || !l.Live || !l.ExpiresAt.After(l.AcquiredAt) {
		t.Fatalf("live lease: %+v %v", l, err)
	}
	if _, err := pool.Exec(ctx, `UPDATE quota_leases SET expires_at = now() - interval '1 second'`); err != nil {
		t.Fatal(err)
	}
	if l, err := quota.Leader(ctx, pool, quota.DefaultLeaseName); err != nil || l == nil || l.Live {
		t.Fatalf("expired lease: %+v %v, want not live", l, err)
	}
}
