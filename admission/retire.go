package admission

import (
	"context"
	"errors"
	"fmt"

	"github.com/jackc/pgx/v5"
	"github.com/tally-ledger/tally/internal/pgnamed"
	"github.com/tally-ledger/tally/validation"
)

// MaxGenerationStep is how far above its stored highest generation a
// holder's next generation may be (a holder never issued a grant counts
// from 0). The SDK moves forward by one per restart, and a holder that
// lost its state moves to one above the stored highest; a bound keeps one
// request from fencing a holder for good (a generation of 2^63-1 would
// make every later one stale), and a million leaves room for any number
// of restarts that never took a grant.
const MaxGenerationStep = 1_000_000

// Retired is what RetireHolder did.
type Retired struct {
	Holder string `json:"holder"`
	// PreviousGeneration is the generation the holder had.
	PreviousGeneration int64 `json:"previous_generation"`
	// GrantsEnded counts the live grants ended, each counted as fully
	// spent.
	GrantsEnded int64 `json:"grants_ended"`
}

// RetireHolder ends every live grant of holder now, counted as fully
// spent (its processes may still be admitting with them, so nothing is
// handed back), and forgets its generation: the holder starts again from
// any generation within MaxGenerationStep. An operator's way out for a
// holder that is gone for good or was fenced by a wrong generation.
// ErrUnknownHolder when no grant was ever issued to holder.
func (s *Store) RetireHolder(ctx context.Context, holder string) (Retired, error) {
	if errs := checkHolder(holder, 1); len(errs) > 0 {
		return Retired{}, errors.Join(errs...)
	}
	out := Retired{Holder: holder}
	err := pgx.BeginFunc(ctx, s.db, func(tx pgx.Tx) error {
		args := pgnamed.Args{"holder": holder, "now": s.now()}
		if err := tx.QueryRow(ctx, qLockHolder, args).Scan(&out.PreviousGeneration); err != nil {
			if errors.Is(err, pgx.ErrNoRows) {
				return validation.NotFound(ErrUnknownHolder, "no grant was ever issued to holder %q", holder)
			}
			return err
		}
		tag, err := tx.Exec(ctx, qRetireGrants, args)
		if err != nil {
			return err
		}
		out.GrantsEnded = tag.RowsAffected()
		_, err = tx.Exec(ctx, qResetHolder, args)
		return err
	})
	if err != nil && !errors.Is(err, ErrUnknownHolder) {
		return Retired{}, fmt.Errorf("admission: retire %s: %w", holder, err)
	}
	return out, err
}
