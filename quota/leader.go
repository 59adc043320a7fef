package quota

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"
)

// qLeader reads an enforcer lease, live or not.
const qLeader = `SELECT holder, epoch, acquired_at, expires_at, expires_at > now() FROM quota_leases WHERE name = $1`

// Lease is who holds (or last held) the enforcer lease: the leader
// publishes decisions while Live.
type Lease struct {
	Holder     string
	Epoch      int64
	AcquiredAt time.Time
	ExpiresAt  time.Time
	Live       bool // not expired by Postgres's clock
}

// Leader returns the lease named name (DefaultLeaseName when ""), or nil
// when no enforcer has ever held it.
func Leader(ctx context.Context, db DBTX, name string) (*Lease, error) {
	if name == "" {
		name = DefaultLeaseName
	}
	var l Lease
	err := db.QueryRow(ctx, qLeader, name).Scan(&l.Holder, &l.Epoch, &l.AcquiredAt, &l.ExpiresAt, &l.Live)
	if errors.Is(err, pgx.ErrNoRows) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("quota: leader: %w", err)
	}
	l.AcquiredAt, l.ExpiresAt = l.AcquiredAt.UTC(), l.ExpiresAt.UTC()
	return &l, nil
}
