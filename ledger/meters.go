package ledger

import (
	"context"
	"errors"
	"fmt"
	"time"
	"unicode/utf8"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/tally-ledger/tally/internal/ids"
	"github.com/tally-ledger/tally/internal/locks"
	"github.com/tally-ledger/tally/validation"
)

// MeterKind is what a meter measures (docs/design.md §16): a running total
// (counter), a level (gauge) or distinct members (unique).
type MeterKind string

// The meter kinds. An undeclared meter is a Counter.
const (
	Counter MeterKind = "counter"
	Gauge   MeterKind = "gauge"
	Unique  MeterKind = "unique"
)

// Valid reports whether k is one of the kinds.
func (k MeterKind) Valid() bool { return k == Counter || k == Gauge || k == Unique }

// Meter is a meter's declaration.
type Meter struct {
	Meter       string    `json:"meter"`
	Kind        MeterKind `json:"kind"`
	Unit        string    `json:"unit"`
	Description string    `json:"description"`
	// Declared is false for a meter nobody declared (a counter).
	Declared  bool       `json:"declared"`
	CreatedAt *time.Time `json:"created_at,omitempty"`
	UpdatedAt *time.Time `json:"updated_at,omitempty"`
}

// Validate reports every problem with a declaration at once.
func (m Meter) Validate() error {
	var errs []error
	if !ids.Valid(m.Meter) {
		errs = append(errs, validation.Errorf("meter", "%q is not 1-128 characters of A-Z a-z 0-9 . _ : -", m.Meter))
	}
	if !m.Kind.Valid() {
		errs = append(errs, validation.Errorf("kind", "%q is not one of counter, gauge, unique", string(m.Kind)))
	}
	if utf8.RuneCountInString(m.Unit) > 64 {
		errs = append(errs, validation.Errorf("unit", "is more than 64 characters"))
	}
	if utf8.RuneCountInString(m.Description) > 1000 {
		errs = append(errs, validation.Errorf("description", "is more than 1000 characters"))
	}
	return errors.Join(errs...)
}

// KindInUseError: a meter's kind cannot change once it has usage.
type KindInUseError struct {
	Meter    string
	Kind     MeterKind // the kind in force
	Proposed MeterKind
}

func (e KindInUseError) Error() string {
	return fmt.Sprintf("meter %q is a %s with usage; its kind cannot become %s", e.Meter, e.Kind, e.Proposed)
}

// DBTX is what the meter reads need of a pool, a connection or a transaction.
type DBTX interface {
	Query(ctx context.Context, sql string, args ...any) (pgx.Rows, error)
	QueryRow(ctx context.Context, sql string, args ...any) pgx.Row
	Exec(ctx context.Context, sql string, args ...any) (pgconn.CommandTag, error)
}

// DeclareMeter creates or updates a meter's declaration inside tx. Unit and
// description may change at any time; the kind only while the meter has no
// streams (a KindInUseError otherwise). It returns the declaration stored.
func DeclareMeter(ctx context.Context, tx Tx, m Meter, now time.Time) (Meter, error) {
	if err := m.Validate(); err != nil {
		return Meter{}, err
	}
	cur, err := MeterByName(ctx, tx, m.Meter)
	if err != nil {
		return Meter{}, err
	}
	if cur.Kind != m.Kind {
		// Every Apply holds this shared from before it reads kinds until it
		// commits: once held here, every stream of the meter is visible.
		if _, err := tx.Exec(ctx, qLockMeterKinds, locks.MeterKinds); err != nil {
			return Meter{}, fmt.Errorf("ledger: declare meter: %w", err)
		}
		var used bool
		if err := tx.QueryRow(ctx, qMeterHasStreams, m.Meter).Scan(&used); err != nil {
			return Meter{}, fmt.Errorf("ledger: declare meter: %w", err)
		}
		if used {
			return Meter{}, KindInUseError{Meter: m.Meter, Kind: cur.Kind, Proposed: m.Kind}
		}
	}
	now = now.UTC().Truncate(time.Microsecond)
	if _, err := tx.Exec(ctx, qUpsertMeter, pgx.StrictNamedArgs{"meter": m.Meter, "kind": string(m.Kind),
		"unit": m.Unit, "description": m.Description, "now": now}); err != nil {
		return Meter{}, fmt.Errorf("ledger: declare meter: %w", err)
	}
	return MeterByName(ctx, tx, m.Meter)
}

// MeterByName returns a meter's declaration; an undeclared meter is a
// counter with Declared false.
func MeterByName(ctx context.Context, db DBTX, meter string) (Meter, error) {
	rows, err := db.Query(ctx, qSelectMeter, meter)
	if err != nil {
		return Meter{}, fmt.Errorf("ledger: meter: %w", err)
	}
	ms, err := pgx.CollectRows(rows, scanMeter)
	if err != nil {
		return Meter{}, fmt.Errorf("ledger: meter: %w", err)
	}
	if len(ms) == 0 {
		return Meter{Meter: meter, Kind: Counter}, nil
	}
	return ms[0], nil
}

// Meters lists the declared meters by name.
func Meters(ctx context.Context, db DBTX) ([]Meter, error) {
	rows, err := db.Query(ctx, qSelectMeters)
	if err != nil {
		return nil, fmt.Errorf("ledger: meters: %w", err)
	}
	ms, err := pgx.CollectRows(rows, scanMeter)
	if err != nil {
		return nil, fmt.Errorf("ledger: meters: %w", err)
	}
	return ms, nil
}

// MeterKinds returns the kinds of the given meters (undeclared: Counter).
func MeterKinds(ctx context.Context, db DBTX, meters []string) (map[string]MeterKind, error) {
	out := make(map[string]MeterKind, len(meters))
	for _, m := range meters {
		out[m] = Counter
	}
	rows, err := db.Query(ctx, qSelectKinds, meters)
	if err != nil {
		return nil, fmt.Errorf("ledger: meter kinds: %w", err)
	}
	var name, kind string
	_, err = pgx.ForEachRow(rows, []any{&name, &kind}, func() error {
		out[name] = MeterKind(kind)
		return nil
	})
	if err != nil {
		return nil, fmt.Errorf("ledger: meter kinds: %w", err)
	}
	return out, nil
}

func scanMeter(row pgx.CollectableRow) (Meter, error) {
	var m Meter
	var kind string
	var created, updated time.Time
	if err := row.Scan(&m.Meter, &kind, &m.Unit, &m.Description, &created, &updated); err != nil {
		return m, err
	}
	m.Kind, m.Declared = MeterKind(kind), true
	created, updated = created.UTC(), updated.UTC()
	m.CreatedAt, m.UpdatedAt = &created, &updated
	return m, nil
}
