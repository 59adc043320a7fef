package admission

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgtype"
	"github.com/shopspring/decimal"

	"github.com/tally-ledger/tally/internal/pgnamed"
	"github.com/tally-ledger/tally/internal/pguuid"
	"github.com/tally-ledger/tally/periods"
	"github.com/tally-ledger/tally/quota"
	"github.com/tally-ledger/tally/validation"
)

// Report is a holder's renew or release of one grant.
type Report struct {
	Grant      uuid.UUID
	Holder     string
	Generation int64
	// Spent is everything admitted from the grant so far: never less than
	// the last report, never more than the amount.
	Spent decimal.Decimal
	// TTL (renew only): valid_until becomes now + TTL unless already later,
	// never past the period's end. Default 30 s.
	TTL time.Duration
}

// Validate reports every problem of r at once.
func (r Report) Validate() error {
	errs := checkHolder(r.Holder, r.Generation)
	if r.Spent.IsNegative() {
		errs = append(errs, &FieldError{Field: "spent", Detail: fmt.Sprintf("%s is negative", r.Spent)})
	}
	errs = append(errs, checkTTL(r.TTL)...)
	return errors.Join(errs...)
}

// Renew records spent and extends the grant's validity. It shares a
// transaction with concurrent renews and releases of this Store
// (report_batch.go), fenced on its own, answered after the commit.
func (s *Store) Renew(ctx context.Context, r Report) (Grant, error) {
	if err := r.Validate(); err != nil {
		return Grant{}, err
	}
	if r.TTL == 0 {
		r.TTL = DefaultTTL
	}
	return s.submit(ctx, &report{r: r})
}

// renew is the single path of one renew, in a transaction of its own on
// db: lock the holder row (shared) and the grant, check the fence, extend.
func (s *Store) renew(ctx context.Context, db batcher, r Report) (g Grant, err error) {
	now := s.now()
	if _, err := db.Exec(ctx, "BEGIN"); err != nil {
		return Grant{}, fmt.Errorf("admission: renew: %w", err)
	}
	defer func() {
		if err != nil {
			_, _ = db.Exec(context.WithoutCancel(ctx), "ROLLBACK")
		}
	}()
	if g, err = s.fenced(ctx, db, r, now); err != nil {
		return Grant{}, err
	}
	s.extend(&g, r.TTL, now)
	g.Spent = r.Spent
	if _, err = db.Exec(ctx, qRenewGrant, pgnamed.Args{"id": pguuid.Of(g.ID), "spent": r.Spent.String(),
		"valid_until": g.ValidUntil, "reclaim_at": g.ReclaimAt}); err != nil {
		return Grant{}, fmt.Errorf("admission: renew: %w", err)
	}
	if _, err = db.Exec(ctx, "COMMIT"); err != nil {
		return Grant{}, fmt.Errorf("admission: renew: %w", err)
	}
	return g, nil
}

// extend is what a renewal does to g's validity: valid_until becomes now
// + ttl unless already later, never past the end of any period the grant
// drew from (its customer's, every pool's or the global one's) nor a rate
// grant's validity at issue. reclaim_at moves only with valid_until, to
// max_skew after it, and never earlier: a renewal that extends nothing (a
// rate grant's) keeps the reclaim its issue set, which for a rate grant
// may be its rules' own smaller max_skew (docs/design.md §17).
func (s *Store) extend(g *Grant, ttl time.Duration, now time.Time) {
	validUntil := minTime(now.Add(ttl), g.PeriodEnd)
	if g.drawsEnd != nil {
		validUntil = minTime(validUntil, *g.drawsEnd)
	}
	if !validUntil.After(g.ValidUntil) {
		return
	}
	g.ValidUntil = validUntil
	if reclaim := validUntil.Add(s.cfg.MaxSkew); reclaim.After(g.ReclaimAt) {
		g.ReclaimAt = reclaim
	}
}

// Release ends the grant with its final spent; amount - spent is free for
// new grants once it returns. It shares a transaction with concurrent
// renews and releases of this Store (report_batch.go): fenced on its own,
// all or nothing, answered after the commit.
//
// Alone, a release is two round trips on a connection of its own: one
// batch that begins the transaction and takes the locks in the fixed order
// (holder row shared, then, when the report frees capacity, the customer's
// budget row and the pool and global rows the grant drew from, then the
// grant) while reading what the fence needs; the checks; and one batch that
// writes the grant, frees amount - spent in every budget drawn and
// commits. A refused release rolls back, so it moves nothing.
func (s *Store) Release(ctx context.Context, r Report) (Grant, error) {
	r.TTL = 0
	if err := r.Validate(); err != nil {
		return Grant{}, err
	}
	return s.submit(ctx, &report{r: r, release: true})
}

// release is the protocol of one release: begin and lock in the fixed
// order while reading the fence, check the fence, then write and commit.
func (s *Store) release(ctx context.Context, db batcher, r Report) (g Grant, err error) {
	now := s.now()
	defer func() {
		if err != nil {
			_, _ = db.Exec(context.WithoutCancel(ctx), "ROLLBACK")
		}
	}()
	g, late, err := lockRelease(ctx, db, r, now)
	if err != nil {
		return Grant{}, err
	}
	if late {
		return s.recordLate(ctx, db, g, r)
	}
	if err := writeRelease(ctx, db, g, r, now); err != nil {
		return Grant{}, err
	}
	g.Spent, g.EndedAt, g.EndReason, g.State = r.Spent, &now, "released", "ended"
	return g, nil
}

// lockRelease is a release's first round trip: it begins the transaction,
// takes the locks in the fixed order (holder row shared, then, when the
// report frees capacity, the customer's budget row and the pool and global
// rows the grant drew from, then the grant) and reads what the fence
// needs; then it checks the fence. late says r is a final report that
// arrived after g was reclaimed without one (recordLate, not a release).
func lockRelease(ctx context.Context, db batcher, r Report, now time.Time) (_ Grant, late bool, _ error) {
	args := pgnamed.Args{"holder": r.Holder, "id": pguuid.Of(r.Grant), "spent": r.Spent.String()}
	var g Grant
	var current int64
	holderFound := true
	var gErr error
	b := &pgx.Batch{}
	b.Queue("BEGIN")
	b.Queue(qHolderGeneration, args).QueryRow(func(row pgx.Row) error {
		err := row.Scan(&current)
		if errors.Is(err, pgx.ErrNoRows) {
			holderFound = false
			return nil
		}
		return err
	})
	// Both lock nothing when the report frees nothing (the whole amount
	// spent): such a release moves no budget, so it does not queue on a hot
	// pool or global row. The grant's own lock fences it.
	b.Queue(qLockReleaseBudgetRow, args)
	b.Queue(qLockReleaseDraws, args)
	b.Queue(qGrantForUpdate, args).QueryRow(func(row pgx.Row) error {
		g, gErr = scanGrant(row, now)
		if errors.Is(gErr, ErrNotFound) {
			return nil
		}
		return gErr
	})
	if err := db.SendBatch(ctx, b).Close(); err != nil {
		return Grant{}, false, fmt.Errorf("admission: release: %w", err)
	}
	if !holderFound {
		return Grant{}, false, &FencedError{Grant: r.Grant, Holder: r.Holder, Generation: r.Generation}
	}
	if gErr == nil && reclaimedUnreported(g, r) {
		return g, true, nil
	}
	if err := checkFence(g, gErr, r, current); err != nil {
		return Grant{}, false, err
	}
	return g, false, nil
}

// writeRelease is a release's second round trip: it ends the grant, frees
// amount - spent in every budget it drew from, and commits.
func writeRelease(ctx context.Context, db batcher, g Grant, r Report, now time.Time) error {
	wb := &pgx.Batch{}
	wb.Queue(qReleaseGrant, pgnamed.Args{"id": pguuid.Of(g.ID), "spent": r.Spent.String(), "now": now})
	// Nothing to give back when all was spent: no budget moves (and none
	// was locked).
	if freed := g.Amount.Sub(r.Spent); !freed.IsZero() {
		if g.drawsCustomer {
			wb.Queue(qFreeBudget, pgnamed.Args{"customer": g.Customer, "meter": g.Meter,
				"period_start": g.PeriodStart, "now": now, "delta": freed.String()})
		}
		wb.Queue(qFreeGrantDraws, pgnamed.Args{"id": pguuid.Of(g.ID), "delta": freed.String(), "now": now})
		// Rate buckets (rate.go): the unspent part goes back, never above
		// the burst; locked last, after the grant.
		wb.Queue(qReturnRateDraws, pgnamed.Args{"id": pguuid.Of(g.ID), "delta": freed.String()})
	}
	wb.Queue("COMMIT")
	if err := db.SendBatch(ctx, wb).Close(); err != nil {
		return fmt.Errorf("admission: release grant: %w", err)
	}
	return nil
}

// reclaimedUnreported says r is the final report of g by its own holder and
// generation, arriving after g was reclaimed without one.
func reclaimedUnreported(g Grant, r Report) bool {
	return g.State == "ended" && g.EndReason == "expired" && g.Holder == r.Holder && g.Generation == r.Generation
}

// recordLate records a final spent that arrived after the grant was
// reclaimed, in the transaction release began. From its reclaim on the
// grant counted as fully spent and its capacity may back other grants, so
// the report frees nothing: it only corrects the record (stranded falls to
// what was really unspent, reconciliation sees the true spent). It is
// accepted from the grant's own holder and generation even when that
// generation is no longer the holder's newest: a restarted gateway
// delivers its earlier run's reports, and freeing nothing, they cannot be
// spent twice. Repeating it is harmless; spent still never goes backwards.
func (s *Store) recordLate(ctx context.Context, db batcher, g Grant, r Report) (Grant, error) {
	if r.Spent.LessThan(g.Spent) || r.Spent.GreaterThan(g.Amount) {
		return Grant{}, &SpentError{Grant: g.ID, Spent: r.Spent, Previous: g.Spent, Amount: g.Amount}
	}
	tag, err := db.Exec(ctx, qRecordLateSpent, pgnamed.Args{"id": pguuid.Of(g.ID), "spent": r.Spent.String()})
	if err != nil {
		return Grant{}, fmt.Errorf("admission: record late report: %w", err)
	}
	if tag.RowsAffected() != 1 {
		// Ended by a write, not by the clock: nothing a late report fixes.
		return Grant{}, &GrantEndedError{Grant: g.ID, EndedAt: *g.EndedAt, Reason: g.EndReason}
	}
	if _, err := db.Exec(ctx, "COMMIT"); err != nil {
		return Grant{}, fmt.Errorf("admission: record late report: %w", err)
	}
	g.Spent, g.LateReport = r.Spent, true
	return g, nil
}

// fenced locks the holder row (shared) and the grant, in that order, and
// checks that r may report on the grant.
func (s *Store) fenced(ctx context.Context, tx DBTX, r Report, now time.Time) (Grant, error) {
	var current int64
	err := tx.QueryRow(ctx, qHolderGeneration, pgnamed.Args{"holder": r.Holder}).Scan(&current)
	if errors.Is(err, pgx.ErrNoRows) {
		return Grant{}, &FencedError{Grant: r.Grant, Holder: r.Holder, Generation: r.Generation}
	}
	if err != nil {
		return Grant{}, fmt.Errorf("admission: read holder: %w", err)
	}
	g, err := scanGrant(tx.QueryRow(ctx, qGrantForUpdate, pgnamed.Args{"id": pguuid.Of(r.Grant)}), now)
	if err := checkFence(g, err, r, current); err != nil {
		return Grant{}, err
	}
	return g, nil
}

// checkFence checks that r may report on g (read under its lock, with
// readErr), its holder's newest generation being current.
func checkFence(g Grant, readErr error, r Report, current int64) error {
	if current > r.Generation {
		return staleGeneration(r.Holder, r.Generation, current)
	}
	if errors.Is(readErr, ErrNotFound) {
		return validation.NotFound(ErrNotFound, "no grant %q", r.Grant.String())
	}
	if readErr != nil {
		return readErr
	}
	if g.Holder != r.Holder || g.Generation != r.Generation {
		return &FencedError{Grant: g.ID, Holder: r.Holder, Generation: r.Generation}
	}
	if g.State != "live" {
		ended, reason := g.ReclaimAt, "expired"
		if g.EndedAt != nil {
			ended, reason = *g.EndedAt, g.EndReason
		}
		return &GrantEndedError{Grant: g.ID, EndedAt: ended, Reason: reason}
	}
	if r.Spent.LessThan(g.Spent) || r.Spent.GreaterThan(g.Amount) {
		return &SpentError{Grant: g.ID, Spent: r.Spent, Previous: g.Spent, Amount: g.Amount}
	}
	return nil
}

// Get returns one grant.
func (s *Store) Get(ctx context.Context, id uuid.UUID) (Grant, error) {
	return scanGrant(s.db.QueryRow(ctx, qGrant, pgnamed.Args{"id": pguuid.Of(id)}), s.now())
}

func scanGrant(row pgx.Row, now time.Time) (Grant, error) {
	var g Grant
	var reason *string
	var drawsCustomer bool
	var draws []string
	err := row.Scan(&g.ID, &g.Customer, &g.Meter, &g.PeriodStart, &g.Period, &g.PeriodEnd, &g.RuleVersion,
		&g.Holder, &g.Generation, numeric(&g.Amount), numeric(&g.Spent), &g.IssuedAt, &g.ValidUntil, &g.ReclaimAt, &g.EndedAt, &reason,
		&drawsCustomer, &draws, &g.drawsEnd)
	if errors.Is(err, pgx.ErrNoRows) {
		return Grant{}, ErrNotFound
	}
	if err != nil {
		return Grant{}, fmt.Errorf("admission: read grant: %w", err)
	}
	if reason != nil {
		g.EndReason = *reason
	}
	g.drawsCustomer = drawsCustomer
	if drawsCustomer {
		g.Budgets = append(g.Budgets, quota.CustomerScope(g.Customer))
	}
	g.Budgets = append(g.Budgets, draws...)
	g.PeriodStart, g.PeriodEnd, g.IssuedAt = g.PeriodStart.UTC(), g.PeriodEnd.UTC(), g.IssuedAt.UTC()
	g.ValidUntil, g.ReclaimAt = g.ValidUntil.UTC(), g.ReclaimAt.UTC()
	if g.drawsEnd != nil {
		t := g.drawsEnd.UTC()
		g.drawsEnd = &t
	}
	g.State = "live"
	if g.EndedAt != nil {
		t := g.EndedAt.UTC()
		g.EndedAt, g.State = &t, "ended"
	} else if !now.Before(g.ReclaimAt) {
		t := g.ReclaimAt
		g.EndedAt, g.EndReason, g.State = &t, "expired", "ended"
	}
	return g, nil
}

// ListRequest selects a customer's grants.
type ListRequest struct {
	Customer string
	State    string // "", live or ended
	Limit    int
	// After is the (issued_at, id) of the last grant of the previous page.
	AfterIssued *time.Time
	AfterID     uuid.UUID
}

// Grants lists a customer's grants, newest first.
func (s *Store) Grants(ctx context.Context, req ListRequest) ([]Grant, error) {
	switch req.State {
	case "", "live", "ended":
	default:
		return nil, &FieldError{Field: "state", Detail: fmt.Sprintf("%q must be live or ended", req.State)}
	}
	if req.Limit <= 0 {
		req.Limit = 100
	}
	now := s.now()
	args := pgnamed.Args{"customer": req.Customer, "now": now, "limit": req.Limit,
		"after_issued": pgtype.Timestamptz{InfinityModifier: pgtype.Infinity, Valid: true}, "after_id": uuid.Max}
	if req.AfterIssued != nil {
		args["after_issued"], args["after_id"] = *req.AfterIssued, req.AfterID
	}
	q := qCustomerGrants
	switch req.State {
	case "live":
		q = qCustomerGrantsLive
	case "ended":
		q = qCustomerGrantsEnded
	}
	rows, err := s.db.Query(ctx, q, args)
	if err != nil {
		return nil, fmt.Errorf("admission: list grants: %w", err)
	}
	out, err := pgx.CollectRows(rows, func(row pgx.CollectableRow) (Grant, error) { return scanGrant(row, now) })
	if err != nil {
		return nil, fmt.Errorf("admission: list grants: %w", err)
	}
	return out, nil
}

// Budget is one customer's exact budget of a period.
type Budget struct {
	Customer string `json:"customer"`
	BudgetState
	// Bypassed is Σ reported bypasses (admitted without a grant).
	Bypassed decimal.Decimal `json:"bypassed"`
}

// BudgetState is what a customer's, a pool's and the global budget of a
// period have in common.
type BudgetState struct {
	Meter       string    `json:"meter"`
	Period      string    `json:"period"`
	PeriodStart time.Time `json:"period_start"`
	PeriodEnd   time.Time `json:"period_end"`
	// Limit and RuleVersion are those of the rule version in force now, or
	// at the period's last instant for a period that ended.
	Limit       decimal.Decimal `json:"limit"`
	RuleVersion int64           `json:"rule_version"`
	// Consumed = Σ amount of grants drawn not released + Σ spent of those
	// released (+, for a pool, what members brought in when they joined or
	// when the budget was created).
	Consumed decimal.Decimal `json:"consumed"`
	// Available = limit - consumed, never negative, by the limit of the
	// rule version in force (at the period's end, for a period that ended).
	Available decimal.Decimal `json:"available"`
	// Live is Σ amount of live grants drawn from it.
	Live decimal.Decimal `json:"live"`
	// Stranded is Σ amount - spent of the grants drawn from it that ended
	// without a final report in time (reclaimed, not released): capacity
	// counted as consumed that no report says was admitted, lost for the
	// period. A late final report lowers it to the truth and frees nothing.
	// A released grant's unspent part went back to the budget: never
	// stranded.
	Stranded decimal.Decimal `json:"stranded"`
}

// scan reads the columns qBudgets and qScopeBudgets share, in their order,
// after first (the budget's owner) and before rest.
func (b *BudgetState) scan(row pgx.Row, first any, rest ...any) error {
	dest := append([]any{first, &b.Meter, &b.Period, &b.PeriodStart, &b.PeriodEnd, numeric(&b.Limit), &b.RuleVersion,
		numeric(&b.Consumed), numeric(&b.Live), numeric(&b.Stranded)}, rest...)
	if err := row.Scan(dest...); err != nil {
		return err
	}
	b.Available = decimal.Max(decimal.Zero, b.Limit.Sub(b.Consumed))
	b.PeriodStart, b.PeriodEnd = b.PeriodStart.UTC(), b.PeriodEnd.UTC()
	return nil
}

// Budgets lists a customer's exact budgets, newest period first, by meter:
// the rows grants brought, and, for an exact rule in force under which no
// grant was issued yet this period, the budget its first grant will find
// (the rule's limit and version, what the period already consumed),
// without writing it.
func (s *Store) Budgets(ctx context.Context, customer string) ([]Budget, error) {
	return s.BudgetsPage(ctx, BudgetsRequest{Customer: customer})
}

// BudgetsRequest asks for a page of a customer's budgets, in Budgets'
// order: up to Limit (every one when 0) after the budget of AfterStart and
// AfterMeter (from the first when AfterStart is nil).
type BudgetsRequest struct {
	Customer   string
	AfterStart *time.Time
	AfterMeter string
	Limit      int
}

// BudgetsPage lists a page of a customer's budgets: a budget is kept for
// every period an exact rule was in force, and a page reads its own.
func (s *Store) BudgetsPage(ctx context.Context, req BudgetsRequest) ([]Budget, error) {
	customer := req.Customer
	now := s.now()
	sch, err := periods.Store{}.Schedule(ctx, s.db, customer)
	p, err := periodIn(sch, err, now)
	if err != nil {
		return nil, fmt.Errorf("admission: list budgets: %w", err)
	}
	args := pgnamed.Args{"customer": customer, "now": now, "period": p.Name, "lo": p.Start.UTC(), "hi": p.End.UTC(),
		"after_start": pgtype.Timestamptz{InfinityModifier: pgtype.Infinity, Valid: true}, "after_meter": "", "limit": nil}
	if req.AfterStart != nil {
		args["after_start"], args["after_meter"] = *req.AfterStart, req.AfterMeter
	}
	if req.Limit > 0 {
		args["limit"] = req.Limit
	}
	rows, err := s.db.Query(ctx, qBudgets, args)
	if err != nil {
		return nil, fmt.Errorf("admission: list budgets: %w", err)
	}
	out, err := pgx.CollectRows(rows, func(row pgx.CollectableRow) (Budget, error) {
		var b Budget
		err := b.scan(row, &b.Customer, numeric(&b.Bypassed))
		return b, err
	})
	if err != nil {
		return nil, fmt.Errorf("admission: list budgets: %w", err)
	}
	return out, nil
}
