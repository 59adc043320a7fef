package periods

import (
	"fmt"
	"math"
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

// NoGrace is the grace of a deployment configured without one
// (TALLY_GRACE=0s): a period is due for closing as soon as it ends. A zero
// Grace in a Store or a package's Config means DefaultGrace, so a grace a
// person set to 0 is passed on as NoGrace (GraceSetting).
//
// It is the most negative duration, which no flag or variable sets by
// accident (a negative grace a person types is refused).
const NoGrace = time.Duration(math.MinInt64)

// GraceSetting is the Grace to configure for a grace a person set (a flag
// or TALLY_GRACE): 0 there means none, which a Store says with NoGrace.
func GraceSetting(d time.Duration) time.Duration {
	if d == 0 {
		return NoGrace
	}
	return d
}

// GraceEnds is when p's grace ends: its end plus grace (NoGrace: its end).
func GraceEnds(p Period, grace time.Duration) time.Time {
	if grace == NoGrace {
		return p.End
	}
	return p.End.Add(grace)
}

// StateOf is the state of p at now, given whether it has a close record.
// grace is a configured grace: NoGrace for none.
func StateOf(p Period, now time.Time, grace time.Duration, closed bool) State {
	switch {
	case closed:
		return Closed
	case now.Before(p.End):
		return Open
	case now.Before(GraceEnds(p, grace)):
		return Grace
	default:
		return AwaitingClose
	}
}

// ValidateGrace checks a configured grace duration (NoGrace included).
func ValidateGrace(d time.Duration) error {
	if d == NoGrace {
		return nil
	}
	if d < 0 || d > 31*24*time.Hour {
		return fmt.Errorf("grace: %s is outside 0..744h", d)
	}
	return nil
}
