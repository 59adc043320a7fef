package alerts

import (
	"strconv"
	"time"

	"github.com/google/uuid"
	"github.com/shopspring/decimal"

	"github.com/tally-ledger/tally/quota"
)

// Event is what a transition tells, as delivered (docs/design.md §15).
type Event struct {
	ID          uuid.UUID      `json:"id"`
	Type        string         `json:"type"` // alert.triggered or alert.resolved
	Alert       string         `json:"alert"`
	RuleVersion int64          `json:"rule_version"`
	Subject     string         `json:"subject"`
	Customer    string         `json:"customer,omitempty"`
	Meter       string         `json:"meter"`
	Period      string         `json:"period"`
	Threshold   EventThreshold `json:"threshold"`
	// Used is the subject's usage of Period when the transition was
	// decided (for period_ended: of the period that ended, as known then;
	// when it ended before the one before now, at its last transition).
	Used       decimal.Decimal  `json:"used"`
	Limit      *decimal.Decimal `json:"limit,omitempty"`
	AsOf       *time.Time       `json:"as_of"`
	LagSeconds *quota.Seconds   `json:"lag_seconds"`
	// Reason says why a resolved event resolved: below_threshold,
	// limit_raised, usage_decreased (a credit), period_ended,
	// no_limit_in_force, rule_changed, rule_deleted.
	Reason     string    `json:"reason,omitempty"`
	OccurredAt time.Time `json:"occurred_at"`
}

// EventThreshold is the threshold crossed: its percent (for a percent
// threshold) and the usage it stood for when it was crossed (in a
// resolution too, whatever limit is in force by then).
type EventThreshold struct {
	Value   decimal.Decimal  `json:"value"`
	Percent *decimal.Decimal `json:"percent,omitempty"`
}

// Reasons of resolved events.
const (
	ReasonBelow        = "below_threshold"
	ReasonLimitRaised  = "limit_raised"
	ReasonCredited     = "usage_decreased"
	ReasonPeriodEnded  = "period_ended"
	ReasonNoLimit      = "no_limit_in_force"
	ReasonRuleChanged  = "rule_changed"
	ReasonRuleDeleted  = "rule_deleted"
	eventIDNamespaceID = "6f1c5a0e-8d2b-4b7e-9f3a-2c4d5e6f7a8b"
)

var eventNamespace = uuid.MustParse(eventIDNamespaceID)

// EventID is the stable id of the n-th transition (from 1) of (rule,
// subject, threshold, period): every evaluation that makes this
// transition, and every delivery of it, carries this id.
func EventID(rule, subject, threshold, period string, n int) uuid.UUID {
	return uuid.NewSHA1(eventNamespace, []byte(rule+"\x00"+subject+"\x00"+threshold+"\x00"+period+"\x00"+strconv.Itoa(n)))
}
