package quota

import (
	"context"
	"encoding/json"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/shopspring/decimal"
)

// loadDecisions reads stored decisions (the exact published JSON).
func loadDecisions(ctx context.Context, db DBTX, q string, args ...any) ([]Decision, error) {
	rows, err := db.Query(ctx, q, args...)
	if err != nil {
		return nil, fmt.Errorf("quota: read decisions: %w", err)
	}
	ds, err := pgx.CollectRows(rows, func(row pgx.CollectableRow) (Decision, error) {
		var raw []byte
		if err := row.Scan(&raw); err != nil {
			return Decision{}, err
		}
		var d Decision
		if err := json.Unmarshal(raw, &d); err != nil {
			return Decision{}, fmt.Errorf("stored decision: %w", err)
		}
		return d, nil
	})
	if err != nil {
		return nil, fmt.Errorf("quota: read decisions: %w", err)
	}
	return ds, nil
}

// exactDecisions returns the keys ("customer/meter") of the stored
// decisions made under an exact rule: the admission of the rule version
// each was decided under.
func exactDecisions(ctx context.Context, db DBTX) ([]string, error) {
	rows, err := db.Query(ctx, qExactDecisions)
	if err != nil {
		return nil, fmt.Errorf("quota: read decisions' rules: %w", err)
	}
	keys, err := pgx.CollectRows(rows, pgx.RowTo[string])
	if err != nil {
		return nil, fmt.Errorf("quota: read decisions' rules: %w", err)
	}
	return keys, nil
}

// Decisions returns the latest published decision of each of customer's
// rules, as the enforcer stored it.
func Decisions(ctx context.Context, db DBTX, customer string) ([]Decision, error) {
	return loadDecisions(ctx, db, qCustomerDecisions, customer)
}

// Overage is usage admitted while a quota was exceeded or stale, for one
// period, customer and meter (docs/design.md §6 check 7).
type Overage struct {
	Customer    string    `json:"customer"`
	Meter       string    `json:"meter"`
	PeriodStart time.Time `json:"period_start"`
	Period      string    `json:"period"`
	// WhileExceeded is usage that became visible in the ledger while the
	// decision in force was exceeded in enforce mode. It includes usage
	// admitted before gateways received that decision (at most about
	// rate × lag): this is the enforcement overshoot.
	WhileExceeded decimal.Decimal `json:"while_exceeded"`
	// WhileStale is usage that became visible while the decision in force
	// had gone stale (older than stale_after) and was not exceeded. The two
	// amounts never count the same usage.
	WhileStale decimal.Decimal `json:"while_stale"`
	// OverLimit is the largest used - limit any decision showed.
	OverLimit decimal.Decimal `json:"over_limit"`
	UpdatedAt time.Time       `json:"updated_at"`
}

// Overages returns the overage of every (customer, meter) in the period
// starting at periodStart (of one customer when customer is not empty).
func Overages(ctx context.Context, db DBTX, periodStart time.Time, customer string) ([]Overage, error) {
	var c *string
	if customer != "" {
		c = &customer
	}
	rows, err := db.Query(ctx, qOverage, periodStart, c)
	if err != nil {
		return nil, fmt.Errorf("quota: read overage: %w", err)
	}
	out, err := pgx.CollectRows(rows, func(row pgx.CollectableRow) (Overage, error) {
		var o Overage
		var ex, st, ol string
		if err := row.Scan(&o.Customer, &o.Meter, &o.PeriodStart, &o.Period, &ex, &st, &ol, &o.UpdatedAt); err != nil {
			return Overage{}, err
		}
		var err error
		if o.WhileExceeded, err = decimal.NewFromString(ex); err != nil {
			return Overage{}, err
		}
		if o.WhileStale, err = decimal.NewFromString(st); err != nil {
			return Overage{}, err
		}
		if o.OverLimit, err = decimal.NewFromString(ol); err != nil {
			return Overage{}, err
		}
		o.PeriodStart, o.UpdatedAt = o.PeriodStart.UTC(), o.UpdatedAt.UTC()
		return o, nil
	})
	if err != nil {
		return nil, fmt.Errorf("quota: read overage: %w", err)
	}
	return out, nil
}
