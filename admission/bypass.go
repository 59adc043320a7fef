package admission

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/shopspring/decimal"

	"github.com/tally-ledger/tally/amount"
	"github.com/tally-ledger/tally/ingest/wire"
	"github.com/tally-ledger/tally/internal/ids"
	"github.com/tally-ledger/tally/internal/pgnamed"
	"github.com/tally-ledger/tally/ledger"
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
	if !ids.Valid(r.ReportID) {
		errs = append(errs, &FieldError{Field: "report_id", Detail: fmt.Sprintf("%q must be "+ids.Rule, r.ReportID)})
	}
	if len(r.Items) == 0 || len(r.Items) > 1000 {
		errs = append(errs, &FieldError{Field: "items", Detail: "1 to 1000 items"})
	}
	for i, it := range r.Items {
		f := fmt.Sprintf("items[%d].", i)
		if !ids.Valid(it.Customer) {
			errs = append(errs, &FieldError{Field: f + "customer", Detail: fmt.Sprintf("%q is not a customer id: %s", it.Customer, ids.Rule)})
		}
		if !ids.Valid(it.Meter) {
			errs = append(errs, &FieldError{Field: f + "meter", Detail: fmt.Sprintf("%q is not a meter: %s", it.Meter, ids.Rule)})
		}
		if !it.Amount.IsPositive() {
			errs = append(errs, &FieldError{Field: f + "amount", Detail: "must be positive"})
		} else if err := amount.Check(it.Amount); err != nil {
			errs = append(errs, &FieldError{Field: f + "amount", Detail: err.Error()})
		}
		if it.Admissions < 1 {
			errs = append(errs, &FieldError{Field: f + "admissions", Detail: "must be positive"})
		}
		if slices.ContainsFunc(r.Items[:i], func(o BypassItem) bool { return o.Customer == it.Customer && o.Meter == it.Meter }) {
			errs = append(errs, &FieldError{Field: f + "meter", Detail: fmt.Sprintf("%s/%s is reported twice: one item per customer and meter", it.Customer, it.Meter)})
		}
		switch {
		case it.FirstAt.IsZero() || it.LastAt.Before(it.FirstAt):
			errs = append(errs, &FieldError{Field: f + "last_at", Detail: "first_at is required and last_at must not be before it"})
		case it.FirstAt.Before(wire.MinOccurredAt):
			errs = append(errs, &FieldError{Field: f + "first_at", Detail: fmt.Sprintf("%s is before %s, as no usage can be",
				it.FirstAt.UTC().Format(time.RFC3339), wire.MinOccurredAt.Format(time.DateOnly))})
		}
	}
	return errors.Join(errs...)
}

// checkBypassTimes refuses items whose last admission is more than the
// ledger's clock skew ahead of now: a bypass is an admission that
// happened, booked in the period of its first one, and one stamped ahead
// would count in the books of a period to come (usage stamped so is
// refused too, ledger.MaxClockSkew).
func (r BypassReport) checkBypassTimes(now time.Time) error {
	var errs []error
	for i, it := range r.Items {
		if it.LastAt.After(now.Add(ledger.MaxClockSkew)) {
			errs = append(errs, &FieldError{Field: fmt.Sprintf("items[%d].last_at", i), Detail: fmt.Sprintf(
				"%s is more than %s ahead of Tally's clock (%s): a bypass reports admissions that happened",
				it.LastAt.UTC().Format(time.RFC3339Nano), ledger.MaxClockSkew, now.UTC().Format(time.RFC3339Nano))})
		}
	}
	return errors.Join(errs...)
}

// RecordBypasses stores a bypass report, each item in the period and rule
// version in force at its first admission. The same report sent again (a
// retry) is stored once. A report id the holder already used for a report
// of other content is refused with *BypassConflictError, never dropped: a
// holder that lost its state may reuse ids, and what it reports must not
// vanish. Bypasses are recorded from any generation: a restarted holder
// reports what its earlier generation kept on disk.
func (s *Store) RecordBypasses(ctx context.Context, r BypassReport) error {
	if err := r.Validate(); err != nil {
		return err
	}
	now := s.now()
	if err := r.checkBypassTimes(now); err != nil {
		return err
	}
	var err error
	// Twice at most: a concurrent copy of the same report that commits
	// first makes this one's insert conflict, and the second attempt
	// finds it stored.
	for range 2 {
		err = pgx.BeginFunc(ctx, s.db, func(tx pgx.Tx) error { return s.recordBypasses(ctx, tx, r, now) })
		if pgErr, ok := errors.AsType[*pgconn.PgError](err); !ok || pgErr.Code != uniqueViolation {
			return err
		}
	}
	return &BypassConflictError{Holder: r.Holder, ReportID: r.ReportID}
}

// uniqueViolation is Postgres's SQLSTATE for a unique key already taken.
const uniqueViolation = "23505"

// bypassRow is one stored item of a report.
type bypassRow struct {
	customer, meter string
	periodStart     time.Time
	amount          decimal.Decimal
	admissions      int64
	firstAt, lastAt time.Time
}

func (b bypassRow) same(o bypassRow) bool {
	return b.customer == o.customer && b.meter == o.meter && b.periodStart.Equal(o.periodStart) && b.amount.Equal(o.amount) &&
		b.admissions == o.admissions && b.firstAt.Equal(o.firstAt) && b.lastAt.Equal(o.lastAt)
}

func (s *Store) recordBypasses(ctx context.Context, tx pgx.Tx, r BypassReport, now time.Time) error {
	rows, err := tx.Query(ctx, qStoredBypassReport, pgnamed.Args{"holder": r.Holder, "report_id": r.ReportID})
	if err != nil {
		return fmt.Errorf("admission: read bypass report: %w", err)
	}
	stored, err := pgx.CollectRows(rows, func(row pgx.CollectableRow) (bypassRow, error) {
		var b bypassRow
		err := row.Scan(&b.customer, &b.meter, &b.periodStart, numeric(&b.amount), &b.admissions, &b.firstAt, &b.lastAt)
		return b, err
	})
	if err != nil {
		return fmt.Errorf("admission: read bypass report: %w", err)
	}
	items := make([]bypassRow, len(r.Items))
	versions := make([]int64, len(r.Items))
	names := make([]string, len(r.Items))
	for i, it := range r.Items {
		p, err := periodAt(ctx, tx, it.Customer, it.FirstAt)
		if err != nil {
			return err
		}
		if rule, err := exactRule(ctx, tx, it.Customer, it.Meter, it.FirstAt); err == nil {
			versions[i] = rule.Version
		} else if _, ok := errors.AsType[*NotExactError](err); !ok {
			return err
		}
		items[i] = bypassRow{customer: it.Customer, meter: it.Meter, periodStart: p.Start.UTC(), amount: it.Amount,
			admissions: it.Admissions, firstAt: it.FirstAt.UTC().Truncate(time.Microsecond), lastAt: it.LastAt.UTC().Truncate(time.Microsecond)}
		names[i] = p.Name
	}
	if len(stored) > 0 {
		if sameReport(stored, items) {
			return nil // a retry of a stored report
		}
		return &BypassConflictError{Holder: r.Holder, ReportID: r.ReportID}
	}
	for i, it := range items {
		_, err = tx.Exec(ctx, qInsertBypass, pgnamed.Args{"holder": r.Holder, "report_id": r.ReportID,
			"customer": it.customer, "meter": it.meter, "period_start": it.periodStart, "period": names[i],
			"rule_version": versions[i], "generation": r.Generation, "amount": it.amount.String(),
			"admissions": it.admissions, "first_at": it.firstAt, "last_at": it.lastAt, "now": now})
		if err != nil {
			return fmt.Errorf("admission: record bypass: %w", err)
		}
	}
	return nil
}

// sameReport says whether stored and items are the same items, in any order.
func sameReport(stored, items []bypassRow) bool {
	if len(stored) != len(items) {
		return false
	}
	for _, it := range items {
		if !slices.ContainsFunc(stored, it.same) {
			return false
		}
	}
	return true
}
