package reconcile

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/shopspring/decimal"
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
	err := db.QueryRow(ctx, `SELECT period, customer, deep, status, started_at, finished_at, entries_scanned, checks, totals, error
FROM reconciliation_runs WHERE id = $1`, id).Scan(&r.Period, &customer, &r.Deep, &r.Status, &r.StartedAt, &r.FinishedAt,
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
	rows, err := db.Query(ctx, `SELECT kind, severity, coalesce(customer, ''), coalesce(meter, ''), coalesce(stream, ''), period_start,
       trim_scale(amount)::text, detail FROM reconciliation_findings WHERE run_id = $1 ORDER BY n`, id)
	if err != nil {
		return nil, fmt.Errorf("reconcile: load findings: %w", err)
	}
	defer rows.Close()
	for rows.Next() {
		var f Finding
		var period *time.Time
		var amt *string
		if err := rows.Scan(&f.Kind, &f.Severity, &f.Customer, &f.Meter, &f.Stream, &period, &amt, &f.Detail); err != nil {
			return nil, err
		}
		f.Period = period
		if amt != nil {
			d := decimal.RequireFromString(*amt)
			f.Amount = &d
		}
		r.Findings = append(r.Findings, f)
	}
	return r, rows.Err()
}
