package admission

import (
	"context"
	"fmt"
	"maps"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/shopspring/decimal"

	"github.com/tally-ledger/tally/internal/pgnamed"
	"github.com/tally-ledger/tally/internal/pguuid"
)

// Renews and releases share transactions the way issues do
// (docs/design.md §13): concurrent reports of one Store queue, and the
// oldest caller runs the queued ones as one batch on one connection, in
// two round trips:
//
//  1. begin, and lock in the fixed order (holder rows shared, sorted; the
//     customer budget rows and then the pool and global rows that the
//     batch's releases free, sorted; then the grants, sorted) while reading
//     the holders' generations and the grants;
//  2. decide every report in arrival order, each fenced on its own by its
//     holder's generation and its grant's holder, generation, state and
//     spent (a report on a grant an earlier report of the batch ended sees
//     it ended); write every grant's final state, free every budget's
//     summed amount - spent, and commit.
//
// Every caller is answered after the commit. A budget row is locked and
// written once per batch, not once per release: on a hot pool or global
// row the releases of a batch cost one lock wait, not one each. A release
// of a grant reclaimed without a final report (a late report) takes the
// single path after the batch; a batch the database fails is tried again
// report by report, so one report's failure never answers another.

// report is one queued renew or release.
type report struct {
	r       Report
	release bool
	g       Grant
	err     error
	single  bool // decided by the single path after the batch (a late report)
	turn
}

// turn is a queued call's place in a combiner: done when answered, lead
// when it is to run the next batch.
type turn struct {
	done, lead chan struct{}
	leading    bool
}

func newTurn() turn { return turn{done: make(chan struct{}), lead: make(chan struct{}, 1)} }

// reportCombiner queues reports for batches.
type reportCombiner struct {
	mu      sync.Mutex
	pending []*report
	running bool
}

// ReleaseAll releases several grants (a holder giving back what it held),
// in one transaction when they fit in one batch: each report is fenced by
// its own holder and generation and decided all or nothing on its own, as
// Release decides it; one refused does not refuse the others. The answers
// are in the reports' order, given after the commit.
func (s *Store) ReleaseAll(ctx context.Context, rs []Report) ([]Grant, []error) {
	gs, errs := make([]Grant, len(rs)), make([]error, len(rs))
	var calls []*report
	var at []int
	for i, r := range rs {
		r.TTL = 0
		if errs[i] = r.Validate(); errs[i] == nil {
			calls, at = append(calls, &report{r: r, release: true}), append(at, i)
		}
	}
	for k, g := range s.submitAll(ctx, calls) {
		gs[at[k]], errs[at[k]] = g, calls[k].err
	}
	return gs, errs
}

// submit queues c and waits for its answer, running batches when it leads.
func (s *Store) submit(ctx context.Context, c *report) (Grant, error) {
	s.submitAll(ctx, []*report{c})
	return c.g, c.err
}

// submitAll queues calls together (so they share a batch when they fit)
// and waits for every answer, running batches when one of them leads.
func (s *Store) submitAll(ctx context.Context, calls []*report) []Grant {
	rc := &s.reports
	rc.mu.Lock()
	for _, c := range calls {
		c.turn = newTurn()
		rc.pending = append(rc.pending, c)
	}
	if !rc.running && len(calls) > 0 {
		rc.running, calls[0].leading = true, true
		calls[0].lead <- struct{}{}
	}
	rc.mu.Unlock()
	out := make([]Grant, len(calls))
	for i, c := range calls {
		// In queue order: a later call cannot be handed the lead while an
		// earlier one still waits in the queue or in a running batch.
		out[i], c.err = s.wait(ctx, c)
	}
	return out
}

// wait waits for c's answer, running a batch when c is handed the lead.
func (s *Store) wait(ctx context.Context, c *report) (Grant, error) {
	rc := &s.reports
	for {
		select {
		case <-c.done:
			return c.g, c.err
		case <-c.lead:
			s.runReports(context.WithoutCancel(ctx))
		case <-ctx.Done():
			rc.mu.Lock()
			if c.leading {
				rc.mu.Unlock()
				select {
				case <-c.lead:
					s.runReports(context.WithoutCancel(ctx))
				case <-c.done:
				}
				return Grant{}, ctx.Err()
			}
			if i := slices.Index(rc.pending, c); i >= 0 {
				rc.pending = slices.Delete(rc.pending, i, i+1)
			}
			rc.mu.Unlock()
			// No longer queued: its batch may still commit it, as a
			// report whose answer was lost.
			return Grant{}, ctx.Err()
		}
	}
}

// runReports decides the oldest queued reports, up to MaxBatch, in one
// transaction, then passes the lead on.
func (s *Store) runReports(ctx context.Context) {
	rc := &s.reports
	rc.mu.Lock()
	n := min(len(rc.pending), s.cfg.MaxBatch)
	batch := slices.Clone(rc.pending[:n])
	rc.pending = slices.Delete(rc.pending, 0, n)
	rc.mu.Unlock()
	if n > 0 {
		s.reportBatch(ctx, batch)
		for _, c := range batch {
			close(c.done)
		}
	}
	rc.mu.Lock()
	if len(rc.pending) == 0 {
		rc.running = false
	} else {
		next := rc.pending[0]
		next.leading = true
		next.lead <- struct{}{}
	}
	rc.mu.Unlock()
}

// reportBatch answers every report of batch: in one transaction, else
// (the batch failed as a whole) one by one.
func (s *Store) reportBatch(ctx context.Context, batch []*report) {
	conn, err := s.db.Acquire(ctx)
	if err != nil {
		for _, c := range batch {
			c.g, c.err = Grant{}, fmt.Errorf("admission: report: %w", err)
		}
		return
	}
	defer conn.Release()
	start := time.Now()
	err = s.reportTx(ctx, conn, batch)
	d := time.Since(start)
	s.m.reportSize.Observe(float64(len(batch)))
	s.m.reportSecs.Observe(d.Seconds())
	s.cfg.Logger.Debug("report batch", "reports", len(batch), "duration", d, "error", err)
	for _, c := range batch {
		if err == nil && !c.single {
			continue
		}
		c.g, c.err = s.reportOne(ctx, conn, c)
	}
}

// reportOne is the single path: one report in a transaction of its own.
func (s *Store) reportOne(ctx context.Context, conn batcher, c *report) (Grant, error) {
	if c.release {
		return s.release(ctx, conn, c.r)
	}
	return s.renew(ctx, conn, c.r)
}

// grantWrite is a grant's state once the batch's reports on it are
// decided.
type grantWrite struct {
	spent                 decimal.Decimal
	validUntil, reclaimAt time.Time
	released              bool
}

// reportTx runs batch's reports in one transaction (the protocol above).
// An error rolls the whole batch back, and no report is answered by it.
func (s *Store) reportTx(ctx context.Context, db batcher, batch []*report) (err error) {
	now := s.now()
	holders := map[string]bool{}
	ids := map[uuid.UUID]bool{}
	var freeIDs []uuid.UUID
	var freeSpent []string
	for _, c := range batch {
		holders[c.r.Holder], ids[c.r.Grant] = true, true
		if c.release {
			freeIDs, freeSpent = append(freeIDs, c.r.Grant), append(freeSpent, c.r.Spent.String())
		}
	}
	args := pgnamed.Args{"holders": slices.Sorted(maps.Keys(holders)), "ids": pguuid.Slice(sortedIDs(ids)),
		"free_ids": pguuid.Slice(freeIDs), "free_spent": freeSpent}
	generations := map[string]int64{}
	grants := map[uuid.UUID]Grant{}
	defer func() {
		if err != nil {
			_, _ = db.Exec(context.WithoutCancel(ctx), "ROLLBACK")
		}
	}()
	b := &pgx.Batch{}
	b.Queue("BEGIN")
	b.Queue(qGenericKeyPlans)
	b.Queue(qShareHolders, args).Query(func(r pgx.Rows) error {
		return scanAll(r, func() error {
			var h string
			var g int64
			if err := r.Scan(&h, &g); err != nil {
				return err
			}
			generations[h] = g
			return nil
		})
	})
	if len(freeIDs) > 0 {
		b.Queue(qLockFreedBudgetRows, args)
		b.Queue(qLockFreedScopeRows, args)
	}
	b.Queue(qGrantsForUpdate, args).Query(func(r pgx.Rows) error {
		return scanAll(r, func() error {
			g, err := scanGrant(r, now)
			if err != nil {
				return err
			}
			grants[g.ID] = g
			return nil
		})
	})
	if err := db.SendBatch(ctx, b).Close(); err != nil {
		return fmt.Errorf("admission: report: %w", err)
	}
	writes := map[uuid.UUID]*grantWrite{}
	for _, c := range batch {
		s.decideReport(c, generations, grants, writes, now)
	}
	if err := writeReports(ctx, db, grants, writes, now); err != nil {
		for _, c := range batch {
			c.g, c.err = Grant{}, nil
		}
		return err
	}
	return nil
}

func sortedIDs(ids map[uuid.UUID]bool) []uuid.UUID {
	out := slices.Collect(maps.Keys(ids))
	slices.SortFunc(out, func(a, b uuid.UUID) int { return slices.Compare(a[:], b[:]) })
	return out
}

// decideReport decides one report against the state the batch read and
// what its earlier reports decided: fenced, then applied to grants and
// writes. A late final report is left to the single path.
func (s *Store) decideReport(c *report, generations map[string]int64, grants map[uuid.UUID]Grant,
	writes map[uuid.UUID]*grantWrite, now time.Time) {
	r := c.r
	current, holderFound := generations[r.Holder]
	if !holderFound {
		c.err = &FencedError{Grant: r.Grant, Holder: r.Holder, Generation: r.Generation}
		return
	}
	g, ok := grants[r.Grant]
	var readErr error
	if !ok {
		readErr = ErrNotFound
	}
	if c.release && ok && reclaimedUnreported(g, r) {
		c.single = true
		return
	}
	if err := checkFence(g, readErr, r, current); err != nil {
		c.err = err
		return
	}
	w := writes[g.ID]
	if w == nil {
		w = &grantWrite{validUntil: g.ValidUntil, reclaimAt: g.ReclaimAt}
		writes[g.ID] = w
	}
	w.spent = r.Spent
	if c.release {
		w.released = true
		t := now
		g.Spent, g.EndedAt, g.EndReason, g.State = r.Spent, &t, "released", "ended"
	} else {
		s.extend(&g, r.TTL, now)
		g.Spent = r.Spent
		w.validUntil, w.reclaimAt = g.ValidUntil, g.ReclaimAt
	}
	grants[g.ID] = g
	c.g = g
}

// writeReports is the batch's second round trip: every grant's final
// state, the sums freed in every customer, pool and global budget, and the
// commit.
func writeReports(ctx context.Context, db batcher, grants map[uuid.UUID]Grant, writes map[uuid.UUID]*grantWrite, now time.Time) error {
	var ids, freedIDs []uuid.UUID
	var spent, freedDelta []string
	var validUntil, reclaimAt []time.Time
	var released []bool
	type rowKey struct {
		customer, meter string
		start           time.Time
	}
	freed := map[rowKey]decimal.Decimal{}
	for _, id := range sortedIDs(mapsKeysSet(writes)) {
		w, g := writes[id], grants[id]
		ids, spent, released = append(ids, id), append(spent, w.spent.String()), append(released, w.released)
		validUntil, reclaimAt = append(validUntil, w.validUntil), append(reclaimAt, w.reclaimAt)
		if !w.released {
			continue
		}
		if delta := g.Amount.Sub(w.spent); !delta.IsZero() {
			freedIDs, freedDelta = append(freedIDs, id), append(freedDelta, delta.String())
			if g.drawsCustomer {
				k := rowKey{g.Customer, g.Meter, g.PeriodStart}
				freed[k] = freed[k].Add(delta)
			}
		}
	}
	if len(ids) == 0 {
		_, err := db.Exec(ctx, "COMMIT")
		return err
	}
	var fc, fm []string
	var fs []time.Time
	var fd []string
	for _, k := range slices.SortedFunc(maps.Keys(freed), func(a, b rowKey) int {
		if a.customer != b.customer {
			return strings.Compare(a.customer, b.customer)
		}
		if a.meter != b.meter {
			return strings.Compare(a.meter, b.meter)
		}
		return a.start.Compare(b.start)
	}) {
		fc, fm, fs, fd = append(fc, k.customer), append(fm, k.meter), append(fs, k.start), append(fd, freed[k].String())
	}
	wb := &pgx.Batch{}
	wb.Queue(qWriteReportedGrants, pgnamed.Args{"ids": pguuid.Slice(ids), "spent": spent, "valid_until": validUntil,
		"reclaim_at": reclaimAt, "released": released, "now": now})
	if len(fc) > 0 {
		wb.Queue(qFreeBudgets, pgnamed.Args{"customers": fc, "meters": fm, "starts": fs, "deltas": fd, "now": now})
	}
	if len(freedIDs) > 0 {
		wb.Queue(qFreeScopeDraws, pgnamed.Args{"ids": pguuid.Slice(freedIDs), "deltas": freedDelta, "now": now})
		// Rate buckets (rate.go): the batch's unspent parts go back, summed
		// per bucket and in the buckets' sorted order (the lock order, last).
		wb.Queue(qReturnRateDrawsMany, pgnamed.Args{"ids": pguuid.Slice(freedIDs), "deltas": freedDelta})
	}
	wb.Queue("COMMIT")
	if err := db.SendBatch(ctx, wb).Close(); err != nil {
		return fmt.Errorf("admission: report: %w", err)
	}
	return nil
}

func mapsKeysSet[V any](m map[uuid.UUID]V) map[uuid.UUID]bool {
	out := make(map[uuid.UUID]bool, len(m))
	for k := range m {
		out[k] = true
	}
	return out
}
