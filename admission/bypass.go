package admission

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/shopspring/decimal"

	"github.com/tally-ledger/tally/amount"
)

// BypassReport is what a holder admitted without a grant (Tally was
// unreachable), reported once it is reachable again. ReportID makes the
// report idempotent: the holder resends the same id until it is answered.
type BypassReport struct {
	Holder     string
	Generation int64
	ReportID   string
	Items      []BypassItem
}

// BypassItem is one budget's bypassed admissions.
type BypassItem struct {
	Customer   string          `json:"customer"`
	Meter      string          `json:"meter"`
	Amount     decimal.Decimal `json:"amount"`
	Admissions int64           `json:"admissions"`
	FirstAt    time.Time       `json:"first_at"`
	LastAt     time.Time       `json:"last_at"`
}

// Validate reports every problem of r at once.
func (r BypassReport) Validate() error {
	errs := checkHolder(r.Holder, r.Generation)
	if !idPattern.MatchString(r.ReportID) {
		errs = append(errs, &FieldError{Field: "report_id", Detail: fmt.Sprintf("%q must be 1-128 characters of [A-Za-z0-9._:-]", r.ReportID)})
	}
	if len(r.Items) == 0 || len(r.Items) > 1000 {
		errs = append(errs, &FieldError{Field: "items", Detail: "1 to 1000 items"})
	}
	for i, it := range r.Items {
		f := fmt.Sprintf("items[%d].", i)
		if !idPattern.MatchString(it.Customer) {
			errs = append(errs, &FieldError{Field: f + "customer", Detail: fmt.Sprintf("%q is not a customer id", it.Customer)})
		}
		if !idPattern.MatchString(it.Meter) {
			errs = append(errs, &FieldError{Field: f + "meter", Detail: fmt.Sprintf("%q is not a meter", it.Meter)})
		}
		if !it.Amount.IsPositive() {
			errs = append(errs, &FieldError{Field: f + "amount", Detail: "must be positive"})
		} else if err := amount.Check(it.Amount); err != nil {
			errs = append(errs, &FieldError{Field: f + "amount", Detail: err.Error()})
		}
		if it.Admissions < 1 {
			errs = append(errs, &FieldError{Field: f + "admissions", Detail: "must be positive"})
		}
		if it.FirstAt.IsZero() || it.LastAt.Before(it.FirstAt) {
			errs = append(errs, &FieldError{Field: f + "last_at", Detail: "first_at is required and last_at must not be before it"})
		}
	}
	return errors.Join(errs...)
}

// RecordBypasses stores a bypass report, each item in the period and rule
// version in force at its first admission. A report id already stored is
// not counted twice. Bypasses are recorded from any generation: a restarted
// holder reports what its earlier generation kept on disk.
func (s *Store) RecordBypasses(ctx context.Context, r BypassReport) error {
	if err := r.Validate(); err != nil {
		return err
	}
	now := s.now()
	return pgx.BeginFunc(ctx, s.db, func(tx pgx.Tx) error {
		for _, it := range r.Items {
			p, err := periodAt(ctx, tx, it.Customer, it.FirstAt)
			if err != nil {
				return err
			}
			var version int64
			if rule, err := exactRule(ctx, tx, it.Customer, it.Meter, it.FirstAt); err == nil {
				version = rule.Version
			} else if _, ok := errors.AsType[*NotExactError](err); !ok {
				return err
			}
			_, err = tx.Exec(ctx, qInsertBypass, pgx.NamedArgs{"holder": r.Holder, "report_id": r.ReportID,
				"customer": it.Customer, "meter": it.Meter, "period_start": p.Start.UTC(), "period": p.Name,
				"rule_version": version, "generation": r.Generation, "amount": it.Amount.String(),
				"admissions": it.Admissions, "first_at": it.FirstAt.UTC(), "last_at": it.LastAt.UTC(), "now": now})
			if err != nil {
				return fmt.Errorf("admission: record bypass: %w", err)
			}
		}
		return nil
	})
}
