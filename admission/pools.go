package admission

import (
	"context"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/shopspring/decimal"

	"github.com/tally-ledger/tally/internal/locks"
	"github.com/tally-ledger/tally/pools"
	"github.com/tally-ledger/tally/quota"
)

// PutPool sets a pool's members from in.EffectiveAt (pools.PutTx) and, in
// the same transaction, applies the membership rule of docs/design.md §13:
// a customer that joins brings what it consumed this period into the
// count of each of the pool's budgets of the current period, so joining
// never hands out a fresh allowance. A customer that leaves takes nothing
// back: what it consumed while a member stays counted.
func (s *Store) PutPool(ctx context.Context, in pools.PutInput) (pools.Change, error) {
	var ch pools.Change
	err := pgx.BeginFunc(ctx, s.db, func(tx pgx.Tx) error {
		now := s.now()
		var err error
		if ch, err = pools.PutTx(ctx, tx, in, now); err != nil {
			return err
		}
		if len(ch.Joined) == 0 {
			return nil
		}
		// Locks in the issuing order: the joining customers' budget rows
		// (sorted), then the pool's. A grant issued to a joining customer
		// before these locks is counted below; one issued after sees the
		// new membership and draws from the pool itself.
		args := pgx.NamedArgs{"customers": ch.Joined, "scope": quota.PoolScope(in.Name), "now": now,
			"membership_lock": locks.PoolMembership}
		// A joining customer's first grant of the period may be in flight
		// with a budget row the locks below cannot see: wait for it.
		if _, err := tx.Exec(ctx, qLockJoiningCustomers, args); err != nil {
			return fmt.Errorf("admission: lock joining customers: %w", err)
		}
		if _, err := tx.Exec(ctx, qLockCustomersBudgets, args); err != nil {
			return fmt.Errorf("admission: lock members' budgets: %w", err)
		}
		if _, err := tx.Exec(ctx, qLockScopeBudgetsOf, args); err != nil {
			return fmt.Errorf("admission: lock pool budgets: %w", err)
		}
		if _, err := tx.Exec(ctx, qBringIn, args); err != nil {
			return fmt.Errorf("admission: bring members' consumption in: %w", err)
		}
		return nil
	})
	return ch, err
}

// ScopeBudget is one pool or global budget of a period.
type ScopeBudget struct {
	Scope       string          `json:"scope"`
	Meter       string          `json:"meter"`
	Period      string          `json:"period"`
	PeriodStart time.Time       `json:"period_start"`
	PeriodEnd   time.Time       `json:"period_end"`
	Limit       decimal.Decimal `json:"limit"`
	RuleVersion int64           `json:"rule_version"`
	// Consumed = Σ amount of grants drawn not released + Σ spent of those
	// released + what members brought in when they joined or when the
	// budget was created.
	Consumed  decimal.Decimal `json:"consumed"`
	Available decimal.Decimal `json:"available"`
	// Live is Σ amount of live grants drawn from it.
	Live decimal.Decimal `json:"live"`
	// Stranded is Σ amount - spent of ended grants drawn from it.
	Stranded decimal.Decimal `json:"stranded"`
}

// ScopeBudgets lists the budgets of a scope ("pool:<name>" or "global"),
// newest period first.
func (s *Store) ScopeBudgets(ctx context.Context, scope string) ([]ScopeBudget, error) {
	rows, err := s.db.Query(ctx, qScopeBudgets, pgx.NamedArgs{"scope": scope, "now": s.now()})
	if err != nil {
		return nil, fmt.Errorf("admission: list budgets: %w", err)
	}
	out, err := pgx.CollectRows(rows, func(row pgx.CollectableRow) (ScopeBudget, error) {
		var b ScopeBudget
		if err := row.Scan(&b.Scope, &b.Meter, &b.Period, &b.PeriodStart, &b.PeriodEnd, numeric(&b.Limit), &b.RuleVersion,
			numeric(&b.Consumed), numeric(&b.Live), numeric(&b.Stranded)); err != nil {
			return ScopeBudget{}, err
		}
		b.Available = decimal.Max(decimal.Zero, b.Limit.Sub(b.Consumed))
		b.PeriodStart, b.PeriodEnd = b.PeriodStart.UTC(), b.PeriodEnd.UTC()
		return b, nil
	})
	if err != nil {
		return nil, fmt.Errorf("admission: list budgets: %w", err)
	}
	return out, nil
}
