package admission

import (
	"fmt"
	"time"
)

// Bounds of max_skew (Config.MaxSkew, tally serve --grant-max-skew).
const (
	// MinMaxSkew: below a second, ordinary clock drift between Tally and a
	// gateway could let the gateway admit from a grant Tally has already
	// reclaimed and handed out again.
	MinMaxSkew = time.Second
	// MaxMaxSkew: every grant whose holder dies stays unusable this long
	// after valid_until; beyond ten minutes a crashed gateway strands its
	// capacity longer than any clock is wrong.
	MaxMaxSkew = 10 * time.Minute
)

// ValidateMaxSkew checks a configured max_skew.
func ValidateMaxSkew(d time.Duration) error {
	if d < MinMaxSkew || d > MaxMaxSkew {
		return &FieldError{Field: "max_skew", Detail: fmt.Sprintf("%s must be between %s and %s", d, MinMaxSkew, MaxMaxSkew)}
	}
	return nil
}
