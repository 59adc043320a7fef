package quota

import (
	"time"

	"github.com/tally-ledger/tally/validation"
)

// The ranges of a rule's durations, as every refusal of one states them
// (docs/api.md): the value given, then "must be" and the range.
var (
	// MaxSkewRange is the range of a rate rule's max_skew.
	MaxSkewRange = "whole milliseconds from " + FormatDuration(MinRuleMaxSkew) + " to " + FormatDuration(MaxRuleMaxSkew)
	// RatePerRange is the range of a rate rule's rate.per.
	RatePerRange = "whole milliseconds from " + FormatDuration(MinRatePer) + " to " + FormatDuration(MaxRatePer)
	// SecondsRange is the range of a customer's rule's stale_after and
	// local_every.
	SecondsRange = "whole seconds, " + FormatDuration(time.Second) + ` or more, such as "1m"`
)

// durationOutOfRange is the refusal of d given in field, whose range is
// rng.
func durationOutOfRange(field string, d time.Duration, rng string) error {
	return validation.Errorf(field, "%s must be %s", FormatDuration(d), rng)
}

// zeroForDefault is the refusal of a zero given in field, whose range is
// rng and which, left out (or null), takes its default: a zero would read
// as if the field were left out.
func zeroForDefault(field, rng string) error {
	return validation.Errorf(field, "0s must be %s; leave %s out (or null) for the default", rng, field)
}
