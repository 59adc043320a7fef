package quota

import (
	"strconv"
	"time"

	"github.com/shopspring/decimal"

	"github.com/tally-ledger/tally/periods"
)

// State is a quota's state in a decision.
type State string

// States of a decision.
const (
	OK       State = "ok"       // used < warn_at × limit
	Warning  State = "warning"  // warn_at × limit ≤ used < limit
	Exceeded State = "exceeded" // used ≥ limit: no allowance left
	// NoLimit: the rule in force has no lagged period limit (a rate
	// contract, docs/design.md §17, or a pool or global rule admitted
	// exactly through grants): nothing to refuse from this topic. It
	// replaces the key's last period decision, which would otherwise stay
	// the last one gateways read.
	NoLimit State = "no_limit"
)

// States lists every state, for metrics.
var States = []State{OK, Warning, Exceeded, NoLimit}

// DefaultTopic is the Kafka topic decisions are published to.
const DefaultTopic = "tally.quota-decisions"

// Decision is what the enforcer publishes: exactly these fields, as JSON,
// with the key "customer/meter". Quantities are decimal strings.
type Decision struct {
	Customer  string          `json:"customer"`
	Meter     string          `json:"meter"`
	Period    string          `json:"period"` // the period's name: its start date in the customer's zone
	State     State           `json:"state"`
	Used      decimal.Decimal `json:"used"`
	Limit     decimal.Decimal `json:"limit"`
	Remaining decimal.Decimal `json:"remaining"` // max(0, limit - used)
	// AsOf is the instant through which the customer's usage is known to be
	// complete. Null: unknown (no ingest position yet); treat as stale.
	AsOf *time.Time `json:"as_of"`
	// LagSeconds is DecidedAt - AsOf (never negative), in seconds with
	// millisecond precision. Null when AsOf is.
	LagSeconds *Seconds `json:"lag_seconds"`
	// Projected is Used + recent rate × lag, rounded up to 9 digits after
	// the point: the usage the customer has probably reached by DecidedAt.
	Projected   decimal.Decimal `json:"projected"`
	RuleVersion int64           `json:"rule_version"`
	Mode        Mode            `json:"mode"`
	OnStale     OnStale         `json:"on_stale"`
	StaleAfter  Duration        `json:"stale_after"` // whole seconds
	DecidedAt   time.Time       `json:"decided_at"`
	// LeaderEpoch is the lease epoch of the enforcer that published the
	// decision, and Seq its number among the key's decisions (it grows
	// with every publication of the key, across leaders). Of two decisions
	// for a key, the newer has the higher (LeaderEpoch, Seq): a consumer
	// keeps it and ignores an older one that arrives later (a deposed or
	// paused leader's write that Kafka took after its lease ended).
	LeaderEpoch int64 `json:"leader_epoch"`
	Seq         int64 `json:"seq"`
}

// Newer reports whether d supersedes o, a decision for the same key: it
// has a higher leader epoch, or the same epoch and a higher seq.
func (d Decision) Newer(o Decision) bool {
	if d.LeaderEpoch != o.LeaderEpoch {
		return d.LeaderEpoch > o.LeaderEpoch
	}
	return d.Seq > o.Seq
}

// Key is the decision's Kafka message key: "customer/meter".
func (d Decision) Key() string { return d.Customer + "/" + d.Meter }

// Stale reports whether a consumer holding d at now must apply OnStale: the
// usage it reports is older than StaleAfter (now - AsOf > StaleAfter), or
// unknown. This covers both a stalled ingest (the lag inside the decision
// grows) and a silent enforcer (the decision itself ages). A NoLimit
// decision reports no usage and never turns stale (its OnStale is allow,
// so a consumer that does not know the state admits under it too).
func (d Decision) Stale(now time.Time) bool {
	if d.State == NoLimit {
		return false
	}
	return d.AsOf == nil || now.Sub(*d.AsOf) > time.Duration(d.StaleAfter)
}

// Blocks reports whether a gateway should refuse usage at now under d: an
// enforce-mode decision that is exceeded, or stale with on_stale deny.
func (d Decision) Blocks(now time.Time) bool {
	if d.Mode != Enforce {
		return false
	}
	if d.Stale(now) {
		return d.OnStale == Deny
	}
	return d.State == Exceeded
}

// noLimit is the decision for prev's key once the rule in force (version)
// has no lagged period limit, in period p. Built so that a consumer that
// knows only the states before it admits too: not exceeded, on_stale
// allow, as_of decided_at. Used, limit, remaining and projected are 0:
// there is no period usage to weigh against a limit.
func noLimit(prev Decision, version int64, p periods.Period, now time.Time) Decision {
	asOf, lag := now, Seconds(0)
	return Decision{
		Customer: prev.Customer, Meter: prev.Meter, Period: p.Name, State: NoLimit,
		AsOf: &asOf, LagSeconds: &lag, RuleVersion: version, Mode: prev.Mode, OnStale: Allow,
		StaleAfter: prev.StaleAfter, DecidedAt: now,
	}
}

// Seconds is a duration in JSON as a number of seconds with millisecond
// precision (12.345). It is a time, not a quantity; arithmetic on it is
// done on whole milliseconds.
type Seconds int64 // milliseconds

// Duration returns s as a time.Duration.
func (s Seconds) Duration() time.Duration { return time.Duration(s) * time.Millisecond }

// MarshalJSON writes seconds with up to three digits after the point.
func (s Seconds) MarshalJSON() ([]byte, error) {
	return []byte(decimal.New(int64(s), -3).String()), nil
}

// UnmarshalJSON reads a number of seconds.
func (s *Seconds) UnmarshalJSON(b []byte) error {
	d, err := decimal.NewFromString(string(b))
	if err != nil {
		return err
	}
	*s = Seconds(d.Shift(3).Round(0).IntPart())
	return nil
}

func (s Seconds) String() string { return strconv.FormatFloat(float64(s)/1000, 'f', 3, 64) + "s" }

// rate is an observed rate of usage: Quantity over Millis milliseconds.
// Kept as a pair so projections stay exact.
type rate struct {
	Quantity decimal.Decimal
	Millis   int64
}

// projectedScale is the number of digits after the point of Projected
// (the ledger's scale, docs/design.md §2).
const projectedScale = 9

// project returns used + q × lag / millis, rounded up (never understated)
// to projectedScale digits after the point. The product q × lag is exact;
// only the final division rounds, towards +∞.
func project(used decimal.Decimal, r *rate, lagMillis int64) decimal.Decimal {
	if r == nil || r.Millis <= 0 || lagMillis <= 0 || !r.Quantity.IsPositive() {
		return used
	}
	num := r.Quantity.Mul(decimal.NewFromInt(lagMillis))
	q, rem := num.QuoRem(decimal.NewFromInt(r.Millis), projectedScale)
	if rem.IsPositive() {
		q = q.Add(decimal.New(1, -projectedScale))
	}
	return used.Add(q)
}

// decide is the pure decision for one rule at now.
func decide(r Rule, p periods.Period, used decimal.Decimal, asOf *time.Time, rt *rate, now time.Time) Decision {
	d := Decision{
		Customer: r.Customer, Meter: r.Meter, Period: p.Name,
		Used: used, Limit: r.Limit.Decimal, Remaining: decimal.Max(r.Limit.Decimal.Sub(used), decimal.Zero),
		RuleVersion: r.Version, Mode: r.Mode, OnStale: r.OnStale, StaleAfter: Duration(r.StaleAfter),
		DecidedAt: now,
	}
	switch {
	case used.GreaterThanOrEqual(r.Limit.Decimal):
		d.State = Exceeded
	case used.GreaterThanOrEqual(r.WarnAt.Mul(r.Limit.Decimal)):
		d.State = Warning
	default:
		d.State = OK
	}
	d.Projected = used
	if asOf != nil {
		a := asOf.UTC()
		d.AsOf = &a
		lag := Seconds(max(now.Sub(a).Milliseconds(), 0))
		d.LagSeconds = &lag
		d.Projected = project(used, rt, int64(lag))
	}
	return d
}
