package admission

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/shopspring/decimal"

	"github.com/tally-ledger/tally/internal/pgnamed"
	"github.com/tally-ledger/tally/internal/pguuid"
	"github.com/tally-ledger/tally/periods"
	"github.com/tally-ledger/tally/quota"
)

// scopeCalendar is the billing calendar of pool and global budgets: their
// usage and grants count in their own periods, whatever their members'.
var scopeCalendar = periods.NewSchedule(periods.DefaultCalendar())

// drawn is one budget a request draws from.
type drawn struct {
	scope   string
	period  periods.Period
	limit   decimal.Decimal
	version int64
}

// plan is what a request draws from, read before any lock is taken.
type plan struct {
	rule          quota.Rule // the customer's rule in force (zero when none)
	customerExact bool
	drawsCustomer bool
	custPeriod    periods.Period
	scopes        []drawn // sorted by scope: the lock order
	subset        bool
	// rates are the rate budgets drawn (docs/design.md §17), sorted;
	// allRates every one that applies.
	rates, allRates []string
}

// planIssue reads the customer's rule and period and the pool and global
// budgets that apply, and picks those req draws from. Nothing is locked:
// the issuing statement checks under the locks that the budgets drawn are
// still the ones that apply. The four reads go in one round trip: a plan
// is made on a request's way (its customer's first, or one past
// planMaxAge) and once a second in the background for every busy budget,
// and each read of its own waited in turn for a connection of the pool
// (docs/performance.md, "Where a grant request's time goes, as Tally
// measures it").
func planIssue(ctx context.Context, db batcher, req IssueRequest, now time.Time) (plan, error) {
	var (
		pl               plan
		rule             quota.Rule
		sch              periods.Schedule
		applicable       []drawn
		allRates         []string
		ruleErr, schErr  error
		scopeErr, ratErr error
	)
	scopePeriod, err := scopeCalendar.PeriodAt(now)
	if err != nil {
		return plan{}, err
	}
	args := pgnamed.Args{"customer": req.Customer, "meter": req.Meter, "now": now}
	b := &pgx.Batch{}
	quota.QueueRuleAt(b, req.Customer, req.Meter, now, func(r quota.Rule, err error) { rule, ruleErr = r, err })
	periods.Store{}.QueueSchedule(b, req.Customer, func(s periods.Schedule, err error) { sch, schErr = s, err })
	b.Queue(qApplicableScopes, args).Query(func(rows pgx.Rows) error {
		applicable, scopeErr = pgx.CollectRows(rows, func(row pgx.CollectableRow) (drawn, error) {
			d := drawn{period: scopePeriod}
			return d, row.Scan(&d.scope, numeric(&d.limit), &d.version)
		})
		return nil
	})
	b.Queue(qApplicableRates, args).Query(func(rows pgx.Rows) error {
		allRates, ratErr = pgx.CollectRows(rows, pgx.RowTo[string])
		return nil
	})
	if err := db.SendBatch(ctx, b).Close(); err != nil {
		return plan{}, fmt.Errorf("admission: plan: %w", err)
	}
	switch {
	case ruleErr == nil:
		// A rate rule is exact too, through its bucket (rate.go), not a
		// period budget.
		pl.rule, pl.customerExact = rule, rule.Admission == quota.Exact && rule.Limit.Valid
	case errors.Is(ruleErr, quota.ErrNotFound):
	default:
		return plan{}, ruleErr
	}
	if pl.custPeriod, err = periodIn(sch, schErr, now); err != nil {
		return plan{}, err
	}
	if scopeErr != nil {
		return plan{}, fmt.Errorf("admission: read budgets: %w", scopeErr)
	}
	if ratErr != nil {
		return plan{}, fmt.Errorf("admission: read rate budgets: %w", ratErr)
	}
	pl.rates, pl.allRates = ratesDrawn(req, allRates), allRates
	if len(req.Budgets) == 0 {
		pl.drawsCustomer, pl.scopes = pl.customerExact, applicable
		if !pl.drawsCustomer && len(pl.scopes) == 0 && len(pl.rates) == 0 {
			return plan{}, &NotExactError{Customer: req.Customer, Meter: req.Meter, Admission: string(rule.Admission)}
		}
		return pl, nil
	}
	pl.subset = true
	var errs []error
	for i, b := range req.Budgets {
		if slices.Contains(pl.rates, b) {
			continue
		}
		if b == quota.CustomerScope(req.Customer) {
			if !pl.customerExact {
				errs = append(errs, &FieldError{Field: fmt.Sprintf("budgets[%d]", i), Detail: fmt.Sprintf("%s has no exact rule for %s", b, req.Meter)})
			}
			pl.drawsCustomer = true
			continue
		}
		j := slices.IndexFunc(applicable, func(d drawn) bool { return d.scope == b })
		if j < 0 {
			errs = append(errs, &FieldError{Field: fmt.Sprintf("budgets[%d]", i), Detail: fmt.Sprintf("%s is not an exact budget of %s for %s", b, req.Customer, req.Meter)})
			continue
		}
		pl.scopes = append(pl.scopes, applicable[j])
	}
	slices.SortFunc(pl.scopes, func(a, b drawn) int { return strings.Compare(a.scope, b.scope) })
	if err := errors.Join(errs...); err != nil {
		return pl, err
	}
	if req.EveryBudget {
		return pl, omitted(pl, applicable, req)
	}
	return pl, nil
}

// omitted is an *OmittedBudgetError when pl leaves out a budget that
// applies to req's customer and meter, else nil.
func omitted(pl plan, applicable []drawn, req IssueRequest) error {
	var left []string
	if pl.customerExact && !pl.drawsCustomer {
		left = append(left, quota.CustomerScope(req.Customer))
	}
	for _, d := range applicable {
		if !slices.ContainsFunc(pl.scopes, func(s drawn) bool { return s.scope == d.scope }) {
			left = append(left, d.scope)
		}
	}
	for _, r := range pl.allRates {
		if !slices.Contains(pl.rates, r) {
			left = append(left, r)
		}
	}
	if len(left) == 0 {
		return nil
	}
	slices.Sort(left)
	return &OmittedBudgetError{Customer: req.Customer, Meter: req.Meter, Omitted: left}
}

// maxReplans bounds how often one request starts over because a rule or a
// membership changed between its plan and its locks.
const maxReplans = 3

var errReplan = errors.New("admission: budgets changed while issuing")

// IssueTx leases a grant inside tx: the grant exists once tx commits. A
// holder's first grant fails tx with a unique violation on
// admission_holders when another process created the holder's row after
// tx locked it (never a wait out of the lock order): run tx again.
func (s *Store) IssueTx(ctx context.Context, tx pgx.Tx, req IssueRequest) (Grant, error) {
	if err := req.Validate(); err != nil {
		return Grant{}, err
	}
	for range maxReplans {
		c := &call{req: req}
		if err := s.issueBatch(ctx, tx, false, []*call{c}); err != nil {
			return Grant{}, err
		}
		if !errors.Is(c.err, errReplan) {
			return c.grant, c.err
		}
	}
	return Grant{}, errKeptChanging(req)
}

func errKeptChanging(req IssueRequest) error {
	return fmt.Errorf("%w (%s/%s); try again", ErrKeptChanging, req.Customer, req.Meter)
}

// call is one request waiting in the combiner.
type call struct {
	req   IssueRequest
	plan  *plan // made by the caller before it queued; nil: the batch plans
	grant Grant
	err   error
	done  chan struct{}
	// lead is signalled (once, under the combiner's lock, with leading
	// set) when this queued call is to run the next batch.
	lead    chan struct{}
	leading bool
	// queued is when the request joined the combiner (zero: it did not).
	queued time.Time
	// rows names the budget rows the request locks (its customer's, its
	// pools' and global, its rate buckets), by scope and meter.
	rows []string
}

// rowsOf names the budget rows req locks under pl.
func rowsOf(req IssueRequest, pl plan) []string {
	rows := []string{quota.CustomerScope(req.Customer) + "\x00" + req.Meter}
	for _, d := range pl.scopes {
		rows = append(rows, d.scope+"\x00"+req.Meter)
	}
	for _, r := range pl.allRates {
		rows = append(rows, r+"\x00"+req.Meter)
	}
	return rows
}

// combiner lets concurrent Issue calls share transactions: a request that
// locks a row of a batch in flight (or arrives while issueLanes batches
// are in flight) queues; when a batch ends, the oldest queued caller free
// of the other batch's rows runs the next batch with everything queued
// that no other batch leads and that is free of them too, up to MaxBatch.
// One hot budget row is then locked once per batch, not once per request,
// and the issue rate is no longer one commit per grant, while requests on
// other rows do not wait for it. No goroutine of its own: callers take
// turns running batches. Batches in flight together lock rows in the
// order every path takes, as a debit's batch beside them always could.
type combiner struct {
	mu      sync.Mutex
	pending []*call
	running int // batches in flight (or about to be), at most issueLanes
	// locked counts, by row (call.rows), the batches in flight that lock it.
	locked map[string]int
}

// issueLanes is how many issue batches may be in flight at once. With one,
// a request arriving during a batch waited for it to end and then for its
// own: about two batches, where a counter pays one statement. With two, a
// request that locks no row of the batch in flight starts its own at once;
// one that does waits and shares the next batch, as before: two batches
// on one hot row would only queue on its lock, in smaller transactions
// (docs/performance.md, "Two lanes for batches that share no row").
const issueLanes = 2

// free reports whether c locks no row a batch in flight locks. Under mu.
func (cb *combiner) free(c *call) bool {
	for _, r := range c.rows {
		if cb.locked[r] > 0 {
			return false
		}
	}
	return true
}

// elect makes c the lead of the next batch: its rows count as locked from
// now, so a request arriving before that batch starts does not start
// another beside it on the same rows. Under mu.
func (cb *combiner) elect(c *call) {
	c.leading = true
	cb.lock([]*call{c}, 1)
	c.lead <- struct{}{}
}

// lock counts (n = 1) or uncounts (n = -1) the rows of batch. Under mu.
func (cb *combiner) lock(batch []*call, n int) {
	if cb.locked == nil {
		cb.locked = map[string]int{}
	}
	for _, c := range batch {
		for _, r := range c.rows {
			if cb.locked[r] += n; cb.locked[r] == 0 {
				delete(cb.locked, r)
			}
		}
	}
}

// Issue leases a grant in a transaction (shared with concurrent requests of
// this Store), answering only after it committed. It draws from every
// exact budget that applies to the customer and meter (or the subset req
// names), all or nothing.
func (s *Store) Issue(ctx context.Context, req IssueRequest) (Grant, error) {
	if err := req.Validate(); err != nil {
		return Grant{}, err
	}
	for range maxReplans {
		// Each caller plans on its own connection, concurrently; the batch
		// checks the plan under its locks.
		t := time.Now()
		pl, err := s.plans.get(ctx, s.db, req, s.now())
		if err != nil {
			return Grant{}, err
		}
		queued := time.Now()
		s.m.observe(pathOf(req), phasePlan, queued.Sub(t))
		c := &call{req: req, plan: &pl, done: make(chan struct{}), lead: make(chan struct{}, 1), rows: rowsOf(req, pl), queued: queued}
		s.comb.mu.Lock()
		s.comb.pending = append(s.comb.pending, c)
		if s.comb.running < issueLanes && s.comb.free(c) {
			s.comb.running++
			s.comb.elect(c)
		}
		s.comb.mu.Unlock()
		if err := s.await(ctx, c); err != nil {
			return Grant{}, err
		}
		if !errors.Is(c.err, errReplan) {
			return c.grant, c.err
		}
		s.plans.forget(req)
	}
	return Grant{}, errKeptChanging(req)
}

// planTTL is how long a plan is reused as it is. A plan is only a guess
// of which budgets apply: every batch (and every debit) checks it under
// its locks (rules in force, memberships, periods) and a request whose
// plan no longer holds is planned again, so reuse never decides anything.
// An older plan, up to planMaxAge, is still used while one refresh runs
// beside the request (planning is four reads: inline, every busy budget
// paid them once a second, in its tail latency); an older one still, or
// one of another period, is made again before the request goes on.
const (
	planTTL    = time.Second
	planMaxAge = 10 * time.Second
)

type cachedPlan struct {
	plan       plan
	at         time.Time
	refreshing bool
}

// maxPlans bounds the plans a Store keeps.
const maxPlans = 100_000

// planCache keeps recent plans per customer, meter and named subset. A
// plan past planMaxAge is never used again: those are dropped once every
// planMaxAge, so the cache holds the keys of the last twenty seconds or
// so, not every customer seen since the process started. When that is
// more than max, the plans in use are kept and a new one is not (its key
// plans inline until room is made): emptying the cache instead made every
// busy budget plan its next request inline, all at once.
type planCache struct {
	now   func() time.Time // the Store's clock
	max   int
	mu    sync.Mutex
	m     map[string]*cachedPlan
	swept time.Time // when plans past planMaxAge were last dropped
}

func planKey(req IssueRequest) string {
	return req.Customer + "\x00" + req.Meter + "\x00" + strings.Join(req.Budgets, ",")
}

func (c *planCache) get(ctx context.Context, db batcher, req IssueRequest, now time.Time) (plan, error) {
	k := planKey(req)
	c.mu.Lock()
	p, ok := c.m[k]
	if ok && !now.Before(p.at) && p.plan.custPeriod.Contains(now) {
		switch age := now.Sub(p.at); {
		case age < planTTL:
			c.mu.Unlock()
			return p.plan, nil
		case age < planMaxAge:
			if !p.refreshing {
				p.refreshing = true
				go c.refresh(db, req, k, p)
			}
			c.mu.Unlock()
			return p.plan, nil
		}
	}
	c.mu.Unlock()
	pl, err := planIssue(ctx, db, req, now)
	if err != nil {
		return plan{}, err
	}
	c.put(k, pl, now)
	return pl, nil
}

// refresh plans req again beside the requests that go on with old; a
// plan that cannot be made (the rule stopped being exact, the database
// failed) is forgotten, so the next request plans inline and gets the
// error.
func (c *planCache) refresh(db batcher, req IssueRequest, k string, old *cachedPlan) {
	ctx, cancel := context.WithTimeout(context.Background(), planMaxAge)
	defer cancel()
	now := c.now()
	pl, err := planIssue(ctx, db, req, now)
	if err != nil {
		c.mu.Lock()
		if c.m[k] == old {
			delete(c.m, k)
		}
		c.mu.Unlock()
		return
	}
	c.put(k, pl, now)
}

func (c *planCache) put(k string, pl plan, at time.Time) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.m == nil {
		c.m = map[string]*cachedPlan{}
	}
	// A full cache is swept sooner (once per planTTL) to make room; the
	// sweep is O(plans), so it is not done at every put.
	full := len(c.m) >= c.max
	if since := at.Sub(c.swept); since >= planMaxAge || since < 0 || full && since >= planTTL {
		for key, p := range c.m {
			if at.Sub(p.at) >= planMaxAge {
				delete(c.m, key)
			}
		}
		c.swept = at
	}
	if _, ok := c.m[k]; !ok && len(c.m) >= c.max {
		return
	}
	c.m[k] = &cachedPlan{plan: pl, at: at}
}

func (c *planCache) forget(req IssueRequest) {
	c.mu.Lock()
	delete(c.m, planKey(req))
	c.mu.Unlock()
}

// await waits for c's batch. When c is signalled to lead, it runs one
// batch (the oldest queued requests, c among them) and hands the lead to
// the oldest request still queued, so no caller leads for longer than one
// batch. A caller whose ctx ends while queued leaves the queue; one that
// was signalled to lead runs its batch first (others wait on it).
func (s *Store) await(ctx context.Context, c *call) error {
	for {
		select {
		case <-c.done:
			return nil
		case <-c.lead:
			s.runBatch(context.WithoutCancel(ctx), c)
		case <-ctx.Done():
			s.comb.mu.Lock()
			if c.leading {
				s.comb.mu.Unlock()
				select {
				case <-c.lead:
					s.runBatch(context.WithoutCancel(ctx), c)
				case <-c.done:
				}
				return ctx.Err()
			}
			if i := slices.Index(s.comb.pending, c); i >= 0 {
				s.comb.pending = slices.Delete(s.comb.pending, i, i+1)
			}
			s.comb.mu.Unlock()
			// When it was no longer queued it is in a batch that may still
			// issue it: a grant nobody holds is reclaimed at reclaim_at and
			// counts as spent.
			return ctx.Err()
		}
	}
}

// runBatch issues lead's request and the oldest queued ones that no other
// batch leads and that lock no row of the batch in flight beside it, up
// to MaxBatch, in one transaction. Then it passes the lead on to the
// oldest request still queued that leads none and is free of the other
// batch's rows; when there is none, that other batch passes it on when it
// ends (the last batch in flight passes it to any).
func (s *Store) runBatch(ctx context.Context, lead *call) {
	s.comb.mu.Lock()
	batch := []*call{lead}
	s.comb.lock(batch, -1) // counted since lead was elected: free to share below
	s.comb.pending = slices.DeleteFunc(s.comb.pending, func(c *call) bool {
		if c == lead {
			return true
		}
		if c.leading || len(batch) == s.cfg.MaxBatch || !s.comb.free(c) {
			return false
		}
		batch = append(batch, c)
		return true
	})
	s.comb.lock(batch, 1)
	s.comb.mu.Unlock()
	err := s.issueOwnTx(ctx, batch)
	for _, c := range batch {
		if err != nil {
			c.err = err
		}
		close(c.done)
	}
	s.comb.mu.Lock()
	s.comb.lock(batch, -1)
	if i := slices.IndexFunc(s.comb.pending, func(c *call) bool { return !c.leading && s.comb.free(c) }); i >= 0 {
		s.comb.elect(s.comb.pending[i])
	} else {
		s.comb.running--
	}
	s.comb.mu.Unlock()
}

func (s *Store) issueOwnTx(ctx context.Context, batch []*call) error {
	t := time.Now()
	conn, err := s.db.Acquire(ctx)
	if err != nil {
		return fmt.Errorf("admission: issue: %w", err)
	}
	defer conn.Release()
	start := time.Now()
	defer func() { s.m.observeBatch(batch, t, start, time.Now()) }()
	err = s.issueBatch(ctx, conn, true, batch)
	for range maxHolderRetries {
		if !errors.Is(err, errHolderMoved) {
			break
		}
		// Rolled back; the holders are forgotten, so this attempt locks
		// them exclusively, rows created meanwhile included.
		err = s.issueBatch(ctx, conn, true, batch)
	}
	d := time.Since(start)
	s.m.batchSize.Observe(float64(len(batch)))
	s.m.batchSecs.Observe(d.Seconds())
	s.cfg.Logger.Debug("grant batch", "requests", len(batch), "duration", d, "error", err)
	if err == nil {
		for _, c := range batch {
			if c.err == nil && !c.req.debit {
				s.m.issued.WithLabelValues(strconv.Itoa(len(c.grant.Budgets))).Inc()
			} else if ex, ok := c.err.(*BudgetExhaustedError); ok {
				s.m.refusedBy(ex.Binding)
			}
		}
	}
	return err
}

func scanAll(r pgx.Rows, f func() error) error {
	for r.Next() {
		if err := f(); err != nil {
			return err
		}
	}
	return r.Err()
}

func addKeys(args pgnamed.Args, p string, customers bool, keys []budgetKey, rows map[budgetKey]*budgetRow) {
	slices.SortFunc(keys, func(a, b budgetKey) int {
		return cmp.Or(strings.Compare(a.scope, b.scope), strings.Compare(a.meter, b.meter), a.start.Compare(b.start))
	})
	n := len(keys)
	ids, meters, starts, ends, names, limits, versions := make([]string, n), make([]string, n), make([]time.Time, n),
		make([]time.Time, n), make([]string, n), make([]*string, n), make([]int64, n)
	for i, k := range keys {
		r := rows[k]
		ids[i], meters[i], starts[i] = k.scope, k.meter, k.start
		if customers {
			ids[i] = r.customer
		}
		ends[i], names[i] = r.drawn.period.End.UTC(), r.drawn.period.Name
		if r.drawn.version >= 0 {
			v := r.drawn.limit.String()
			limits[i] = &v
			versions[i] = r.drawn.version
		}
	}
	first := p + "_scopes"
	if customers {
		first = p + "_customers"
	}
	args[first], args[p+"_meters"], args[p+"_starts"], args[p+"_ends"] = ids, meters, starts, ends
	args[p+"_names"], args[p+"_limits"], args[p+"_versions"] = names, limits, versions
}

// known is what a Store saw committed, or read under a row's lock, by key:
// a hint, which every batch that relies on it checks under its locks. Past
// maxKnown keys it drops half of them, in map order (random): a key
// dropped costs its row the slower path once more, and dropping them all
// made every busy budget pay it at once, each time the map refilled.
//
// Of budget rows (Store.known): the rule version each was brought to (-1
// when it was not brought to the version in force, or has no exact rule).
// Budget rows are never deleted, so a known row needs no insert before it
// is locked, and a pool or global row known at the planned version needs no
// bringing (its meter is locked shared).
//
// Of holders (Store.holderGens): the newest generation, so that an issue
// that brings its holder no new generation locks the row shared (see
// issueBatch).
const maxKnown = 100_000

type known[K comparable] struct {
	mu sync.Mutex
	m  map[K]int64
}

func (k *known[K]) get(key K) (int64, bool) {
	k.mu.Lock()
	defer k.mu.Unlock()
	v, ok := k.m[key]
	return v, ok
}

// unknown returns the keys not known.
func (k *known[K]) unknown(keys []K) []K {
	k.mu.Lock()
	defer k.mu.Unlock()
	var out []K
	for _, key := range keys {
		if _, ok := k.m[key]; !ok {
			out = append(out, key)
		}
	}
	return out
}

// add records each of keys at value(key).
func (k *known[K]) add(keys []K, value func(K) int64) {
	k.mu.Lock()
	defer k.mu.Unlock()
	if k.m == nil {
		k.m = map[K]int64{}
	}
	if len(k.m) >= maxKnown {
		for key := range k.m {
			if len(k.m) < maxKnown/2 {
				break
			}
			delete(k.m, key)
		}
	}
	for _, key := range keys {
		k.m[key] = value(key)
	}
}

func (k *known[K]) forget(keys ...K) {
	k.mu.Lock()
	defer k.mu.Unlock()
	for _, key := range keys {
		delete(k.m, key)
	}
}

// budgetVersion is what Store.known records of a committed budget row:
// -1 matches the plan of a customer without an exact rule (its row only
// carries the period), and never a version in force.
func budgetVersion(r *budgetRow) int64 {
	if r.stale || !r.limit.Valid {
		return -1
	}
	return r.version
}

// coveredHolders reports whether every call of batch still to decide names
// a holder known at the call's generation or a newer one.
func coveredHolders(k *known[string], batch []*call) bool {
	for _, c := range batch {
		if c.err != nil {
			continue
		}
		if g, ok := k.get(c.req.Holder); !ok || c.req.Generation > g {
			return false
		}
	}
	return true
}

// drawnKeys are the budget rows a request draws from, in lock order.
func drawnKeys(pl plan, req IssueRequest) []budgetKey {
	var keys []budgetKey
	if pl.drawsCustomer {
		keys = append(keys, budgetKey{quota.CustomerScope(req.Customer), req.Meter, pl.custPeriod.Start.UTC()})
	}
	for _, d := range pl.scopes {
		keys = append(keys, budgetKey{d.scope, req.Meter, d.period.Start.UTC()})
	}
	return keys
}

// stillApplies says whether the plan made without locks still holds under
// them: every budget drawn still has an exact rule, and (unless the request
// named a subset) no pool or global budget started to apply.
func stillApplies(pl plan, keys []budgetKey, rows map[budgetKey]*budgetRow, applicable []string, now time.Time) bool {
	for _, k := range keys {
		if !rows[k].limit.Valid {
			return false
		}
	}
	for _, d := range pl.scopes {
		if !slices.Contains(applicable, d.scope) {
			return false
		}
	}
	for _, k := range keys {
		if !rows[k].drawn.period.Contains(now) {
			return false // planned in the previous period
		}
	}
	return pl.subset || len(applicable) == len(pl.scopes)
}

func (s *Store) newGrant(req IssueRequest, pl plan, amt decimal.Decimal, now time.Time) Grant {
	ttl := req.TTL
	if ttl == 0 {
		ttl = DefaultTTL
	}
	end := pl.custPeriod.End.UTC()
	for _, d := range pl.scopes {
		end = minTime(end, d.period.End.UTC())
	}
	validUntil := minTime(now.Add(ttl), end)
	id := req.id
	if id == uuid.Nil {
		id = uuid.New()
	}
	g := Grant{
		ID: id, Customer: req.Customer, Meter: req.Meter, Period: pl.custPeriod.Name,
		PeriodStart: pl.custPeriod.Start.UTC(), PeriodEnd: pl.custPeriod.End.UTC(), RuleVersion: pl.rule.Version,
		Holder: req.Holder, Generation: req.Generation, Amount: amt, Spent: decimal.Zero,
		IssuedAt: now, ValidUntil: validUntil, ReclaimAt: validUntil.Add(s.cfg.MaxSkew), State: "live",
		OnUnreachable: string(quota.UnreachableDeny), drawsCustomer: pl.drawsCustomer, debit: req.debit,
	}
	if pl.rule.Admission == quota.Exact {
		g.OnUnreachable, g.LocalAmount = string(pl.rule.OnUnreachable), pl.rule.LocalAmount
		g.LocalEvery = pl.rule.LocalEvery
	}
	if pl.drawsCustomer {
		g.Budgets = append(g.Budgets, quota.CustomerScope(req.Customer))
	}
	for _, d := range pl.scopes {
		g.Budgets = append(g.Budgets, d.scope)
	}
	return g
}

// writes collects a batch's grants as columns.
type writes struct {
	// nHolders: holders without a row when the batch locked its holders
	// (their first grant); hHolders: holders whose locked row gets a newer
	// generation.
	nHolders, hHolders                      []string
	nGens, hGens                            []int64
	gIDs                                    []uuid.UUID
	gCustomers, gMeters, gHolders, gAmounts []string
	gStarts, gValid, gReclaim               []time.Time
	gVersions, gGens                        []int64
	gDraws, gDebits                         []bool
	rate                                    rateDraws
	dIDs                                    []uuid.UUID
	dScopes, dMeters                        []string
	dStarts                                 []time.Time
}

func newWrites() *writes { return &writes{} }

// add adds g, drawn from keys; stored is g's holder's generation as the
// batch read it under its locks (0: the holder had no row).
func (w *writes) add(g Grant, keys []budgetKey, stored int64) {
	switch {
	case stored == 0:
		w.nHolders, w.nGens = append(w.nHolders, g.Holder), append(w.nGens, g.Generation)
	case g.Generation > stored:
		w.hHolders, w.hGens = append(w.hHolders, g.Holder), append(w.hGens, g.Generation)
	}
	w.gIDs, w.gCustomers, w.gMeters = append(w.gIDs, g.ID), append(w.gCustomers, g.Customer), append(w.gMeters, g.Meter)
	w.gHolders, w.gAmounts = append(w.gHolders, g.Holder), append(w.gAmounts, g.Amount.String())
	w.gStarts, w.gValid, w.gReclaim = append(w.gStarts, g.PeriodStart), append(w.gValid, g.ValidUntil), append(w.gReclaim, g.ReclaimAt)
	w.gVersions, w.gGens, w.gDraws = append(w.gVersions, g.RuleVersion), append(w.gGens, g.Generation), append(w.gDraws, g.drawsCustomer)
	w.gDebits = append(w.gDebits, g.debit)
	for _, k := range keys {
		if strings.HasPrefix(k.scope, "customer:") {
			continue
		}
		w.dIDs, w.dScopes, w.dMeters, w.dStarts = append(w.dIDs, g.ID), append(w.dScopes, k.scope), append(w.dMeters, k.meter), append(w.dStarts, k.start)
	}
}

// batch is the write round trip: holders, budgets (in lock order: their
// locks are already held), grants, draws.
func (w *writes) batch(now time.Time, rows map[budgetKey]*budgetRow, custKeys, scopeKeys []budgetKey) *pgx.Batch {
	b := &pgx.Batch{}
	if len(w.gIDs) == 0 {
		return b
	}
	if len(w.nHolders) > 0 {
		b.Queue(qInsertHolders, pgnamed.Args{"now": now, "h_holders": w.nHolders, "h_generations": w.nGens})
	}
	if len(w.hHolders) > 0 {
		b.Queue(qRaiseHolderGenerations, pgnamed.Args{"now": now, "h_holders": w.hHolders, "h_generations": w.hGens})
	}
	if len(custKeys) > 0 {
		b.Queue(qTakeCustomerBudgets, takeArgs(now, "u_customers", custKeys, rows))
	}
	if len(scopeKeys) > 0 {
		b.Queue(qTakeScopeBudgets, takeArgs(now, "u_scopes", scopeKeys, rows))
	}
	b.Queue(qInsertGrants, pgnamed.Args{"now": now, "g_ids": pguuid.Slice(w.gIDs), "g_customers": w.gCustomers, "g_meters": w.gMeters,
		"g_starts": w.gStarts, "g_versions": w.gVersions, "g_holders": w.gHolders, "g_generations": w.gGens,
		"g_amounts": w.gAmounts, "g_valid_until": w.gValid, "g_reclaim_at": w.gReclaim, "g_draws_customer": w.gDraws,
		"g_debits": w.gDebits})
	if len(w.dIDs) > 0 {
		b.Queue(qInsertDraws, pgnamed.Args{"d_ids": pguuid.Slice(w.dIDs), "d_scopes": w.dScopes, "d_meters": w.dMeters, "d_starts": w.dStarts})
	}
	return b
}

// takeArgs are the deltas of the rows of keys that a batch took from, as
// columns; first names the column of ids (customers or scopes).
func takeArgs(now time.Time, first string, keys []budgetKey, rows map[budgetKey]*budgetRow) pgnamed.Args {
	var ids, meters, deltas, limits []string
	var starts []time.Time
	var versions []int64
	for _, k := range keys {
		r := rows[k]
		if r.taken.IsZero() {
			continue
		}
		id := k.scope
		if r.customer != "" {
			id = r.customer
		}
		ids, meters, starts, deltas = append(ids, id), append(meters, k.meter), append(starts, k.start), append(deltas, r.taken.String())
		limits, versions = append(limits, r.limit.Decimal.String()), append(versions, r.version)
	}
	return pgnamed.Args{"now": now, first: ids, "u_meters": meters, "u_starts": starts,
		"u_deltas": deltas, "u_limits": limits, "u_versions": versions}
}

// retryAfter fills the refusals' retry_after (when the binding budget's
// earliest live grant is reclaimed at the latest, or its period's end) and
// held (what other holders' live grants on it still hold).
func (s *Store) retryAfter(ctx context.Context, db DBTX, now time.Time, refused []*call, at []budgetKey, rows map[budgetKey]*budgetRow) {
	n := len(at)
	scopes, meters, starts, holders := make([]string, n), make([]string, n), make([]time.Time, n), make([]string, n)
	for i, k := range at {
		scopes[i], meters[i], starts[i], holders[i] = k.scope, k.meter, k.start, refused[i].req.Holder
	}
	earliest := make([]*time.Time, n)
	held := make([]decimal.Decimal, n)
	r, err := db.Query(ctx, qEarliestReclaims, pgnamed.Args{"now": now, "r_scopes": scopes, "r_meters": meters, "r_starts": starts,
		"r_holders": holders})
	if err == nil {
		err = scanAll(r, func() error {
			var i int
			var t *time.Time
			var h decimal.Decimal
			if err := r.Scan(&i, &t, numeric(&h)); err != nil {
				return err
			}
			earliest[i-1], held[i-1] = t, h
			return nil
		})
	}
	if err != nil {
		s.cfg.Logger.Warn("retry_after of refused grants", "error", err)
	}
	for i, c := range refused {
		end := rows[at[i]].drawn.period.End.UTC()
		if earliest[i] != nil {
			end = *earliest[i]
		}
		// A grant of this batch is reclaimed after any stored one.
		if ex, ok := c.err.(*BudgetExhaustedError); ok {
			ex.RetryAfter = max(end.Sub(now), 0)
			ex.Held = held[i]
		}
	}
}

func minTime(a, b time.Time) time.Time {
	if b.Before(a) {
		return b
	}
	return a
}

// batcher is a connection or a transaction: what sends a batch.
type batcher interface {
	DBTX
	SendBatch(ctx context.Context, b *pgx.Batch) pgx.BatchResults
}

// ScopePeriod is the period of pool and global budgets at t.
func ScopePeriod(t time.Time) (periods.Period, error) { return scopeCalendar.PeriodAt(t) }
