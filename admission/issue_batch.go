package admission

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"slices"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/shopspring/decimal"

	"github.com/tally-ledger/tally/internal/locks"
	"github.com/tally-ledger/tally/internal/pgnamed"
	"github.com/tally-ledger/tally/periods"
	"github.com/tally-ledger/tally/quota"
)

// key of a budget row.
type budgetKey struct {
	scope string // customer:<id>, pool:<name> or global
	meter string
	start time.Time
}

type budgetRow struct {
	drawn    drawn
	customer string // for customer rows
	meter    string
	consumed decimal.Decimal
	limit    decimal.NullDecimal // the rule in force under the locks
	version  int64
	// rule: for customer rows, the version of the customer's rule in
	// force under the locks, whatever its admission (0: none).
	rule  int64
	taken decimal.Decimal
	// stale: a row not brought to the version in force (a pool or global
	// row whose meter the batch did not lock exclusively, a customer row
	// the batch did not expect to bring).
	stale bool
}

// issueBatch issues a batch of requests. It reads as the protocol:
//
//  1. plan every request (reads, no locks: which budgets it draws from);
//  2. lock in the fixed order, bring every budget to the version and
//     period in force, and read the state under the locks (one round trip:
//     meters, holders, customer rows, scope rows; then each row brought to
//     what its period consumed when its rule version changed; then their
//     consumed and the rules and memberships in force);
//  3. decide every request in arrival order against running totals, each
//     all or nothing;
//  4. write everything set-based (one round trip, with the commit when
//     ownTx);
//  5. answer: the refusals' retry_after.
//
// A request whose plan no longer matches the rules and memberships under
// the locks gets errReplan. The returned error fails the whole batch.
func (s *Store) issueBatch(ctx context.Context, db batcher, ownTx bool, batch []*call) (err error) {
	now := s.now()
	plans, left := planBatch(ctx, db, batch, now)
	if !left {
		return nil
	}
	st := s.collectBudgets(batch, plans, now)
	if ownTx {
		// BEGIN opens lockAndRead's round trip: no round trip of its own.
		st.begin = true
		// Holders already at the generations asked for are only read
		// under their locks, as a release reads them: shared, so a
		// gateway's issues and releases do not wait for each other.
		// Bringing a holder to a new generation takes its row exclusively.
		st.shareHolders = coveredHolders(&s.holderGens, batch)
		defer func() {
			if err != nil {
				_, _ = db.Exec(context.WithoutCancel(ctx), "ROLLBACK")
			}
		}()
	}
	if err := st.lockAndRead(ctx, db); err != nil {
		return err
	}
	if st.shareHolders {
		// The rows read say otherwise than this Store knew (another
		// process reset a holder): give the batch back to be run with
		// exclusive locks.
		var moved []string
		for _, c := range batch {
			if c.err == nil && c.req.Generation > st.holders[c.req.Holder] {
				moved = append(moved, c.req.Holder)
			}
		}
		if len(moved) > 0 {
			s.holderGens.forget(moved...)
			return errHolderMoved
		}
	}
	before := make([]error, len(batch))
	for i, c := range batch {
		before[i] = c.err
	}
	d := s.decide(st, batch, plans)
	if err := st.write(ctx, db, ownTx, d.writes); err != nil {
		retry := ownTx && holderCreated(err)
		for i, c := range batch {
			c.grant = Grant{}
			if retry {
				c.err = before[i] // decided again on the next attempt
			}
		}
		if retry {
			return errHolderMoved
		}
		return err
	}
	if ownTx {
		// Committed: these rows exist for good (budget rows are never deleted).
		version := func(k budgetKey) int64 { return budgetVersion(st.rows[k]) }
		s.known.add(st.custKeys, version)
		s.known.add(st.scopeKeys, version)
		var holders []string
		for h, g := range st.holders {
			if g > 0 { // 0: no row (a holder refused before its first grant)
				holders = append(holders, h)
			}
		}
		s.holderGens.add(holders, func(h string) int64 { return st.holders[h] })
		s.m.brought.WithLabelValues("customer").Add(float64(st.broughtCustomers))
		s.m.brought.WithLabelValues("scope").Add(float64(st.broughtScopes))
	}
	if len(d.refused) > 0 {
		s.retryAfter(ctx, db, now, d.refused, d.refusedAt, st.rows)
	}
	return nil
}

// planBatch gives every call of batch its plan: the one made before it
// queued while its customer's period still holds, else one made now (once
// per customer, meter and subset). A call that cannot be planned gets its
// error. It says whether any call is left to decide.
func planBatch(ctx context.Context, db batcher, batch []*call, now time.Time) ([]plan, bool) {
	plans := make([]plan, len(batch))
	planned := map[string]int{} // one plan per customer, meter and subset
	left := false
	for i, c := range batch {
		if c.plan != nil && c.plan.custPeriod.Contains(now) {
			plans[i], left = *c.plan, true
			continue
		}
		k := planKey(c.req)
		if j, ok := planned[k]; ok {
			plans[i], left = plans[j], true
			continue
		}
		if plans[i], c.err = planIssue(ctx, db, c.req, now); c.err == nil {
			planned[k], left = i, true
		}
	}
	return plans, left
}

// batchState is what one batch locks, reads and takes.
type batchState struct {
	now                 time.Time
	rows                map[budgetKey]*budgetRow
	custKeys, scopeKeys []budgetKey
	// newCust and newScope are the rows this Store has not seen committed:
	// the batch creates them if needed.
	newCust, newScope []budgetKey
	// holders is each holder's newest generation, read under its lock.
	holders map[string]int64
	// applicable is, per (customer, meter), the pool and global scopes
	// whose rule in force is exact, read under the locks.
	applicable map[[2]string][]string
	// bring are the scope rows the batch may bring to a new rule version:
	// those of the meters it locks exclusively; bringCust the customer rows
	// this Store has not seen at the planned version (every grant of a
	// customer locks its row, so those need no exclusive lock).
	bring, bringCust []budgetKey
	// rate is the batch's rate buckets (rate.go).
	rate *rateState
	// brought counts the rows brought to a new rule version, by kind.
	broughtCustomers, broughtScopes int64
	args                            pgnamed.Args
	// begin: the batch's transaction is its own, begun by lockAndRead.
	begin bool
	// shareHolders: lock the holders' rows shared (see issueBatch).
	shareHolders bool
}

// errHolderMoved: a batch that locked its holders shared found one that
// needs a new generation written, or a batch found the row of a holder it
// was to create (no row when it locked its holders) created meanwhile by
// another batch; it is run again with exclusive locks, up to
// maxHolderRetries times (each time a holder row now exists or a
// generation is now known, so it settles).
var errHolderMoved = errors.New("admission: a holder's generation moved; issuing again with its row locked exclusively")

const maxHolderRetries = 3

// holderCreated reports whether err is the unique violation of a holder
// row created by another batch after this one locked its holders: its
// INSERT then fails rather than locking a row out of the lock order (an
// upsert would wait for a batch that may be waiting for it).
func holderCreated(err error) bool { return keyTaken(err, "admission_holders_pkey") }

// keyTaken says whether err is a unique violation of constraint.
func keyTaken(err error, constraint string) bool {
	var pe *pgconn.PgError
	return errors.As(err, &pe) && pe.Code == uniqueViolation && pe.ConstraintName == constraint
}

// collectBudgets gathers the budget rows, holders and (customer, meter)
// pairs the planned calls of batch touch, and their statements' arguments.
func (s *Store) collectBudgets(batch []*call, plans []plan, now time.Time) *batchState {
	st := &batchState{now: now, rows: map[budgetKey]*budgetRow{}, holders: map[string]int64{},
		applicable: map[[2]string][]string{}}
	pairs := map[[2]string]bool{}
	for i, c := range batch {
		if c.err != nil {
			continue
		}
		pl := plans[i]
		st.holders[c.req.Holder] = 0
		pairs[[2]string{c.req.Customer, c.req.Meter}] = true
		ck := budgetKey{quota.CustomerScope(c.req.Customer), c.req.Meter, pl.custPeriod.Start.UTC()}
		if st.rows[ck] == nil {
			st.rows[ck] = &budgetRow{customer: c.req.Customer, meter: c.req.Meter,
				drawn: drawn{scope: ck.scope, period: pl.custPeriod, limit: pl.rule.Limit.Decimal, version: pl.rule.Version}}
			if !pl.customerExact {
				st.rows[ck].drawn.version = -1 // no exact rule: the row's limit stays NULL
			}
			st.custKeys = append(st.custKeys, ck)
		}
		for _, d := range pl.scopes {
			sk := budgetKey{d.scope, c.req.Meter, d.period.Start.UTC()}
			if st.rows[sk] == nil {
				st.rows[sk] = &budgetRow{meter: c.req.Meter, drawn: d}
				st.scopeKeys = append(st.scopeKeys, sk)
			}
		}
	}
	st.args = pgnamed.Args{"now": now, "holders": slices.Sorted(maps.Keys(st.holders))}
	addKeys(st.args, "c", true, st.custKeys, st.rows)
	addKeys(st.args, "s", false, st.scopeKeys, st.rows)
	st.newCust, st.newScope = s.known.unknown(st.custKeys), s.known.unknown(st.scopeKeys)
	addKeys(st.args, "ec", true, st.newCust, st.rows)
	addKeys(st.args, "es", false, st.newScope, st.rows)
	// A scope row this Store has not seen brought to the planned version
	// may need bringing: its meter is locked exclusively.
	exclusive := map[string]bool{}
	for _, k := range st.scopeKeys {
		if v, ok := s.known.get(k); !ok || v != st.rows[k].drawn.version {
			exclusive[k.meter] = true
		}
	}
	for _, k := range st.scopeKeys {
		if exclusive[k.meter] {
			st.bring = append(st.bring, k)
		}
	}
	addKeys(st.args, "b", false, st.bring, st.rows)
	for _, k := range st.custKeys {
		if v, ok := s.known.get(k); !ok || v != st.rows[k].drawn.version {
			st.bringCust = append(st.bringCust, k)
		}
	}
	addKeys(st.args, "bc", true, st.bringCust, st.rows)
	meters := map[string]bool{}
	for p := range pairs {
		meters[p[1]] = true
	}
	lm := slices.Sorted(maps.Keys(meters))
	lx := make([]bool, len(lm))
	for i, m := range lm {
		lx[i] = exclusive[m]
	}
	st.args["lm_meters"], st.args["lm_exclusive"], st.args["exact_scope_lock"] = lm, lx, locks.ExactScope
	var kc, km []string
	for p := range pairs {
		kc, km = append(kc, p[0]), append(km, p[1])
	}
	st.args["k_customers"], st.args["k_meters"] = kc, km
	st.collectRates(batch, plans)
	return st
}

// lockAndRead is the first round trip: it locks meters, holders, customer
// rows and scope rows in the fixed order (creating the rows not seen yet),
// brings the rows whose rule version changed to what their period already
// consumed, and reads, under the locks, the holders' generations, every
// row's consumed and rule in force, and the scopes that apply to each
// (customer, meter).
func (st *batchState) lockAndRead(ctx context.Context, db batcher) error {
	b := &pgx.Batch{}
	if st.begin {
		b.Queue("BEGIN")
		b.Queue(qGenericPlans)
	}
	b.Queue(qLockMeters, st.args)
	lockHolders := qLockHolders
	if st.shareHolders {
		lockHolders = qShareHolders
	}
	b.Queue(lockHolders, st.args).Query(func(r pgx.Rows) error {
		return scanAll(r, func() error {
			var h string
			var g int64
			if err := r.Scan(&h, &g); err != nil {
				return err
			}
			st.holders[h] = g
			return nil
		})
	})
	if len(st.newCust) > 0 {
		// A grant refers to its customer, which exists from now on (a
		// customer drawing only from a pool or the global budget may have
		// nothing else yet). Before the membership lock, as a pool's join
		// writes its members before taking that lock exclusively.
		fresh := make([]string, len(st.newCust))
		for i, k := range st.newCust {
			fresh[i] = st.rows[k].customer
		}
		periods.QueueCreateCustomers(b, slices.Compact(slices.Sorted(slices.Values(fresh))))
		st.args["membership_lock"] = locks.PoolMembership
		b.Queue(qLockNewCustomersShared, st.args)
		b.Queue(qEnsureCustomerBudgets, st.args)
	}
	if len(st.newScope) > 0 {
		b.Queue(qEnsureScopeBudgets, st.args)
	}
	// A batch drawing from no pool's or global budget (or from no
	// customer's) sends no statement for those rows: each costs a bind and
	// an execution on the server however few rows it finds.
	if len(st.custKeys) > 0 {
		b.Queue(qLockCustomerBudgets, st.args)
	}
	if len(st.scopeKeys) > 0 {
		b.Queue(qLockScopeBudgets, st.args)
	}
	// Bringing rows to a new rule version reads what their period
	// consumed (every live grant of a pool's or the global members): it
	// is planned for the tables as they are now, not with the plan the
	// connection made once, maybe while the ledger was new.
	bringing := st.begin && (len(st.bringCust) > 0 || len(st.bring) > 0)
	if bringing {
		b.Queue(qCustomPlans)
	}
	if len(st.bringCust) > 0 {
		b.Queue(qAdoptCustomerGrants, st.args)
		b.Queue(qBringCustomerBudgets, st.args).Exec(func(ct pgconn.CommandTag) error {
			st.broughtCustomers = ct.RowsAffected()
			return nil
		})
	}
	if len(st.bring) > 0 {
		b.Queue(qAdoptScopeGrants, st.args)
		b.Queue(qBringScopeBudgets, st.args).Exec(func(ct pgconn.CommandTag) error {
			st.broughtScopes = ct.RowsAffected()
			return nil
		})
	}
	if bringing {
		b.Queue(qGenericPlans)
	}
	if len(st.custKeys) > 0 {
		b.Queue(qCustomerState, st.args).Query(st.scanCustomerState)
	}
	if len(st.scopeKeys) > 0 {
		b.Queue(qScopeState, st.args).Query(st.scanScopeState)
	}
	b.Queue(qApplicableNow, st.args).Query(func(r pgx.Rows) error {
		return scanAll(r, func() error {
			var c, m, scope string
			if err := r.Scan(&c, &m, &scope); err != nil {
				return err
			}
			st.applicable[[2]string{c, m}] = append(st.applicable[[2]string{c, m}], scope)
			return nil
		})
	})
	// Rate buckets last: after every period budget row (the lock order).
	st.queueRates(b)
	if err := db.SendBatch(ctx, b).Close(); err != nil {
		return fmt.Errorf("admission: issue: %w", err)
	}
	return nil
}

func (st *batchState) scanCustomerState(r pgx.Rows) error {
	return scanAll(r, func() error {
		var k budgetKey
		var customer string
		var consumed decimal.Decimal
		var lim decimal.NullDecimal
		var admission *string
		var brought int64
		var version *int64
		if err := r.Scan(&customer, &k.meter, &k.start, numeric(&consumed), &brought, nullNumeric(&lim), &version, &admission); err != nil {
			return err
		}
		k.scope, k.start = quota.CustomerScope(customer), k.start.UTC()
		row := st.rows[k]
		if row == nil {
			return fmt.Errorf("unexpected budget %v", k)
		}
		if admission != nil && *admission == string(quota.Exact) {
			row.limit = lim
			row.version = *version
			row.stale = brought != *version
		}
		if version != nil {
			row.rule = *version
		}
		row.consumed = consumed
		return nil
	})
}

func (st *batchState) scanScopeState(r pgx.Rows) error {
	return scanAll(r, func() error {
		var k budgetKey
		var consumed decimal.Decimal
		var lim decimal.NullDecimal
		var brought int64
		var version *int64
		if err := r.Scan(&k.scope, &k.meter, &k.start, numeric(&consumed), &brought, nullNumeric(&lim), &version); err != nil {
			return err
		}
		k.start = k.start.UTC()
		row := st.rows[k]
		if row == nil {
			return fmt.Errorf("unexpected budget %v", k)
		}
		if lim.Valid {
			row.limit = lim
			row.version = *version
			row.stale = brought != *version
		}
		row.consumed = consumed
		return nil
	})
}

// decisions are what a batch decided.
type decisions struct {
	writes    *writes
	refused   []*call
	refusedAt []budgetKey // the binding budget of each refusal
}

// decide decides every call of batch in arrival order against the running
// totals of st, each all or nothing, and gives every issued grant the
// available its budgets have once the whole batch is taken.
func (s *Store) decide(st *batchState, batch []*call, plans []plan) decisions {
	stored := maps.Clone(st.holders)
	d := decisions{writes: newWrites()}
	var issued []*call
	var issuedKeys [][]budgetKey
	var issuedPlans []plan
	for i, c := range batch {
		if c.err != nil {
			continue
		}
		keys, bind := s.decideCall(st, c, plans[i])
		switch {
		case c.err == nil:
			d.writes.add(c.grant, keys, stored[c.req.Holder])
			d.writes.rate.add(c.grant, plans[i])
			issued, issuedKeys, issuedPlans = append(issued, c), append(issuedKeys, keys), append(issuedPlans, plans[i])
		case bind >= 0:
			d.refused, d.refusedAt = append(d.refused, c), append(d.refusedAt, keys[bind])
		}
	}
	for i, c := range issued {
		avail := st.available(issuedKeys[i])
		if r, bind := st.rateAvailable(issuedPlans[i], c.req.Meter); bind != "" && (len(issuedKeys[i]) == 0 || r.LessThan(avail)) {
			avail = r
		}
		c.grant.Available = decimal.NewNullDecimal(avail)
	}
	return d
}

// decideCall decides one call: fenced by its holder's generation, its plan
// checked against what the locks read, then issued (taken from st's
// running totals) or refused by the budget with the least available. It
// returns the keys the call draws from and, for a refusal by a budget, the
// index of the binding one (else -1); the outcome is in c.grant or c.err.
func (s *Store) decideCall(st *batchState, c *call, pl plan) ([]budgetKey, int) {
	req := c.req
	if cur := st.holders[req.Holder]; cur > req.Generation {
		c.err = staleGeneration(req.Holder, req.Generation, cur)
		return nil, -1
	} else if req.Generation-cur > MaxGenerationStep {
		c.err = &GenerationJumpError{Holder: req.Holder, Generation: req.Generation, Current: cur}
		return nil, -1
	}
	keys := drawnKeys(pl, req)
	cust := st.rows[budgetKey{quota.CustomerScope(req.Customer), req.Meter, pl.custPeriod.Start.UTC()}]
	if !pl.subset && cust.limit.Valid != pl.drawsCustomer {
		c.err = errReplan // the customer's rule became exact, or stopped being
		return nil, -1
	}
	if cust.rule != pl.rule.Version {
		// The grant carries the customer's rule (its version, on_unreachable
		// and local allowance), which a row not drawn (a rate contract) or
		// already brought to the new version (by another process) does not
		// show stale: a plan of another version decides none of them.
		c.err = errReplan
		return nil, -1
	}
	if !stillApplies(pl, keys, st.rows, st.applicable[[2]string{req.Customer, req.Meter}], st.now) || !st.ratesStillApply(pl, req) {
		c.err = errReplan
		return nil, -1
	}
	for _, k := range keys {
		if st.rows[k].stale {
			// Planned at another rule version than the one in force: the
			// next attempt locks the meter exclusively and brings the row.
			s.known.forget(k)
			c.err = errReplan
			return nil, -1
		}
	}
	avail, bind := decimal.Decimal{}, -1
	for j, k := range keys {
		r := st.rows[k]
		a := decimal.Max(decimal.Zero, r.limit.Decimal.Sub(r.consumed.Add(r.taken)))
		if bind < 0 || a.LessThan(avail) {
			avail, bind = a, j
		}
	}
	// A rate bucket binds when it holds fewer tokens than any period
	// budget has left (all or nothing with them: rate.go).
	rAvail, rBind := st.rateAvailable(pl, req.Meter)
	rateBinds := rBind != "" && (bind < 0 || rAvail.LessThan(avail))
	if rateBinds {
		avail = rAvail
	}
	amt := req.Amount
	if avail.LessThan(amt) {
		if !req.MinAmount.Valid || avail.LessThan(req.MinAmount.Decimal) {
			if rateBinds {
				need := amt
				if req.MinAmount.Valid {
					need = req.MinAmount.Decimal
				}
				st.refuseRate(rBind, req.Meter)
				c.err = st.rateRefusal(rBind, req.Meter, avail, need)
				return keys, -1
			}
			c.err = &BudgetExhaustedError{Binding: keys[bind].scope + "/" + req.Meter, Available: avail}
			return keys, bind
		}
		amt = avail
	}
	for _, k := range keys {
		st.rows[k].taken = st.rows[k].taken.Add(amt)
	}
	st.takeRates(pl, req.Meter, amt)
	st.holders[req.Holder] = req.Generation
	c.grant = s.newGrant(req, pl, amt, st.now)
	if !pl.drawsCustomer {
		c.grant.drawsCustomer = false
	}
	if len(pl.rates) > 0 {
		// A rate grant is short (rateTTL) and reclaimed
		// after the smallest max_skew of its rules and the deployment.
		c.grant.ValidUntil = minTime(c.grant.ValidUntil, st.now.Add(rateTTL(req)))
		c.grant.Rate = true
		c.grant.ReclaimAt = c.grant.ValidUntil.Add(st.rateSkew(pl, req.Meter, s.cfg.MaxSkew))
		c.grant.Budgets = append(c.grant.Budgets, pl.rates...)
		slices.Sort(c.grant.Budgets)
	}
	return keys, -1
}

// available is the smallest limit - (consumed + taken) over keys, never
// negative.
func (st *batchState) available(keys []budgetKey) decimal.Decimal {
	var left decimal.Decimal
	for j, k := range keys {
		r := st.rows[k]
		if a := decimal.Max(decimal.Zero, r.limit.Decimal.Sub(r.consumed.Add(r.taken))); j == 0 || a.LessThan(left) {
			left = a
		}
	}
	return left
}

// write is the second round trip: holders, budgets, grants and draws,
// set-based, and the commit when ownTx.
func (st *batchState) write(ctx context.Context, db batcher, ownTx bool, w *writes) error {
	wb := w.batch(st.now, st.rows, st.custKeys, st.scopeKeys)
	st.queueRateWrites(wb, &w.rate)
	if ownTx {
		wb.Queue("COMMIT")
	}
	if err := db.SendBatch(ctx, wb).Close(); err != nil {
		return fmt.Errorf("admission: issue: %w", err)
	}
	return nil
}
