package pause_test

import (
	"context"
	"testing"
	"time"

	"github.com/tally-ledger/tally/internal/pause"
)

// A delay that passes reports true; an ended context reports false, even
// with a delay no test would wait out.
func TestFor(t *testing.T) {
	if !pause.For(context.Background(), time.Millisecond) {
		t.Fatal("a passed delay with a live context: false")
	}
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if pause.For(ctx, time.Hour) {
		t.Fatal("an ended context: true")
	}
}
