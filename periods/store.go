package periods

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"time"

	"github.com/google/uuid"
	pgxdecimal "github.com/jackc/pgx-shopspring-decimal"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/shopspring/decimal"

	"github.com/tally-ledger/tally/internal/locks"
)

// The customer lock that orders applying usage against closing a period
// (internal/locks.Customer says who takes it and how).
const (
	CustomerLockSpace   = locks.Customer
	CustomerLockBuckets = locks.CustomerBuckets
)

// UnknownCustomerError: a customer with neither usage nor a calendar. It
// is ErrUnknownCustomer (errors.Is), and names the customer.
type UnknownCustomerError struct{ Customer string }

func (e *UnknownCustomerError) Error() string {
	return fmt.Sprintf("customer %q: %v", e.Customer, ErrUnknownCustomer)
}

func (e *UnknownCustomerError) Is(target error) bool { return target == ErrUnknownCustomer }

// Errors of the period store. The API maps them to HTTP statuses.
var (
	ErrUnknownCustomer = errors.New("unknown customer")
	ErrPeriodOpen      = errors.New("the period has not ended yet")
	ErrInGrace         = errors.New("the period's grace has not ended yet")
	ErrNotReconciled   = errors.New("the period has no clean reconciliation run")
	ErrInconsistent    = errors.New("rollups disagree with ledger entries")
)

// DBTX is what the store needs of a pool, a connection or a transaction.
type DBTX interface {
	Query(ctx context.Context, sql string, args ...any) (pgx.Rows, error)
	QueryRow(ctx context.Context, sql string, args ...any) pgx.Row
	Exec(ctx context.Context, sql string, args ...any) (pgconn.CommandTag, error)
}

// Line is one meter of a statement.
type Line struct {
	Meter string `json:"meter"`
	// Usage that occurred in the period (late fills moved in included).
	Usage decimal.Decimal `json:"usage"`
	// Usage of closed earlier periods that arrived late, and manual
	// adjustments dated in them, billed here.
	PriorPeriodAdjustments decimal.Decimal `json:"prior_period_adjustments"`
	// Manual credits (negative) and debits dated in this period.
	Adjustments decimal.Decimal `json:"adjustments"`
	// What to invoice: Usage + PriorPeriodAdjustments + Adjustments.
	Billed decimal.Decimal `json:"billed"`
}

// Absorbed is late usage of a closed period billed in this one: a
// counter's quantity (with the manual adjustments dated in that period),
// or the level-seconds a gauge's late reading changed in that period (the
// gauge line's PriorPeriodUnitSeconds, by period).
type Absorbed struct {
	Period time.Time       `json:"period_start"`
	Meter  string          `json:"meter"`
	Amount decimal.Decimal `json:"amount"`
}

// Statement is what a customer is billed for one period. Once the period
// is closed it is frozen: it is stored at close and never recomputed.
type Statement struct {
	Customer string     `json:"customer"`
	Period   string     `json:"period"`
	Start    time.Time  `json:"start"`
	End      time.Time  `json:"end"`
	State    State      `json:"state"`
	Final    bool       `json:"final"` // true once closed
	Lines    []Line     `json:"lines"`
	Absorbed []Absorbed `json:"prior_periods_absorbed"`
	// Gauges and Uniques: the period's gauges and unique meters
	// (docs/design.md §16), frozen with the rest at close.
	Gauges           []GaugeLine  `json:"gauges,omitempty"`
	Uniques          []UniqueLine `json:"uniques,omitempty"`
	ClosedAt         *time.Time   `json:"closed_at,omitempty"`
	Forced           bool         `json:"forced,omitempty"`
	Reason           string       `json:"reason,omitempty"`
	Actor            string       `json:"actor,omitempty"`
	ReconciliationID *uuid.UUID   `json:"reconciliation_id,omitempty"`
}

// Gate decides whether a period may be closed without force: it returns
// the id of a clean reconciliation run for (customer, period), or an error
// wrapping ErrNotReconciled. Package reconcile provides it.
type Gate func(ctx context.Context, tx pgx.Tx, customer string, p Period) (uuid.UUID, error)

// Store reads and closes periods in Postgres.
type Store struct {
	Grace time.Duration    // default DefaultGrace; NoGrace for none
	Clock func() time.Time // default time.Now
	Gate  Gate             // nil: only forced closes are possible
	// Kinds reads the gauges and unique meters of a statement (nil: none).
	Kinds KindLinesFunc
}

func (s Store) now() time.Time {
	if s.Clock != nil {
		return s.Clock().UTC()
	}
	return time.Now().UTC()
}

func (s Store) grace() time.Duration {
	if s.Grace == 0 {
		return DefaultGrace
	}
	return s.Grace
}

// Schedule loads a customer's calendar history.
func (s Store) Schedule(ctx context.Context, db DBTX, customer string) (Schedule, error) {
	return schedule(db.QueryRow(ctx, qSelectSchedule, customer), customer)
}

// QueueSchedule queues Schedule's read on b, for a caller that sends
// several reads in one round trip: done gets what Schedule would return,
// when b's results are read.
func (s Store) QueueSchedule(b *pgx.Batch, customer string, done func(Schedule, error)) {
	b.Queue(qSelectSchedule, customer).QueryRow(func(row pgx.Row) error {
		done(schedule(row, customer))
		return nil
	})
}

func schedule(row pgx.Row, customer string) (Schedule, error) {
	var raw []byte
	err := row.Scan(&raw)
	if errors.Is(err, pgx.ErrNoRows) {
		return nil, &UnknownCustomerError{Customer: customer}
	}
	if err != nil {
		return nil, fmt.Errorf("periods: load calendar: %w", err)
	}
	var sch Schedule
	if err := json.Unmarshal(raw, &sch); err != nil {
		return nil, fmt.Errorf("periods: customer %q: stored calendar: %w", customer, err)
	}
	return sch, nil
}

// CloseRequest asks to close one customer's period.
type CloseRequest struct {
	Customer string
	Period   string // "2026-11-01", "previous", ...
	Force    bool   // close without a clean reconciliation run
	Reason   string // required with Force
	Actor    string // who asked; required with Force
}

// Close closes the period and freezes its statement, inside tx. Closing a
// closed period returns its stored statement and changes nothing. Closing
// a period that has not ended is refused (ErrPeriodOpen); so is closing
// without a clean reconciliation, or before its grace has ended (ErrInGrace),
// unless forced with a reason.
func (s Store) Close(ctx context.Context, tx pgx.Tx, req CloseRequest) (Statement, error) {
	if req.Force && (req.Reason == "" || req.Actor == "") {
		return Statement{}, errors.New("a forced close needs a reason and an actor")
	}
	sch, err := s.Schedule(ctx, tx, req.Customer)
	if err != nil {
		return Statement{}, err
	}
	now := s.now()
	p, err := sch.Resolve(req.Period, now)
	if err != nil {
		return Statement{}, err
	}
	// Wait for in-flight Applies of this customer and keep new ones out
	// until this transaction ends: nothing lands in p behind our back.
	if _, err := tx.Exec(ctx, qLockCustomer, CustomerLockSpace, req.Customer, CustomerLockBuckets); err != nil {
		return Statement{}, fmt.Errorf("periods: lock customer: %w", err)
	}
	if st, ok, err := s.Frozen(ctx, tx, req.Customer, p); err != nil || ok {
		return st, err
	}
	if now.Before(p.End) {
		return Statement{}, fmt.Errorf("period %s of %q ends %s: %w", p.Name, req.Customer, p.End.UTC().Format(time.RFC3339), ErrPeriodOpen)
	}
	// Late usage still lands in a period in grace: a close now would leave
	// it out of the statement. Only a person who says why may close early.
	if ends := GraceEnds(p, s.grace()); !req.Force && now.Before(ends) {
		return Statement{}, fmt.Errorf("period %s of %q is in grace until %s: %w (force the close with a reason to close it now)",
			p.Name, req.Customer, ends.UTC().Format(time.RFC3339), ErrInGrace)
	}
	var runID *uuid.UUID
	if !req.Force {
		if s.Gate == nil {
			return Statement{}, fmt.Errorf("period %s of %q: %w (no reconciliation gate is configured: force the close with a reason)", p.Name, req.Customer, ErrNotReconciled)
		}
		id, err := s.Gate(ctx, tx, req.Customer, p)
		if err != nil {
			return Statement{}, err
		}
		runID = &id
	}
	st, mismatched, err := s.compute(ctx, tx, req.Customer, p)
	if err != nil {
		return Statement{}, err
	}
	if len(mismatched) > 0 && !req.Force {
		return Statement{}, fmt.Errorf("period %s of %q: %w: %v", p.Name, req.Customer, ErrInconsistent, mismatched)
	}
	closedAt := now.Truncate(time.Microsecond)
	st.State, st.Final, st.ClosedAt, st.ReconciliationID = Closed, true, &closedAt, runID
	if req.Force {
		st.Forced, st.Reason, st.Actor = true, req.Reason, req.Actor
	}
	raw, err := json.Marshal(st)
	if err != nil {
		return Statement{}, err
	}
	var reason, actor *string
	if req.Force {
		reason, actor = &req.Reason, &req.Actor
	}
	_, err = tx.Exec(ctx, qInsertClose, pgx.StrictNamedArgs{"customer": req.Customer, "period_start": p.Start, "period_end": p.End,
		"closed_at": closedAt, "statement": raw, "forced": req.Force, "reason": reason, "actor": actor, "reconciliation_id": runID})
	if err != nil {
		return Statement{}, fmt.Errorf("periods: close: %w", err)
	}
	return st, nil
}

// Statement returns the statement of a customer's period: the frozen one
// when it is closed, else a live one computed now (Final false).
func (s Store) Statement(ctx context.Context, db DBTX, customer, ref string) (Statement, error) {
	sch, err := s.Schedule(ctx, db, customer)
	if err != nil {
		return Statement{}, err
	}
	now := s.now()
	p, err := sch.Resolve(ref, now)
	if err != nil {
		return Statement{}, err
	}
	if st, ok, err := s.Frozen(ctx, db, customer, p); err != nil || ok {
		return st, err
	}
	// Read from rollups: a customer may ask in a loop, and the period's
	// records are many (a close computes from them and cross-checks).
	st, _, err := s.computeWith(ctx, db, customer, p, qLiveStatementLines)
	if err != nil {
		return Statement{}, err
	}
	st.State = StateOf(p, now, s.grace(), false)
	return st, nil
}

// Frozen returns the statement a close froze for customer's period p,
// and whether there is one.
func (s Store) Frozen(ctx context.Context, db DBTX, customer string, p Period) (Statement, bool, error) {
	var raw []byte
	err := db.QueryRow(ctx, qSelectStatement, customer, p.Start).Scan(&raw)
	if errors.Is(err, pgx.ErrNoRows) {
		return Statement{}, false, nil
	}
	if err != nil {
		return Statement{}, false, fmt.Errorf("periods: read close record: %w", err)
	}
	var st Statement
	if err := json.Unmarshal(raw, &st); err != nil {
		return Statement{}, false, fmt.Errorf("periods: stored statement: %w", err)
	}
	return st, true, nil
}

// compute builds a statement from the ledger's records and entries (the
// source of truth) and returns the meters whose rollups disagree.
func (s Store) compute(ctx context.Context, db DBTX, customer string, p Period) (st Statement, mismatched []string, err error) {
	return s.computeWith(ctx, db, customer, p, qStatementLines)
}

// computeWith is compute with the query of the lines: qStatementLines or
// qLiveStatementLines (same columns).
func (s Store) computeWith(ctx context.Context, db DBTX, customer string, p Period, lines string) (st Statement, mismatched []string, err error) {
	st = Statement{Customer: customer, Period: p.Name, Start: p.Start.UTC(), End: p.End.UTC(), Lines: []Line{}, Absorbed: []Absorbed{}}
	rows, err := db.Query(ctx, lines, customer, p.Start)
	if err != nil {
		return st, nil, fmt.Errorf("periods: statement: %w", err)
	}
	for rows.Next() {
		var l Line
		var rolled decimal.Decimal
		if err := rows.Scan(&l.Meter, numeric(&l.Usage), numeric(&l.PriorPeriodAdjustments), numeric(&l.Adjustments), numeric(&rolled)); err != nil {
			return st, nil, err
		}
		l.Billed = l.Usage.Add(l.PriorPeriodAdjustments).Add(l.Adjustments)
		if !l.Billed.Equal(rolled) {
			mismatched = append(mismatched, fmt.Sprintf("%s: entries %s, rollups %s", l.Meter, l.Billed, rolled))
		}
		st.Lines = append(st.Lines, l)
	}
	if err := rows.Err(); err != nil {
		return st, nil, fmt.Errorf("periods: statement: %w", err)
	}
	rows, err = db.Query(ctx, qStatementAbsorbed, customer, p.Start)
	if err != nil {
		return st, nil, fmt.Errorf("periods: statement: %w", err)
	}
	for rows.Next() {
		var a Absorbed
		if err := rows.Scan(&a.Period, &a.Meter, numeric(&a.Amount)); err != nil {
			return st, nil, err
		}
		st.Absorbed = append(st.Absorbed, a)
	}
	if err := rows.Err(); err != nil {
		return st, nil, fmt.Errorf("periods: statement: %w", err)
	}
	if s.Kinds != nil {
		kl, err := s.Kinds(ctx, db, customer, p, s.now())
		if err != nil {
			return st, nil, fmt.Errorf("periods: statement: %w", err)
		}
		st.Gauges, st.Uniques = kl.Gauges, kl.Uniques
	}
	return st, mismatched, nil
}

// Summary is one period in a customer's list of periods.
type Summary struct {
	Name  string    `json:"period"`
	Start time.Time `json:"start"`
	End   time.Time `json:"end"`
	State State     `json:"state"`
	// Billed is each counter meter's billed total, as the statement's
	// lines (never one sum: meters count different things). Gauges and
	// unique meters are on the statement.
	Billed map[string]decimal.Decimal `json:"billed"`
}

// List returns the customer's periods, newest first: every period with
// usage or a close record, and the current one. A gauge's level holds
// until its next reading, so every period from the first a gauge has a
// bucket in up to the current one has usage (level-seconds), with or
// without a reading of its own.
func (s Store) List(ctx context.Context, db DBTX, customer string) ([]Summary, error) {
	sch, err := s.Schedule(ctx, db, customer)
	if err != nil {
		return nil, err
	}
	now := s.now()
	rows, err := db.Query(ctx, qListPeriods, customer)
	if err != nil {
		return nil, fmt.Errorf("periods: list: %w", err)
	}
	found, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (listedPeriod, error) {
		var x listedPeriod
		var meters, totals []string
		if err := r.Scan(&x.start, &meters, &totals, &x.closed, &x.gauges, &x.held); err != nil {
			return x, err
		}
		x.billed = make(map[string]decimal.Decimal, len(meters))
		for i, m := range meters {
			d, err := decimal.NewFromString(totals[i])
			if err != nil {
				return x, err
			}
			x.billed[m] = d
		}
		return x, nil
	})
	if err != nil {
		return nil, fmt.Errorf("periods: list: %w", err)
	}
	cur, err := sch.PeriodAt(now)
	if err != nil {
		return nil, err
	}
	if found, err = heldByGauges(sch, found, cur); err != nil {
		return nil, err
	}
	out := []Summary{}
	// The current period goes where its start puts it: usage stamped up to
	// the ledger's clock skew ahead may already be in the next period.
	listed := false
	addCurrent := func() {
		out = append(out, Summary{Name: cur.Name, Start: cur.Start.UTC(), End: cur.End.UTC(), State: Open, Billed: map[string]decimal.Decimal{}})
		listed = true
	}
	for _, r := range found {
		if !listed && !r.start.After(cur.Start) {
			if r.start.Before(cur.Start) {
				addCurrent()
			}
			listed = true
		}
		p, err := sch.PeriodAt(r.start)
		if err != nil {
			return nil, err
		}
		out = append(out, Summary{Name: p.Name, Start: p.Start.UTC(), End: p.End.UTC(),
			State: StateOf(p, now, s.grace(), r.closed), Billed: r.billed})
	}
	if !listed {
		addCurrent()
	}
	return out, nil
}

// listedPeriod is a period qListPeriods found.
type listedPeriod struct {
	start  time.Time
	billed map[string]decimal.Decimal
	closed bool
	gauges []string // the gauges with a bucket in it
	held   []string // those whose level carried out of it is not 0
}

// heldByGauges adds to found (newest first) the periods before cur that
// found lacks and a gauge carries a level other than 0 into: a level
// carried through a period leaves no bucket of its own there, and is
// billed all the same. A level of 0 (a reading of 0, a final reading, an
// epoch's end: docs/design.md §16) bills nothing, and the periods it is
// carried through are not added. It returns found newest first.
func heldByGauges(sch Schedule, found []listedPeriod, cur Period) ([]listedPeriod, error) {
	first := -1
	byStart := make(map[int64]int, len(found))
	for i := range found {
		byStart[found[i].start.UnixMicro()] = i
		if len(found[i].gauges) > 0 {
			first = i
		}
	}
	if first < 0 {
		return found, nil
	}
	p, err := sch.PeriodAt(found[first].start)
	if err != nil {
		return nil, err
	}
	n := len(found)
	held := map[string]bool{} // the gauges carrying a level other than 0 out of the periods so far
	for p.Start.Before(cur.Start) {
		if i, ok := byStart[p.Start.UnixMicro()]; ok {
			for _, g := range found[i].gauges {
				delete(held, g)
			}
			for _, g := range found[i].held {
				held[g] = true
			}
		} else if len(held) > 0 {
			found = append(found, listedPeriod{start: p.Start.UTC(), billed: map[string]decimal.Decimal{}})
		}
		if p, err = sch.Next(p); err != nil {
			return nil, err
		}
	}
	if len(found) > n {
		slices.SortFunc(found, func(a, b listedPeriod) int { return b.start.Compare(a.start) })
	}
	return found, nil
}

// numeric scans a NUMERIC straight into d through the pgx adapter's type (a
// conversion of decimal.Decimal: no text round trip, whatever the pool's
// type map); NULL fails the scan.
func numeric(d *decimal.Decimal) *pgxdecimal.Decimal { return (*pgxdecimal.Decimal)(d) }
