package quota

import (
	"encoding/json"
	"fmt"
	"maps"
	"slices"
	"time"

	"github.com/shopspring/decimal"

	"github.com/tally-ledger/tally/amount"
	"github.com/tally-ledger/tally/validation"
)

// Rate is a rate contract (docs/design.md §17): Amount per Per, at most
// Burst at once. A rule with a Rate has no period limit; its budget is a
// token bucket admitted exactly through grants (admission "exact").
type Rate struct {
	Amount decimal.Decimal `json:"amount"`
	Per    DurationText    `json:"per"`
	Burst  decimal.Decimal `json:"burst"`
}

// Bounds of a rate rule.
const (
	// MinRatePer and MaxRatePer bound per (whole milliseconds).
	MinRatePer = time.Millisecond
	MaxRatePer = 24 * time.Hour
	// MinRuleMaxSkew is the smallest max_skew a rate rule may set: where
	// gateways' clocks are kept in sync, the stated bound tightens to it.
	MinRuleMaxSkew = 100 * time.Millisecond
	// MaxRuleMaxSkew is the largest; issuing uses the smaller of the rule's
	// and the deployment's (tally serve --grant-max-skew).
	MaxRuleMaxSkew = 10 * time.Minute
)

// ratePayload is the JSON form of Rate on input: decimals as strings, per
// as a duration string or whole seconds.
type ratePayload struct {
	Amount json.RawMessage `json:"amount"`
	Per    json.RawMessage `json:"per"`
	Burst  json.RawMessage `json:"burst"`
}

// DecodeRate reads a rule's "rate" object, reporting every problem as a
// field error under rate.<field>.
func DecodeRate(raw json.RawMessage) (*Rate, []error) {
	// Its names first, each unknown one its own field error (rate.<name>),
	// as a body's unknown field is named: encoding/json stops at the first
	// and says it in a message of its own, and it matches names regardless
	// of case ("Amount" would be taken for amount); names match exactly
	// here, as in every body.
	var keys map[string]json.RawMessage
	if err := json.Unmarshal(raw, &keys); err != nil || keys == nil {
		return nil, []error{validation.Errorf("rate", `must be an object {"amount", "per", "burst"}`)}
	}
	var unknown []error
	for _, k := range slices.Sorted(maps.Keys(keys)) {
		if k != "amount" && k != "per" && k != "burst" {
			unknown = append(unknown, validation.Errorf("rate."+k, `unknown field (names are case-sensitive: "amount", "per", "burst")`))
		}
	}
	if len(unknown) > 0 {
		return nil, unknown
	}
	var p ratePayload
	if err := json.Unmarshal(raw, &p); err != nil {
		return nil, []error{validation.Errorf("rate", `must be an object {"amount", "per", "burst"}: %v`, err)}
	}
	var r Rate
	var errs []error
	for _, f := range []struct {
		name string
		raw  json.RawMessage
		into *decimal.Decimal
	}{{"rate.amount", p.Amount, &r.Amount}, {"rate.burst", p.Burst, &r.Burst}} {
		if !given(f.raw) {
			errs = append(errs, validation.Errorf(f.name, "is required"))
			continue
		}
		v, err := decodeDecimal(f.raw)
		if err != nil {
			errs = append(errs, validation.Errorf(f.name, "%v", err))
			continue
		}
		*f.into = v
	}
	if !given(p.Per) {
		errs = append(errs, validation.Errorf("rate.per", "is required"))
	} else if err := r.Per.UnmarshalJSON(p.Per); err != nil {
		errs = append(errs, validation.Errorf("rate.per", "%v", err))
	} else if r.Per == 0 {
		errs = append(errs, durationOutOfRange("rate.per", 0, RatePerRange))
	}
	return &r, errs
}

// problems are the field errors of r.
func (r Rate) problems() []error {
	var errs []error
	for _, f := range []struct {
		name string
		v    decimal.Decimal
	}{{"rate.amount", r.Amount}, {"rate.burst", r.Burst}} {
		if !f.v.IsPositive() {
			errs = append(errs, validation.Errorf(f.name, "%s must be positive", f.v))
		} else if err := amount.Check(f.v); err != nil {
			errs = append(errs, validation.Errorf(f.name, "%v", err))
		}
	}
	per := time.Duration(r.Per)
	if per < MinRatePer || per > MaxRatePer || per%time.Millisecond != 0 {
		errs = append(errs, durationOutOfRange("rate.per", per, RatePerRange))
	}
	return errs
}

// rateProblems checks the rate-or-limit shape of a rule input: a rate
// goes with admission exact and no limit; max_skew only with a rate.
func rateProblems(rate *Rate, limitSet bool, admission Admission, maxSkew time.Duration) []error {
	var errs []error
	if rate == nil {
		if maxSkew != 0 {
			errs = append(errs, validation.Errorf("max_skew", "applies only to rate rules"))
		}
		return errs
	}
	errs = append(errs, rate.problems()...)
	if limitSet {
		errs = append(errs, validation.Errorf("limit", "a rule has a period limit or a rate, not both"))
	}
	if admission != Exact {
		errs = append(errs, validation.Errorf("admission", "a rate rule is admitted through grants: it must be %q", Exact))
	}
	if maxSkew != 0 && (maxSkew < MinRuleMaxSkew || maxSkew > MaxRuleMaxSkew || maxSkew%time.Millisecond != 0) {
		errs = append(errs, durationOutOfRange("max_skew", maxSkew, MaxSkewRange))
	}
	return errs
}

// rateColumns are the rate columns of an insert: NULLs for a period rule.
func rateColumns(rate *Rate, maxSkew time.Duration) (amt, burst *string, perMicros, skewMicros *int64) {
	if rate == nil {
		return nil, nil, nil, nil
	}
	a, b := rate.Amount.String(), rate.Burst.String()
	p := time.Duration(rate.Per).Microseconds()
	var s *int64
	if maxSkew != 0 {
		v := maxSkew.Microseconds()
		s = &v
	}
	return &a, &b, &p, s
}

// scanRate reads the rate columns (NULL for a period rule).
func scanRate(amt, burst *string, perMicros, skewMicros *int64) (*Rate, DurationText, error) {
	var skew DurationText
	if skewMicros != nil {
		skew = DurationText(time.Duration(*skewMicros) * time.Microsecond)
	}
	if amt == nil || burst == nil || perMicros == nil {
		return nil, skew, nil
	}
	a, err := decimal.NewFromString(*amt)
	if err != nil {
		return nil, 0, fmt.Errorf("stored rate_amount %q: %w", *amt, err)
	}
	b, err := decimal.NewFromString(*burst)
	if err != nil {
		return nil, 0, fmt.Errorf("stored rate_burst %q: %w", *burst, err)
	}
	return &Rate{Amount: a, Burst: b, Per: DurationText(time.Duration(*perMicros) * time.Microsecond)}, skew, nil
}

// rateSelect is the rate columns every rule query selects after the
// others, in scanRate's order.
const rateSelect = `rate_amount::text, rate_burst::text, (extract(epoch FROM rate_per) * 1000000)::bigint,
       (extract(epoch FROM max_skew) * 1000000)::bigint`
