package reconcile

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
)

// ErrNotFound: no such run.
var ErrNotFound = errors.New("reconciliation run not found")

// Get loads a stored run with its findings.
func Get(ctx context.Context, db interface {
	QueryRow(context.Context, string, ...any) pgx.Row
	Query(context.Context, string, ...any) (pgx.Rows, error)
}, id uuid.UUID) (*Run, error) {
	r := &Run{ID: id, Findings: []Finding{}}
	var customer, errText *string
	var checks, totals []byte
	err := db.QueryRow(ctx, qRunSelect, id).Scan(&r.Period, &customer, &r.Deep, &r.Status, &r.StartedAt, &r.FinishedAt,
		&r.EntriesScanned, &checks, &totals, &errText)
	if errors.Is(err, pgx.ErrNoRows) {
		return nil, ErrNotFound
	}
	if err != nil {
		return nil, fmt.Errorf("reconcile: load run: %w", err)
	}
	if customer != nil {
		r.Customer = *customer
	}
	if errText != nil {
		r.Error = *errText
	}
	if err := json.Unmarshal(checks, &r.Checks); err != nil {
		return nil, err
	}
	if err := json.Unmarshal(totals, &r.Totals); err != nil {
		return nil, err
	}
	rows, err := db.Query(ctx, qFindingsSelect, id)
	if err != nil {
		return nil, fmt.Errorf("reconcile: load findings: %w", err)
	}
	defer rows.Close()
	for rows.Next() {
		var f Finding
		var period *time.Time
		var amt nullNumeric
		if err := rows.Scan(&f.Kind, &f.Severity, &f.Customer, &f.Meter, &f.Stream, &period, &amt, &f.Detail, &f.Omitted); err != nil {
			return nil, err
		}
		f.Period = period
		if amt.Valid {
			d := amt.dec()
			f.Amount = &d
		}
		r.Findings = append(r.Findings, f)
	}
	return r, rows.Err()
}

// Summary is a stored run without its findings, checks and totals, with
// the findings counted: one line of a list of runs.
type Summary struct {
	ID             uuid.UUID  `json:"id"`
	Period         string     `json:"period"`
	Customer       string     `json:"customer,omitempty"`
	Deep           bool       `json:"deep"`
	Status         string     `json:"status"`
	StartedAt      time.Time  `json:"started_at"`
	FinishedAt     *time.Time `json:"finished_at,omitempty"`
	EntriesScanned int64      `json:"entries_scanned"`
	Findings       int        `json:"findings"`
	Discrepancies  int        `json:"discrepancies"` // findings that block a close
	Error          string     `json:"error,omitempty"`
}

// List returns stored runs newest first: those of period (as it was asked
// for, e.g. "2026-11-01"; "" for every period), started before the run
// after (uuid.Nil: from the newest), at most limit.
func List(ctx context.Context, db interface {
	Query(context.Context, string, ...any) (pgx.Rows, error)
}, period string, after uuid.UUID, limit int) ([]Summary, error) {
	if limit <= 0 {
		limit = 100
	}
	before := uuid.Max
	if after != uuid.Nil {
		before = after
	}
	q, args := qRunsList, []any{before, limit, Discrepancy}
	if period != "" {
		q, args = qRunsListOfPeriod, append(args, period)
	}
	rows, err := db.Query(ctx, q, args...)
	if err != nil {
		return nil, fmt.Errorf("reconcile: list runs: %w", err)
	}
	out, err := pgx.CollectRows(rows, func(row pgx.CollectableRow) (Summary, error) {
		var s Summary
		err := row.Scan(&s.ID, &s.Period, &s.Customer, &s.Deep, &s.Status, &s.StartedAt, &s.FinishedAt, &s.EntriesScanned,
			&s.Error, &s.Findings, &s.Discrepancies)
		s.StartedAt = s.StartedAt.UTC()
		if s.FinishedAt != nil {
			t := s.FinishedAt.UTC()
			s.FinishedAt = &t
		}
		return s, err
	})
	if err != nil {
		return nil, fmt.Errorf("reconcile: list runs: %w", err)
	}
	return out, nil
}
