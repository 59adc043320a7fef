package api

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/tally-ledger/tally/ingest"
)

// Freshness says through which instant a customer's usage is known to be
// complete (SPEC §5 "as_of"). ok is false when that is unknown (no ingest
// position yet); then the API answers as_of: null, never "fresh".
type Freshness interface {
	AsOf(ctx context.Context, customer string) (asOf time.Time, ok bool, err error)
}

// IngestFreshness is the default Freshness: the applied_through of the
// customer's own ingest partition (ingest_customers records which one it
// hashes to). For a customer ingest has not seen yet it is the oldest
// applied_through of every partition of the topic: a lower bound whatever
// partition the customer will hash to, so usage never looks more complete
// than it is.
//
// Values are cached per customer for MaxAge: a cached as_of is older than
// the truth, which keeps it a lower bound.
type IngestFreshness struct {
	Pool   *pgxpool.Pool
	Topic  string        // default ingest.DefaultTopic
	MaxAge time.Duration // default 1s; negative: no cache
	Clock  func() time.Time

	once  sync.Once
	cache *ttlCache[string, freshAsOf]
}

type freshAsOf struct {
	asOf time.Time
	ok   bool
}

// AsOf implements Freshness.
func (f *IngestFreshness) AsOf(ctx context.Context, customer string) (time.Time, bool, error) {
	f.once.Do(func() {
		maxAge := f.MaxAge
		if maxAge == 0 {
			maxAge = time.Second
		}
		f.cache = newTTLCache[string, freshAsOf](maxAge, 100_000)
		if f.Clock != nil {
			f.cache.now = f.Clock
		}
	})
	if v, ok := f.cache.get(customer); ok {
		return v.asOf, v.ok, nil
	}
	topic := f.Topic
	if topic == "" {
		topic = ingest.DefaultTopic
	}
	var asOf *time.Time
	err := f.Pool.QueryRow(ctx, qIngestAsOf, customer, topic).Scan(&asOf)
	var pgErr *pgconn.PgError
	if errors.As(err, &pgErr) && pgErr.Code == "42P01" { // undefined_table: ingest not migrated
		f.cache.put(customer, freshAsOf{})
		return time.Time{}, false, nil
	}
	if err != nil {
		return time.Time{}, false, fmt.Errorf("ingest position: %w", err)
	}
	var v freshAsOf
	if asOf != nil {
		v = freshAsOf{asOf: asOf.UTC(), ok: true}
	}
	f.cache.put(customer, v)
	return v.asOf, v.ok, nil
}
