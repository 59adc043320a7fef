package admission_test

import (
	"context"
	"fmt"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/tally-ledger/tally/admission"
)

// planCounter is the pool with a count of the batches sent on it outside
// a connection of its own: a grant request's plan (its four reads) is the
// only one an issue sends so, the issuing batch runs on an acquired
// connection.
type planCounter struct {
	*pgxpool.Pool
	n atomic.Int64
}

func (p *planCounter) SendBatch(ctx context.Context, b *pgx.Batch) pgx.BatchResults {
	p.n.Add(1)
	return p.Pool.SendBatch(ctx, b)
}

// TestPlanCacheKeepsLivePlansWhenFull: the plans of a deployment with more
// customers than the cache holds. A full cache used to be emptied at the
// next new plan, so every customer in use planned its next request inline
// again, and plans past their use (planMaxAge) were kept until then. Now
// plans nobody can use any more are dropped, and a cache full of plans in
// use keeps them and does not keep the newcomer's.
func TestPlanCacheKeepsLivePlansWhenFull(t *testing.T) {
	e := newEnv(t)
	ctx := context.Background()
	db := &planCounter{Pool: e.pool}
	s, err := admission.New(db, admission.Config{Now: e.clock.Now})
	if err != nil {
		t.Fatal(err)
	}
	admission.SetMaxPlans(s, 4)
	for i := range 12 {
		e.rule(fmt.Sprintf("c%d", i), "tokens", d("100"))
	}
	issue := func(i int) {
		t.Helper()
		if _, err := s.Issue(ctx, admission.IssueRequest{Holder: "gw", Generation: 1, Customer: fmt.Sprintf("c%d", i),
			Meter: "tokens", Amount: d("1"), TTL: time.Minute}); err != nil {
			t.Fatalf("c%d: %v", i, err)
		}
	}
	plans := func(what string, i int, want int64) {
		t.Helper()
		before := db.n.Load()
		issue(i)
		if got := db.n.Load() - before; got != want {
			t.Fatalf("%s: c%d's request made %d plans, want %d", what, i, got, want)
		}
	}

	// The cache is full of plans in use: newcomers do not push them out.
	for i := range 4 {
		plans("first request", i, 1)
	}
	for i := 4; i < 8; i++ {
		plans("first request, cache full", i, 1)
	}
	for i := range 4 {
		plans("within a second of its plan", i, 0)
	}

	// Past planMaxAge none of them is used again: they make room.
	e.clock.Advance(11 * time.Second)
	for i := 8; i < 12; i++ {
		plans("first request", i, 1)
	}
	for i := 8; i < 12; i++ {
		plans("within a second of its plan", i, 0)
	}
}
