// Package pause waits out a delay unless the context ends first: the one
// way Tally's loops (retry backoff, re-reads, probes) sleep, so that
// cancelling their context stops them at once, never after the delay.
package pause

import (
	"context"
	"time"
)

// For waits d; false when ctx ended first (then the caller should return).
func For(ctx context.Context, d time.Duration) bool {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return false
	case <-t.C:
		return true
	}
}
