package ledger

import (
	"time"

	"github.com/google/uuid"
	"github.com/shopspring/decimal"
)

// StreamKey identifies a stream: one producer generation's running total
// for one customer and meter.
type StreamKey struct {
	Producer string
	Epoch    int64
	Customer string
	Meter    string
}

// Record is one usage report as the ledger sees it (docs/design.md §2).
type Record struct {
	OperationID uuid.UUID
	Stream      StreamKey
	Seq         int64
	Total       decimal.Decimal     // running absolute total through Seq
	Quantity    decimal.NullDecimal // optional: Total minus the previous total
	OccurredAt  time.Time
	Final       bool
	// Shape is what the record carries: Counter (the zero value) a Total,
	// Gauge a Level, Unique a Member (docs/design.md §16). It must match
	// its meter's declared kind.
	Shape  MeterKind
	Level  decimal.Decimal // gauge: the stream's level from OccurredAt on
	Member string          // unique: the member active at OccurredAt
}

// Kind is what applying a record did.
type Kind uint8

// The outcomes of docs/design.md §3. Their String forms are stored and counted.
const (
	Applied Kind = iota + 1
	Duplicate
	Conflict
	LateFill
	Rejected
)

var kindNames = [...]string{"", "applied", "duplicate", "conflict", "late_fill", "rejected"}

func (k Kind) String() string {
	if int(k) < len(kindNames) {
		return kindNames[k]
	}
	return "unknown"
}

// Kinds lists every outcome kind, for counters and metrics.
var Kinds = []Kind{Applied, Duplicate, Conflict, LateFill, Rejected}

// Reasons given with Rejected and Conflict outcomes.
const (
	ReasonInvalid         = "invalid_record"           // Apply's own input check failed (Detail says which field)
	ReasonTotalDecreased  = "total_decreased"          // counter reset without a new epoch
	ReasonFutureTimestamp = "future_timestamp"         // occurred_at more than MaxClockSkew ahead of the ledger clock
	ReasonOperationReused = "operation_id_reused"      // same operation_id, different content
	ReasonSeqReused       = "seq_reused"               // same stream and seq under another operation_id
	ReasonOutOfBounds     = "late_fill_out_of_bounds"  // a late fill's total is outside its neighbours' totals
	ReasonKindMismatch    = "meter_kind_mismatch"      // the record's shape (total, level, member) is not its meter's declared kind
	ReasonTimeOrder       = "occurred_at_out_of_order" // a gauge or unique reading's occurred_at is not non-decreasing with seq
)

// MaxClockSkew is how far ahead of the ledger's clock occurred_at may be.
// A calendar change needs as much notice (periods.ChangeNotice equals it).
const MaxClockSkew = 5 * time.Minute

// Outcome is the result of applying one record.
type Outcome struct {
	Kind   Kind
	Reason string // for Rejected and Conflict
	Detail string // human-readable explanation for Rejected and Conflict
	// Billed is the amount this record added to the ledger (applied: total
	// minus the previous total; everything else: zero).
	Billed decimal.Decimal
	// Period is the start of the period the billed amount went to.
	Period time.Time
}
