package admission

import (
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/google/uuid"
	"github.com/shopspring/decimal"

	"github.com/tally-ledger/tally/validation"
)

// ErrNotFound: no such grant.
var ErrNotFound = errors.New("admission: no such grant")

// ErrUnknownHolder: no grant was ever issued to the holder.
var ErrUnknownHolder = errors.New("admission: no such holder")

// ErrKeptChanging: the rules or pool memberships that decide which
// budgets a request draws from changed under every one of its attempts
// (maxReplans). Nothing was issued; the request may be sent again.
var ErrKeptChanging = errors.New("the budgets kept changing while issuing")

// The typed errors below, and ErrKeptChanging, refuse a caller's request:
// the REST API answers their text as the problem's detail, so it says what
// is wrong as the caller reads it, without this package's name.

// FieldError is one problem of an input, naming its field: the shape
// every domain package returns, so the REST API maps them in one place.
type FieldError = validation.FieldError

// BudgetExhaustedError refuses a grant: the binding budget has less than
// the amount (or min_amount) available.
type BudgetExhaustedError struct {
	// Binding names the budget that refused: "customer:<id>/<meter>".
	Binding string
	// Available is limit - consumed, never negative.
	Available decimal.Decimal
	// RetryAfter is when the earliest live grant is reclaimed at the latest
	// (it may be released earlier), or the period's end when none is live.
	RetryAfter time.Duration
	// Held is what other holders' live grants on the binding budget still
	// hold, by the spend they have reported: capacity that comes back if
	// they give it back unspent. Zero when they hold none: the budget is
	// spent, not only held (an SDK then stops asking for a while).
	Held decimal.Decimal
	// Burst is set when the binding budget is a rate bucket and the
	// request asked for more than its burst (min_amount, or amount
	// without one): no refill makes it hold that, and RetryAfter is 0.
	Burst decimal.NullDecimal
}

func (e *BudgetExhaustedError) Error() string {
	if e.Burst.Valid {
		return fmt.Sprintf("budget %s exhausted: %s available, and the request asks for more than the burst %s: no refill holds it",
			e.Binding, e.Available, e.Burst.Decimal)
	}
	return fmt.Sprintf("budget %s exhausted: %s available, retry after %s", e.Binding, e.Available, e.RetryAfter)
}

// OmittedBudgetError refuses a request that must draw from every exact
// budget that applies (IssueRequest.EveryBudget) but names a subset that
// leaves some out: a gateway cannot opt a customer out of its contract.
type OmittedBudgetError struct {
	Customer, Meter string
	Omitted         []string // the applicable scopes left out, sorted
}

func (e *OmittedBudgetError) Error() string {
	return fmt.Sprintf("a grant for %s/%s must draw from every budget that applies; budgets leaves out %s",
		e.Customer, e.Meter, strings.Join(e.Omitted, ", "))
}

// NotExactError: customer and meter have no rule in force, or their rule's
// admission is not exact (Rule is then "" or "lagged").
type NotExactError struct {
	Customer, Meter string
	Admission       string // "" when there is no rule
}

func (e *NotExactError) Error() string {
	if e.Admission == "" {
		return fmt.Sprintf("%s/%s has no quota rule", e.Customer, e.Meter)
	}
	return fmt.Sprintf("%s/%s has a %s rule, not exact", e.Customer, e.Meter, e.Admission)
}

// StaleGenerationError: the holder has shown a newer generation; the older
// one is refused everything.
//
// Next is the generation a holder that lost its state recovers with
// (docs/gateways-exact.md): one above every generation stored. Only a holder
// that has not been issued anything under Generation since it started may
// take it; a running holder that is refused is the older incarnation, and
// must stop, not leapfrog the newer one.
type StaleGenerationError struct {
	Holder     string
	Generation int64
	Current    int64
	Next       int64
}

func staleGeneration(holder string, generation, current int64) *StaleGenerationError {
	return &StaleGenerationError{Holder: holder, Generation: generation, Current: current, Next: current + 1}
}

func (e *StaleGenerationError) Error() string {
	return fmt.Sprintf("holder %s generation %d is older than its generation %d (a holder that lost its state starts again at %d)",
		e.Holder, e.Generation, e.Current, e.Next)
}

// BypassConflictError: a bypass report id the holder already used for a
// report of other content. The report is not stored; resending it under a
// new id stores it.
type BypassConflictError struct {
	Holder   string
	ReportID string
}

func (e *BypassConflictError) Error() string {
	return fmt.Sprintf("holder %s already reported other bypasses under report id %q", e.Holder, e.ReportID)
}

// GenerationJumpError refuses a generation more than MaxGenerationStep
// above the holder's stored highest (Current; 0 for a holder never
// issued a grant): one request must not fence a holder for good.
type GenerationJumpError struct {
	Holder              string
	Generation, Current int64
}

func (e *GenerationJumpError) Error() string {
	return fmt.Sprintf("holder %s generation %d is more than %d above its generation %d",
		e.Holder, e.Generation, MaxGenerationStep, e.Current)
}

// FencedError: a renew or release for a grant held by another holder or
// generation.
type FencedError struct {
	Grant      uuid.UUID
	Holder     string
	Generation int64
}

func (e *FencedError) Error() string {
	return fmt.Sprintf("grant %s is not held by %s generation %d", e.Grant, e.Holder, e.Generation)
}

// GrantEndedError: the grant was released or reclaimed.
type GrantEndedError struct {
	Grant   uuid.UUID
	EndedAt time.Time
	Reason  string // released or expired
}

func (e *GrantEndedError) Error() string {
	return fmt.Sprintf("grant %s ended (%s) at %s", e.Grant, e.Reason, e.EndedAt.Format(time.RFC3339Nano))
}

// SpentError: a reported spent went backwards or above the amount.
type SpentError struct {
	Grant    uuid.UUID
	Spent    decimal.Decimal
	Previous decimal.Decimal
	Amount   decimal.Decimal
}

func (e *SpentError) Error() string {
	return fmt.Sprintf("grant %s: spent %s must be between the last reported %s and the amount %s",
		e.Grant, e.Spent, e.Previous, e.Amount)
}
