package quota

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"slices"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/shopspring/decimal"

	"github.com/tally-ledger/tally/amount"
	"github.com/tally-ledger/tally/validation"
)

// PutRequest is the body of PUT /v1/customers/{customer}/quotas/{meter}:
//
//	{"limit": "100000", "warn_at": "0.8", "mode": "enforce", "on_stale": "allow",
//	 "stale_after": 300, "effective_at": "2026-12-02T12:00:00Z", "reason": "plan upgrade"}
//
// Only limit is required. Decimals are strings (a JSON integer is accepted);
// stale_after is whole seconds or a duration string ("5m").
type PutRequest struct {
	Limit       json.RawMessage `json:"limit"`
	WarnAt      json.RawMessage `json:"warn_at,omitempty"`
	Mode        Mode            `json:"mode,omitempty"`
	OnStale     OnStale         `json:"on_stale,omitempty"`
	StaleAfter  *Duration       `json:"stale_after,omitempty"`
	EffectiveAt *time.Time      `json:"effective_at,omitempty"`
	Reason      string          `json:"reason,omitempty"`
	// Exact admission (optional): "admission": "exact", "on_unreachable":
	// "local", "local_amount": "100", "local_every": "1m".
	Admission     Admission       `json:"admission,omitempty"`
	OnUnreachable OnUnreachable   `json:"on_unreachable,omitempty"`
	LocalAmount   json.RawMessage `json:"local_amount,omitempty"`
	LocalEvery    *Duration       `json:"local_every,omitempty"`
	// A rate rule (docs/design.md §17) instead of limit:
	// "rate": {"amount": "100", "per": "1s", "burst": "200"}, with
	// "admission": "exact" and optionally "max_skew": "250ms".
	Rate    json.RawMessage `json:"rate,omitempty"`
	MaxSkew *DurationText   `json:"max_skew,omitempty"`
}

// DecodePutRequest reads a PutRequest body (at most 64 KiB, no unknown
// fields) and returns it as a RuleInput for customer and meter by actor
// (the authenticated principal). Every problem is reported at once (see
// PutRequest.Input).
func DecodePutRequest(body io.Reader, customer, meter, actor string) (RuleInput, error) {
	raw, err := io.ReadAll(io.LimitReader(body, 64<<10+1))
	if err != nil {
		return RuleInput{}, invalid(validation.Errorf("body", "%v", err))
	}
	if len(raw) > 64<<10 {
		return RuleInput{}, invalid(validation.Errorf("body", "larger than 64 KiB"))
	}
	dec := json.NewDecoder(bytes.NewReader(raw))
	dec.DisallowUnknownFields()
	var p PutRequest
	if err := dec.Decode(&p); err != nil {
		return RuleInput{}, invalid(validation.Errorf("body", "%v", err))
	}
	return p.Input(customer, meter, actor)
}

// Input returns p, already decoded, as a RuleInput for customer and meter
// by actor. Every problem is reported at once: ErrInvalid wrapping
// errors.Join of *validation.FieldError.
func (p PutRequest) Input(customer, meter, actor string) (RuleInput, error) {
	in := RuleInput{Customer: customer, Meter: meter, Mode: p.Mode, OnStale: p.OnStale, Actor: actor, Reason: p.Reason,
		Admission: p.Admission, OnUnreachable: p.OnUnreachable}
	var errs []error
	var err error
	if given(p.LocalAmount) {
		v, err := decodeDecimal(p.LocalAmount)
		if err != nil {
			errs = append(errs, validation.Errorf("local_amount", "%v", err))
		} else {
			in.LocalAmount = decimal.NewNullDecimal(v)
		}
	}
	if p.LocalEvery != nil {
		// local_every has no default: zero given is refused, not read as
		// left out (which would pass on a rule without on_unreachable
		// "local").
		if in.LocalEvery = time.Duration(*p.LocalEvery); in.LocalEvery == 0 {
			errs = append(errs, durationOutOfRange("local_every", 0, SecondsRange))
		}
	}
	hasRate := given(p.Rate)
	if hasRate {
		var rerrs []error
		in.Rate, rerrs = DecodeRate(p.Rate)
		errs = append(errs, rerrs...)
	}
	if p.MaxSkew != nil {
		in.MaxSkew = time.Duration(*p.MaxSkew)
		if in.MaxSkew == 0 {
			errs = append(errs, zeroForDefault("max_skew", MaxSkewRange))
		}
	}
	switch {
	case !given(p.Limit) && !hasRate:
		errs = append(errs, validation.Errorf("limit", "is required (or a rate)"))
	case !given(p.Limit):
	case hasRate:
		errs = append(errs, validation.Errorf("limit", "a rule has a period limit or a rate, not both"))
	default:
		if in.Limit, err = decodeDecimal(p.Limit); err != nil {
			errs = append(errs, validation.Errorf("limit", "%v", err))
		}
	}
	if given(p.WarnAt) {
		w, err := decodeDecimal(p.WarnAt)
		if err != nil {
			errs = append(errs, validation.Errorf("warn_at", "%v", err))
		} else {
			in.WarnAt = decimal.NewNullDecimal(w)
		}
	}
	if p.StaleAfter != nil {
		in.StaleAfter = time.Duration(*p.StaleAfter)
		if in.StaleAfter == 0 {
			errs = append(errs, zeroForDefault("stale_after", SecondsRange))
		}
	}
	if p.EffectiveAt != nil {
		// RuleInput's zero EffectiveAt means now: the zero time given
		// is refused rather than read as if it were left out.
		if p.EffectiveAt.IsZero() {
			errs = append(errs, validation.Errorf("effective_at", "%s", ErrZeroTime))
		} else {
			in.EffectiveAt = *p.EffectiveAt
		}
	}
	// Report the field checks too, so the caller sees everything at once,
	// but not again for a field that did not decode: its check would
	// judge the zero left in its place.
	for _, e := range in.problems() {
		if !slices.ContainsFunc(errs, func(d error) bool { return sameField(d, e) }) {
			errs = append(errs, e)
		}
	}
	if err := invalid(errs...); err != nil {
		return RuleInput{}, err
	}
	return in, nil
}

// sameField says whether a and b are field errors of one field.
func sameField(a, b error) bool {
	fa, ok := errors.AsType[*validation.FieldError](a)
	fb, ok2 := errors.AsType[*validation.FieldError](b)
	return ok && ok2 && fa.Field == fb.Field
}

// ErrZeroTime describes the zero time given as an instant: it is refused,
// not taken for an instant left out (which means now).
var ErrZeroTime = errors.New("0001-01-01T00:00:00Z is the zero time, not an instant; leave the field out for now")

// given says whether a body's value was given: neither left out nor null.
// A null is a value left out, never an empty string or a zero.
func given(raw json.RawMessage) bool {
	return len(raw) > 0 && string(raw) != "null"
}

// decodeDecimal reads a decimal as every decimal of the API's bodies is
// given: a JSON string that amount.Parse accepts ("12", "0.5"; never a
// JSON number, an exponent, "+" or a bare point). A null is refused as
// required: JSON decodes it into a string as "" without an error.
func decodeDecimal(raw json.RawMessage) (decimal.Decimal, error) {
	if !given(raw) {
		return decimal.Decimal{}, errors.New(`is required: an exact decimal string like "12.5"`)
	}
	var s string
	if err := json.Unmarshal(raw, &s); err != nil {
		return decimal.Decimal{}, fmt.Errorf("%s: must be an exact decimal string like \"12.5\"", raw)
	}
	d, err := amount.Parse(s)
	if err != nil {
		return decimal.Decimal{}, fmt.Errorf("%w (an exact decimal string like \"12.5\")", err)
	}
	return d, nil
}

// TxBeginner is what PutRuleDB needs of a pool.
type TxBeginner interface {
	Begin(ctx context.Context) (pgx.Tx, error)
}

// PutRuleAt is PutRule at the instant now (tests), as PutScopeRuleAt.
func PutRuleAt(ctx context.Context, tx pgx.Tx, in RuleInput, now time.Time) (Rule, error) {
	return putRule(ctx, tx, in, func() time.Time { return now })
}

// PutRuleDB is PutRule in a transaction of its own.
func PutRuleDB(ctx context.Context, db TxBeginner, in RuleInput) (Rule, error) {
	return PutRuleDBClock(ctx, db, in, time.Now)
}

// PutRuleDBClock is PutRuleDB with the caller's clock (callers whose clock
// is configurable, the API), read once the rule's lock is held.
func PutRuleDBClock(ctx context.Context, db TxBeginner, in RuleInput, clock func() time.Time) (Rule, error) {
	var r Rule
	err := pgx.BeginFunc(ctx, db, func(tx pgx.Tx) error {
		var err error
		r, err = putRule(ctx, tx, in, clock)
		return err
	})
	return r, err
}
