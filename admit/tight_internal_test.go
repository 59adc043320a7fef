package admit

import (
	"testing"
	"time"
)

// Grant answers that come back milliseconds apart are not a rate: a
// burst's growing grants once read as a drain of hundreds of thousands of
// units a second and made a budget with 99.8% left tight. A fall measured
// over a tick or more still is one.
func TestBackToBackAnswers(t *testing.T) {
	c := &Client{cfg: Config{Tick: 50 * time.Millisecond, Lookahead: 2 * time.Second}}
	b := newBudget("acme", "tokens")
	now := time.Now()
	if c.tightAfter(b, now, 999_000) {
		t.Fatal("the first answer made the budget tight")
	}
	// The burst's next grant, of 1,000, answered 2 ms later.
	if c.tightAfter(b, now.Add(2*time.Millisecond), 998_000) {
		t.Fatalf("two answers 2 ms apart made a budget with 998,000 left tight (drain %d)", b.drain)
	}
	// 400,000 units gone in a tenth of a second is a flood: tight at once.
	if !c.tightAfter(b, now.Add(100*time.Millisecond), 598_000) {
		t.Fatal("400,000 units gone in 100 ms did not make the budget tight")
	}
}
