package periods

import (
	"fmt"
	"time"
)

// State is where a period is in its lifecycle (docs/design.md §4).
type State string

// Lifecycle states. Open and Grace follow from the clock alone; Closed from
// a close record. A cron that did or did not run changes neither.
const (
	Open  State = "open"  // now < end: usage lands in it
	Grace State = "grace" // end <= now < end + grace: late usage still lands in it
	// AwaitingClose: grace is over but the period is not closed yet (its
	// reconciliation found discrepancies, or nobody ran it). Its statement is
	// not frozen, so late usage still lands in it and will be on the invoice.
	AwaitingClose State = "awaiting_close"
	Closed        State = "closed" // its statement is frozen: late usage becomes a prior-period adjustment
)

// DefaultGrace is how long after its end a period still takes late usage
// before it is due for closing.
const DefaultGrace = 24 * time.Hour

// StateOf is the state of p at now, given whether it has a close record.
func StateOf(p Period, now time.Time, grace time.Duration, closed bool) State {
	switch {
	case closed:
		return Closed
	case now.Before(p.End):
		return Open
	case now.Before(p.End.Add(grace)):
		return Grace
	default:
		return AwaitingClose
	}
}

// ValidateGrace checks a configured grace duration.
func ValidateGrace(d time.Duration) error {
	if d < 0 || d > 31*24*time.Hour {
		return fmt.Errorf("grace: %s is outside 0..744h", d)
	}
	return nil
}
