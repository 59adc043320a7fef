package ingest

import (
	"context"
	"fmt"
	"sync"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
)

// OffsetWatch samples every partition's stored next offset and records any
// that moved backwards: the invariant that no commit, takeover or restart
// ever moves a stored offset back, checked from outside while members come
// and go (fault tests, tally bench chaos).
type OffsetWatch struct {
	pool      *pgxpool.Pool
	mu        sync.Mutex
	last      map[[2]any]int64 // (topic, partition) → next offset last seen
	regressed []string
	quit      chan struct{}
	done      chan struct{}
}

// WatchOffsets samples pool's stored offsets every interval until Stop.
func WatchOffsets(pool *pgxpool.Pool, every time.Duration) *OffsetWatch {
	w := &OffsetWatch{pool: pool, last: map[[2]any]int64{}, quit: make(chan struct{}), done: make(chan struct{})}
	go func() {
		defer close(w.done)
		t := time.NewTicker(every)
		defer t.Stop()
		for {
			select {
			case <-w.quit:
				return
			case <-t.C:
			}
			w.Sample()
		}
	}()
	return w
}

// Sample reads the stored offsets once (a failed read is skipped: the
// watch is about offsets it saw).
func (w *OffsetWatch) Sample() {
	ctx, cancel := context.WithTimeout(context.Background(), time.Second)
	defer cancel()
	rows, err := w.pool.Query(ctx, qStoredOffsets)
	if err != nil {
		return
	}
	defer rows.Close()
	w.mu.Lock()
	defer w.mu.Unlock()
	for rows.Next() {
		var topic string
		var p int
		var n int64
		if rows.Scan(&topic, &p, &n) != nil {
			return
		}
		k := [2]any{topic, p}
		if prev, ok := w.last[k]; ok && n < prev {
			w.regressed = append(w.regressed, fmt.Sprintf("stored offset of %s partition %d moved back from %d to %d", topic, p, prev, n))
		}
		w.last[k] = n
	}
}

// Regressions are the offsets seen moving backwards, in the order seen.
func (w *OffsetWatch) Regressions() []string {
	w.mu.Lock()
	defer w.mu.Unlock()
	return append([]string(nil), w.regressed...)
}

// Stop ends the sampling; it may be called more than once.
func (w *OffsetWatch) Stop() {
	select {
	case <-w.quit:
	default:
		close(w.quit)
	}
	<-w.done
}
