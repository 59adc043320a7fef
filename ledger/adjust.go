package ledger

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/json"
	"errors"
	"fmt"
	"time"
	"unicode/utf8"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/shopspring/decimal"

	"github.com/tally-ledger/tally/amount"
	"github.com/tally-ledger/tally/internal/ids"
	"github.com/tally-ledger/tally/internal/locks"
	"github.com/tally-ledger/tally/periods"
	"github.com/tally-ledger/tally/validation"
)

// Adjustment is a manual credit (negative) or debit (positive) entry.
type Adjustment struct {
	OperationID uuid.UUID
	Customer    string
	Meter       string
	Quantity    decimal.Decimal // signed
	OccurredAt  time.Time       // zero: now
	Reason      string
	Actor       string
}

// ErrAdjustmentConflict: the operation id was used before with other content.
var ErrAdjustmentConflict = errors.New("operation_id was already used for a different adjustment")

// Validate reports every problem with the adjustment at once: errors.Join
// of *validation.FieldError.
func (a Adjustment) Validate() error {
	var errs []error
	if a.OperationID == uuid.Nil {
		errs = append(errs, validation.Errorf("operation_id", "required"))
	}
	if !ids.Valid(a.Customer) {
		errs = append(errs, validation.Errorf("customer", "%q is not "+ids.Rule, a.Customer))
	}
	if !ids.Valid(a.Meter) {
		errs = append(errs, validation.Errorf("meter", "%q is not "+ids.Rule, a.Meter))
	}
	if a.Quantity.IsZero() {
		errs = append(errs, validation.Errorf("quantity", "must not be zero"))
	} else if err := amount.Check(a.Quantity); err != nil {
		errs = append(errs, validation.Errorf("quantity", "%v", err))
	}
	if a.Reason == "" || utf8.RuneCountInString(a.Reason) > 1000 {
		errs = append(errs, validation.Errorf("reason", "required, at most 1000 characters"))
	}
	if a.Actor == "" || utf8.RuneCountInString(a.Actor) > 200 {
		errs = append(errs, validation.Errorf("actor", "required, at most 200 characters"))
	}
	return errors.Join(errs...)
}

// AdjustmentResult is the stored adjustment.
type AdjustmentResult struct {
	ID          uuid.UUID
	Period      time.Time  // the period it was booked in
	PriorPeriod *time.Time // set when OccurredAt's own period was closed
	OccurredAt  time.Time
	Created     bool // false: an identical earlier request already booked it
}

// Adjust books a manual adjustment inside tx. It is idempotent by
// operation id: the same request again returns the first result with
// Created false; another request with the same id fails with
// ErrAdjustmentConflict, also when the two requests race (it needs READ
// COMMITTED, Postgres's default, to see the winner's row).
func (l *Ledger) Adjust(ctx context.Context, tx Tx, adj Adjustment) (AdjustmentResult, error) {
	if err := adj.Validate(); err != nil {
		return AdjustmentResult{}, err
	}
	now := l.now().UTC().Truncate(time.Microsecond)
	hash := adj.requestHash()
	occurred := adj.OccurredAt.UTC().Truncate(time.Microsecond)
	if adj.OccurredAt.IsZero() {
		occurred = now
	}
	if occurred.After(now.Add(MaxClockSkew)) {
		return AdjustmentResult{}, fmt.Errorf("occurred_at: %s is in the future", occurred.Format(time.RFC3339))
	}

	a := &applier{now: now, calendars: map[string]periods.Schedule{}, closed: map[periodKey]bool{}, rollups: map[rollupKey]decimal.Decimal{}}
	if err := a.loadCustomers(ctx, tx, []string{adj.Customer}, occurred); err != nil {
		return AdjustmentResult{}, err
	}
	// The same operation id again? Compare the request, not the derived fields.
	if res, found, err := storedAdjustment(ctx, tx, adj.OperationID, hash); found || err != nil {
		return res, err
	}

	// An adjustment is an amount of a counter. A gauge's or a unique
	// meter's statement lines are its readings: an amount there would show
	// in the billed total and in no usage answer. The kind is read under
	// the meter-kinds lock (shared), so it cannot change before the commit.
	if _, err := tx.Exec(ctx, qLockMeterKindsShared, locks.MeterKinds); err != nil {
		return AdjustmentResult{}, fmt.Errorf("ledger: adjust: %w", err)
	}
	kinds, err := MeterKinds(ctx, tx, []string{adj.Meter})
	if err != nil {
		return AdjustmentResult{}, err
	}
	if k := kinds[adj.Meter]; k != Counter {
		return AdjustmentResult{}, validation.Errorf("meter", "%q is a %s: adjustments are amounts of a counter (a %s's statement lines are its readings)", adj.Meter, k, k)
	}

	period, bucket, prior, err := a.billingPlace(adj.Customer, occurred)
	if err != nil {
		return AdjustmentResult{}, err
	}
	reason, actor := adj.Reason, adj.Actor
	a.entries = []entry{{kind: "adjustment", operationID: adj.OperationID, customer: adj.Customer, meter: adj.Meter,
		amount: adj.Quantity, period: period, bucket: bucket, priorPeriod: prior, occurredAt: occurred,
		reason: &reason, actor: &actor, requestHash: hash}}
	// A concurrent request with the same operation id may have inserted
	// since the select: the insert then waits for it and, once it has
	// committed, inserts nothing, and its stored answer (or the conflict)
	// is ours. The rollups follow only an entry this call inserted.
	b := &pgx.Batch{}
	var inserted bool
	queueEntries(b, a.entries, now, qInsertAdjustment).Query(func(rows pgx.Rows) error {
		inserted = rows.Next()
		rows.Close()
		return rows.Err()
	})
	if err := tx.SendBatch(ctx, b).Close(); err != nil {
		return AdjustmentResult{}, fmt.Errorf("ledger: adjust: %w", err)
	}
	if !inserted {
		res, found, err := storedAdjustment(ctx, tx, adj.OperationID, hash)
		if err == nil && !found {
			err = fmt.Errorf("ledger: adjust: operation_id %s: the insert found it taken, the select found nothing", adj.OperationID)
		}
		return res, err
	}
	a.roll(adj.Customer, adj.Meter, period, bucket, adj.Quantity)
	b = &pgx.Batch{}
	if err := a.queueRollups(b); err != nil {
		return AdjustmentResult{}, err
	}
	if err := tx.SendBatch(ctx, b).Close(); err != nil {
		return AdjustmentResult{}, fmt.Errorf("ledger: adjust: %w", err)
	}
	return AdjustmentResult{ID: a.entries[0].id, Period: period, PriorPeriod: prior, OccurredAt: occurred, Created: true}, nil
}

// storedAdjustment is the adjustment booked under id, if any: its result
// when its request hash is hash, else ErrAdjustmentConflict.
func storedAdjustment(ctx context.Context, tx Tx, id uuid.UUID, hash []byte) (AdjustmentResult, bool, error) {
	var res AdjustmentResult
	var stored []byte
	err := tx.QueryRow(ctx, qSelectAdjustment, id).Scan(&res.ID, &res.Period, &res.PriorPeriod, &res.OccurredAt, &stored)
	switch {
	case errors.Is(err, pgx.ErrNoRows):
		return AdjustmentResult{}, false, nil
	case err != nil:
		return AdjustmentResult{}, false, fmt.Errorf("ledger: adjust: %w", err)
	case !bytes.Equal(stored, hash):
		return AdjustmentResult{}, true, ErrAdjustmentConflict
	}
	return res, true, nil
}

func (a Adjustment) requestHash() []byte {
	occurred := ""
	if !a.OccurredAt.IsZero() {
		occurred = a.OccurredAt.UTC().Truncate(time.Microsecond).Format(time.RFC3339Nano)
	}
	b, _ := json.Marshal([]string{a.Customer, a.Meter, a.Quantity.String(), occurred, a.Reason, a.Actor})
	h := sha256.Sum256(b)
	return h[:]
}
