package periods

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"time"

	"github.com/jackc/pgx/v5"
)

// ChangeNotice is how long before a period boundary a calendar change must
// be made to take effect at it; a change made later takes effect at the
// boundary after. The ledger books usage stamped up to this far ahead of
// its clock (ledger.MaxClockSkew, which must equal it), so usage of the
// next period may already be booked under the current calendar.
const ChangeNotice = 5 * time.Minute

// Customer is a customer's billing calendar as stored.
type Customer struct {
	ID        string
	CreatedAt time.Time
	Schedule  Schedule
}

// defaultSchedule is NewSchedule(DefaultCalendar()) as stored.
var defaultSchedule = func() []byte {
	raw, err := json.Marshal(NewSchedule(DefaultCalendar()))
	if err != nil {
		panic(err) // a fixed value: cannot happen
	}
	return raw
}()

// QueueCreateCustomers queues on b the creation of the customers among ids
// (sorted, without duplicates) that do not exist yet, with the default
// calendar from the beginning. A customer exists once anything refers to
// it: its first usage, a quota rule, a pool membership, a customer token or
// a grant each create it (RegisterCustomers), so every reader of a customer
// (its calendar, usage, quotas, a reconciliation) knows it from then on and
// shows zero usage until it is metered.
func QueueCreateCustomers(b *pgx.Batch, ids []string) {
	b.Queue(qInsertDefaultCustomers, ids, defaultSchedule)
}

// RegisterCustomers is QueueCreateCustomers in a statement of its own, for
// the writers that refer to customers (quota rules, pools, tokens): run it
// in the transaction that writes the reference, after the writer's own
// locks, so the customer exists exactly when the reference does. ids need
// not be sorted or distinct.
func RegisterCustomers(ctx context.Context, db DBTX, ids ...string) error {
	if len(ids) == 0 {
		return nil
	}
	ids = slices.Compact(slices.Sorted(slices.Values(ids)))
	if _, err := db.Exec(ctx, qInsertDefaultCustomers, ids, defaultSchedule); err != nil {
		return fmt.Errorf("periods: register customers: %w", err)
	}
	return nil
}

// Customer loads a customer's calendar history; ErrUnknownCustomer if the
// customer has neither usage nor a calendar set.
func (s Store) Customer(ctx context.Context, db DBTX, id string) (Customer, error) {
	return loadCustomer(ctx, db, id, qSelectCustomer)
}

func loadCustomer(ctx context.Context, db DBTX, id, query string) (Customer, error) {
	c := Customer{ID: id}
	var raw []byte
	err := db.QueryRow(ctx, query, id).Scan(&raw, &c.CreatedAt)
	if errors.Is(err, pgx.ErrNoRows) {
		return Customer{}, &UnknownCustomerError{Customer: id}
	}
	if err != nil {
		return Customer{}, fmt.Errorf("periods: customer %q: %w", id, err)
	}
	if err := json.Unmarshal(raw, &c.Schedule); err != nil {
		return Customer{}, fmt.Errorf("periods: customer %q: stored calendar: %w", id, err)
	}
	return c, nil
}

// SetCalendar sets a customer's billing calendar and returns the customer
// as stored, and whether this call created it.
//
// An unknown customer is created with cal from the beginning: nothing
// refers to it yet (usage, a quota rule, a pool, a token or a grant would
// have created it with the default calendar). For a known customer the change
// takes effect at the next period boundary at least ChangeNotice from now,
// replacing any change still pending; periods that have started never
// change, and setting the calendar in force only drops a pending change.
// Concurrent changes of one customer serialise on its row.
//
// An invalid calendar is refused with cal.Validate's error, before any
// database work.
func (s Store) SetCalendar(ctx context.Context, db Beginner, id string, cal Calendar) (c Customer, created bool, err error) {
	if err := cal.Validate(); err != nil {
		return Customer{}, false, err
	}
	now := s.now()
	err = pgx.BeginFunc(ctx, db, func(tx pgx.Tx) error {
		fresh := NewSchedule(cal)
		raw, err := json.Marshal(fresh)
		if err != nil {
			return err
		}
		c = Customer{ID: id, Schedule: fresh}
		err = tx.QueryRow(ctx, qInsertCustomer, id, raw, now).Scan(&c.CreatedAt)
		if err == nil {
			created = true
			return nil
		}
		if !errors.Is(err, pgx.ErrNoRows) {
			return fmt.Errorf("periods: create customer %q: %w", id, err)
		}
		if c, err = loadCustomer(ctx, tx, id, qSelectCustomerForUpdate); err != nil {
			return err
		}
		next, _, err := c.Schedule.Change(now.Add(ChangeNotice), cal)
		if err != nil {
			return fmt.Errorf("customer %q: %w", id, err)
		}
		if slices.Equal(c.Schedule, next) {
			return nil
		}
		c.Schedule = next
		if raw, err = json.Marshal(next); err != nil {
			return err
		}
		if _, err := tx.Exec(ctx, qUpdateSchedule, id, raw, now); err != nil {
			return fmt.Errorf("periods: customer %q: update calendar: %w", id, err)
		}
		return nil
	})
	if err != nil {
		return Customer{}, false, err
	}
	return c, created, nil
}

// Beginner is what SetCalendar needs of a pool, a connection or a
// transaction (in which it runs as a savepoint).
type Beginner interface {
	Begin(ctx context.Context) (pgx.Tx, error)
}
