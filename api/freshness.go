package api

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"
)

// Freshness says through which instant a customer's usage is known to be
// complete (SPEC §5 "as_of"). ok is false when that is unknown (no ingest
// position yet); then the API answers as_of: null, never "fresh".
type Freshness interface {
	AsOf(ctx context.Context, customer string) (asOf time.Time, ok bool, err error)
}

// IngestFreshness is the default Freshness: the oldest applied_through of
// all ingest partitions. That is a lower bound for every customer whatever
// partition it hashes to, so usage never looks more complete than it is.
// (Refining it to the customer's own partition makes it fresher, never wrong.)
//
// The value is cached for MaxAge: a cached as_of is older than the truth,
// which keeps it a lower bound.
type IngestFreshness struct {
	Pool   *pgxpool.Pool
	MaxAge time.Duration // default 1s; negative: no cache
	Clock  func() time.Time

	mu     sync.Mutex
	readAt time.Time
	asOf   time.Time
	ok     bool
}

// AsOf implements Freshness.
func (f *IngestFreshness) AsOf(ctx context.Context, _ string) (time.Time, bool, error) {
	now := time.Now
	if f.Clock != nil {
		now = f.Clock
	}
	maxAge := f.MaxAge
	if maxAge == 0 {
		maxAge = time.Second
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	t := now()
	if maxAge > 0 && !f.readAt.IsZero() && t.Sub(f.readAt) < maxAge && !t.Before(f.readAt) {
		return f.asOf, f.ok, nil
	}
	var asOf *time.Time
	err := f.Pool.QueryRow(ctx, qIngestAsOf).Scan(&asOf)
	var pgErr *pgconn.PgError
	if errors.As(err, &pgErr) && pgErr.Code == "42P01" { // undefined_table: ingest not migrated
		f.readAt, f.asOf, f.ok = t, time.Time{}, false
		return time.Time{}, false, nil
	}
	if err != nil {
		return time.Time{}, false, fmt.Errorf("ingest position: %w", err)
	}
	f.readAt, f.ok = t, asOf != nil
	f.asOf = time.Time{}
	if asOf != nil {
		f.asOf = asOf.UTC()
	}
	return f.asOf, f.ok, nil
}
