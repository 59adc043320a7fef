package admission

import (
	"context"
	"fmt"

	"github.com/jackc/pgx/v5"

	"github.com/tally-ledger/tally/internal/locks"
	"github.com/tally-ledger/tally/internal/pgnamed"
	"github.com/tally-ledger/tally/pools"
	"github.com/tally-ledger/tally/quota"
)

// PutPool sets a pool's members from in.EffectiveAt (pools.PutTx) and, in
// the same transaction, applies the membership rule of docs/design.md §13:
// a customer that joins brings what it consumed in the pool's period into
// the count of each of the pool's budgets of the current period, so
// joining never hands out a fresh allowance. A customer that leaves takes
// nothing back: what it consumed while a member stays counted, and when it
// rejoins in the same period it is counted once.
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
		args := pgnamed.Args{"customers": ch.Joined, "scope": quota.PoolScope(in.Name), "now": now,
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
		if _, err := tx.Exec(ctx, qAdoptPoolGrants, args); err != nil {
			return fmt.Errorf("admission: adopt members' grants: %w", err)
		}
		if _, err := tx.Exec(ctx, qRecountPool, args); err != nil {
			return fmt.Errorf("admission: bring members' consumption in: %w", err)
		}
		return nil
	})
	return ch, err
}

// ScopeBudget is one pool or global budget of a period.
type ScopeBudget struct {
	Scope string `json:"scope"`
	BudgetState
}

// ScopeBudgets lists the budgets of a scope ("pool:<name>" or "global"),
// newest period first, by meter; as Budgets, with the budget of an exact
// rule in force that no grant has created yet this period.
func (s *Store) ScopeBudgets(ctx context.Context, scope string) ([]ScopeBudget, error) {
	now := s.now()
	p, err := ScopePeriod(now)
	if err != nil {
		return nil, fmt.Errorf("admission: list budgets: %w", err)
	}
	rows, err := s.db.Query(ctx, qScopeBudgets, pgnamed.Args{"scope": scope, "now": now,
		"period": p.Name, "lo": p.Start.UTC(), "hi": p.End.UTC()})
	if err != nil {
		return nil, fmt.Errorf("admission: list budgets: %w", err)
	}
	out, err := pgx.CollectRows(rows, func(row pgx.CollectableRow) (ScopeBudget, error) {
		var b ScopeBudget
		err := b.scan(row, &b.Scope)
		return b, err
	})
	if err != nil {
		return nil, fmt.Errorf("admission: list budgets: %w", err)
	}
	return out, nil
}
