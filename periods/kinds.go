package periods

import (
	"context"
	"time"

	"github.com/shopspring/decimal"
)

// GaugeLine is a gauge of a statement (docs/design.md §16): its aggregates
// over the period, frozen with the statement at close. A late reading that
// changes a closed period's level-seconds is billed in a later period
// (PriorPeriodUnitSeconds there), never here.
type GaugeLine struct {
	Meter                  string          `json:"meter"`
	Max                    decimal.Decimal `json:"max"`
	Latest                 decimal.Decimal `json:"latest"`
	UnitSeconds            decimal.Decimal `json:"unit_seconds"`
	UnitHours              decimal.Decimal `json:"unit_hours"`
	Average                decimal.Decimal `json:"average"`
	PriorPeriodUnitSeconds decimal.Decimal `json:"prior_period_unit_seconds"`
}

// UniqueLine is a unique meter of a statement: its distinct members in the
// period.
type UniqueLine struct {
	Meter string `json:"meter"`
	Count int64  `json:"count"`
}

// KindLines are a statement's gauges and unique meters.
type KindLines struct {
	Gauges  []GaugeLine
	Uniques []UniqueLine
}

// KindLinesFunc reads a customer's gauges and unique meters over a period
// through now. Package ledger owns those tables and provides one
// (ledger.StatementKinds); a Store without one has statements of counters
// only.
type KindLinesFunc func(ctx context.Context, db DBTX, customer string, p Period, now time.Time) (KindLines, error)
