package admission

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/shopspring/decimal"

	"github.com/tally-ledger/tally/internal/pgnamed"
	"github.com/tally-ledger/tally/internal/pguuid"
	"github.com/tally-ledger/tally/quota"
)

// Rate budgets (docs/design.md §17): a rate rule's budget is a token bucket
// per (scope, meter) on Postgres's clock, refilled by the SQL function
// admission_rate_refill (piecewise over rule versions: a new rate applies
// from its effective_at, a lower burst clamps when it takes effect, a new
// version carries the bucket over). A grant takes its amount from every
// bucket it draws from, all or nothing with its period budgets, in the
// same transaction: the buckets are locked after the period budget rows
// (sorted by scope, meter), refilled to now() and decided on under the
// lock. A release puts the unspent part back (never above the burst in
// force); a grant that ends without a final report gives nothing back.

// Bounds of a rate grant's ttl.
const (
	// DefaultRateTTL is the ttl of a grant that draws from a rate budget
	// when the request names none.
	DefaultRateTTL = time.Second
	// MaxRateTTL: a holder may spend a grant until valid_until, so the
	// stated bound grows with ttl; rate grants stay short.
	MaxRateTTL = 10 * time.Second
)

// rateKey is a bucket.
type rateKey struct{ scope, meter string }

// rateRow is a bucket as the batch read it under its lock.
type rateRow struct {
	tokens  decimal.Decimal // refilled to the batch's now()
	inForce bool            // a rate rule is in force
	version int64
	maxSkew time.Duration // the rule's max_skew (0: the deployment's)
	amount  decimal.Decimal
	perUS   decimal.Decimal // per, in microseconds
	burst   decimal.Decimal
	taken   decimal.Decimal
	refused int64
}

// rateState is what one batch reads and takes of rate buckets.
type rateState struct {
	keys []rateKey // sorted: the lock order
	rows map[rateKey]*rateRow
	// applicable is, per (customer, meter), the scopes whose rule in force
	// is an exact rate, read under the locks.
	applicable map[[2]string][]string
}

// rateDraws are a batch's grants' draws from buckets, as columns.
type rateDraws struct {
	ids            []uuid.UUID
	scopes, meters []string
	until          []time.Time
}

// qApplicableRates is, for a customer and meter at @now, the scopes
// (its own, its pools', global) whose rule in force is an exact rate,
// sorted.
const qApplicableRates = `
SELECT s.scope
FROM (SELECT 'customer:' || @customer::text AS scope
      UNION SELECT 'global'
      UNION SELECT 'pool:' || m.pool FROM pool_members m
            WHERE m.customer = @customer AND m.joined_at <= @now AND (m.left_at IS NULL OR m.left_at > @now)) s
CROSS JOIN LATERAL admission_rate_rule_in_force(s.scope, @meter, @now) r
ORDER BY s.scope`

// qApplicableRatesNow is qApplicableRates for each (customer, meter) of a
// batch, under its locks.
const qApplicableRatesNow = `
SELECT k.customer, k.meter, s.scope
FROM unnest(@k_customers::text[], @k_meters::text[]) AS k(customer, meter)
CROSS JOIN LATERAL (SELECT 'customer:' || k.customer AS scope
                    UNION SELECT 'global'
                    UNION SELECT 'pool:' || m.pool FROM pool_members m
                    WHERE m.customer = k.customer AND m.joined_at <= @now AND (m.left_at IS NULL OR m.left_at > @now)) s
CROSS JOIN LATERAL admission_rate_rule_in_force(s.scope, k.meter, @now) r`

// qEnsureRateBuckets creates the buckets a batch draws from that do not
// exist yet: full (burst of the rule in force) as of now(). A bucket is
// never deleted, so only a scope's first rate rule starts one full.
//
// Two clocks meet here, each for what it keeps. Rules are in force by the
// Store's clock (@now), which wrote their effective times and plans the
// batch (qApplicableRates): reading them by Postgres's would find, on a
// host whose clock is ahead, a rule not yet in force that the plan counts
// on, and the batch would fail as "kept changing" until the clocks met.
// Tokens accrue by Postgres's clock (now(): refilled_at), the one every
// process issuing from a bucket shares.
const qEnsureRateBuckets = `
INSERT INTO admission_rate_buckets (scope, meter, tokens, refilled_at)
SELECT u.scope, u.meter, r.burst, now()
FROM unnest(@rt_scopes::text[], @rt_meters::text[]) AS u(scope, meter)
CROSS JOIN LATERAL admission_rate_rule_in_force(u.scope, u.meter, @now) r
WHERE NOT EXISTS (SELECT 1 FROM admission_rate_buckets b WHERE b.scope = u.scope AND b.meter = u.meter)
ORDER BY 1, 2
ON CONFLICT DO NOTHING`

// qRateState locks a batch's buckets in (scope, meter) order, refills each
// to now() and reads its tokens and the rule in force at @now (the two
// clocks: qEnsureRateBuckets).
const qRateState = `
SELECT k.scope, k.meter, admission_rate_refill(k.scope, k.meter, now())::text,
       r.version, coalesce((extract(epoch FROM r.max_skew) * 1000000)::bigint, 0), r.amount::text, r.per_us::text, r.burst::text
FROM (SELECT b.scope, b.meter FROM admission_rate_buckets b
      JOIN unnest(@rt_scopes::text[], @rt_meters::text[]) AS u(scope, meter) USING (scope, meter)
      ORDER BY b.scope, b.meter
      FOR UPDATE OF b) k
LEFT JOIN LATERAL admission_rate_rule_in_force(k.scope, k.meter, @now) r ON true`

// qTakeRateBuckets takes what a batch issued from its buckets (refilled
// to now() by qRateState under the same locks) and counts its refusals.
const qTakeRateBuckets = `
UPDATE admission_rate_buckets b
SET tokens = b.tokens - u.delta::numeric, taken = b.taken + u.delta::numeric, refused = b.refused + u.refused
FROM unnest(@rw_scopes::text[], @rw_meters::text[], @rw_deltas::text[], @rw_refused::bigint[]) AS u(scope, meter, delta, refused)
WHERE (b.scope, b.meter) = (u.scope, u.meter)`

// qInsertRateDraws records the buckets each grant took from.
const qInsertRateDraws = `
INSERT INTO admission_rate_draws (grant_id, scope, meter, taken_at, until)
SELECT id, scope, meter, now(), until
FROM unnest(@rd_ids::uuid[], @rd_scopes::text[], @rd_meters::text[], @rd_until::timestamptz[]) AS d(id, scope, meter, until)`

// A release gives back its unspent part less what the bucket refilled
// since the grant took its tokens (admission_rate_tokens_at from 0 over
// that stretch, at the rates in force, at most the burst): the tokens the
// grant did not spend would have sat in the bucket, and a bucket at its
// burst refills nothing, so had the grant taken only what it spent, the
// bucket would hold at least that much less than unspent on top of what
// it holds now. Giving back the whole unspent part would hand out, on top
// of the refill other holders already took, capacity the bucket never
// had: the §17 bound would no longer hold.
const rateGiveBack = `greatest(0, %s - coalesce(admission_rate_tokens_at(d.scope, d.meter, 0, d.taken_at, now()), 0))`

// qReturnRateDraws puts a released grant's unspent part (rateGiveBack)
// back into every bucket it drew from (sorted: the lock order), never
// above the burst.
var qReturnRateDraws = `
SELECT admission_rate_give(x.scope, x.meter, x.delta, now())
FROM (SELECT d.scope, d.meter, ` + fmt.Sprintf(rateGiveBack, "@delta::numeric") + ` AS delta
      FROM admission_rate_draws d WHERE d.grant_id = @id ORDER BY d.scope, d.meter OFFSET 0) x`

// qReturnRateDrawsMany is qReturnRateDraws for a batch of releases: each
// bucket drawn by any of them gets the sum of their parts, once, in
// sorted order. Summing first gives what returning one by one gives,
// since every part is ≥ 0 and the burst caps either way.
var qReturnRateDrawsMany = `
SELECT admission_rate_give(x.scope, x.meter, x.delta, now())
FROM (SELECT d.scope, d.meter, sum(` + fmt.Sprintf(rateGiveBack, "u.delta") + `) AS delta
      FROM unnest(@ids::uuid[], @deltas::text[]::numeric[]) AS u(id, delta)
      JOIN admission_rate_draws d ON d.grant_id = u.id
      GROUP BY d.scope, d.meter
      ORDER BY d.scope, d.meter OFFSET 0) x`

// ratesDrawn is, of all the rate budgets that apply, those req draws from:
// every one, or those it names.
func ratesDrawn(req IssueRequest, all []string) []string {
	if len(req.Budgets) == 0 {
		return all
	}
	return slices.DeleteFunc(slices.Clone(all), func(s string) bool { return !slices.Contains(req.Budgets, s) })
}

// rateTTL is the ttl of a grant on rate budgets: DefaultRateTTL when the
// request names none, never above MaxRateTTL (a longer one is shortened,
// so a holder that does not yet know the budget is a rate asks once with
// its usual ttl and learns it from the answer's "rate").
func rateTTL(req IssueRequest) time.Duration {
	if req.TTL == 0 {
		return DefaultRateTTL
	}
	return min(req.TTL, MaxRateTTL)
}

// collectRates gathers the buckets the planned calls of batch draw from.
func (st *batchState) collectRates(batch []*call, plans []plan) {
	st.rate = &rateState{rows: map[rateKey]*rateRow{}, applicable: map[[2]string][]string{}}
	for i, c := range batch {
		if c.err != nil {
			continue
		}
		for _, s := range plans[i].rates {
			k := rateKey{s, c.req.Meter}
			if st.rate.rows[k] == nil {
				st.rate.rows[k] = &rateRow{}
				st.rate.keys = append(st.rate.keys, k)
			}
		}
	}
	slices.SortFunc(st.rate.keys, func(a, b rateKey) int {
		if c := strings.Compare(a.scope, b.scope); c != 0 {
			return c
		}
		return strings.Compare(a.meter, b.meter)
	})
	scopes, meters := make([]string, len(st.rate.keys)), make([]string, len(st.rate.keys))
	for i, k := range st.rate.keys {
		scopes[i], meters[i] = k.scope, k.meter
	}
	st.args["rt_scopes"], st.args["rt_meters"] = scopes, meters
}

// queueRates adds the buckets' statements to the lock-and-read round
// trip, after the period budget rows: ensure, lock, refill and read, and
// which rate budgets apply to each (customer, meter) under the locks.
func (st *batchState) queueRates(b *pgx.Batch) {
	if len(st.rate.keys) > 0 {
		b.Queue(qEnsureRateBuckets, st.args)
		b.Queue(qRateState, st.args).Query(func(r pgx.Rows) error {
			return scanAll(r, func() error {
				var k rateKey
				var tokens *string
				var version, skewMicros *int64
				var amt, per, burst *string
				if err := r.Scan(&k.scope, &k.meter, &tokens, &version, &skewMicros, &amt, &per, &burst); err != nil {
					return err
				}
				row := st.rate.rows[k]
				if row == nil {
					return fmt.Errorf("unexpected rate budget %v", k)
				}
				if tokens != nil {
					t, err := decimal.NewFromString(*tokens)
					if err != nil {
						return err
					}
					row.tokens = t
				}
				if version != nil {
					row.inForce, row.version = true, *version
					row.maxSkew = time.Duration(*skewMicros) * time.Microsecond
					var err error
					if row.amount, err = decimal.NewFromString(*amt); err != nil {
						return err
					}
					if row.perUS, err = decimal.NewFromString(*per); err != nil {
						return err
					}
					if row.burst, err = decimal.NewFromString(*burst); err != nil {
						return err
					}
				}
				return nil
			})
		})
	}
	b.Queue(qApplicableRatesNow, st.args).Query(func(r pgx.Rows) error {
		return scanAll(r, func() error {
			var c, m, scope string
			if err := r.Scan(&c, &m, &scope); err != nil {
				return err
			}
			st.rate.applicable[[2]string{c, m}] = append(st.rate.applicable[[2]string{c, m}], scope)
			return nil
		})
	})
}

// ratesStillApply says whether the rate budgets planned without locks are
// those under them: each still an exact rate, and (unless req named a
// subset) none started to apply.
func (st *batchState) ratesStillApply(pl plan, req IssueRequest) bool {
	for _, s := range pl.rates {
		if r := st.rate.rows[rateKey{s, req.Meter}]; r == nil || !r.inForce {
			return false
		}
	}
	if pl.subset {
		return true
	}
	return len(st.rate.applicable[[2]string{req.Customer, req.Meter}]) == len(pl.rates)
}

// rateAvailable is the fewest tokens left over pl's buckets and the
// binding one ("" when pl draws from none).
func (st *batchState) rateAvailable(pl plan, meter string) (decimal.Decimal, string) {
	var avail decimal.Decimal
	bind := ""
	for _, s := range pl.rates {
		r := st.rate.rows[rateKey{s, meter}]
		if a := decimal.Max(decimal.Zero, r.tokens.Sub(r.taken)); bind == "" || a.LessThan(avail) {
			avail, bind = a, s
		}
	}
	return avail, bind
}

// rateRefusal is the refusal of need by the bucket of scope: after how
// long it will hold need at the rate in force, or, for more than its
// burst, never.
func (st *batchState) rateRefusal(scope, meter string, avail, need decimal.Decimal) *BudgetExhaustedError {
	ex := &BudgetExhaustedError{Binding: scope + "/" + meter, Available: avail}
	if r := st.rate.rows[rateKey{scope, meter}]; need.GreaterThan(r.burst) {
		ex.Burst = decimal.NullDecimal{Decimal: r.burst, Valid: true}
	} else {
		ex.RetryAfter = st.rateRetryAfter(scope, meter, need)
	}
	return ex
}

// rateRetryAfter is how long the bucket of scope takes to refill need
// beyond what it holds now, at the rate in force.
func (st *batchState) rateRetryAfter(scope, meter string, need decimal.Decimal) time.Duration {
	r := st.rate.rows[rateKey{scope, meter}]
	deficit := need.Sub(decimal.Max(decimal.Zero, r.tokens.Sub(r.taken)))
	if !deficit.IsPositive() || !r.amount.IsPositive() {
		return 0
	}
	us := deficit.Mul(r.perUS).Div(r.amount).Ceil()
	return time.Duration(us.IntPart()) * time.Microsecond
}

// takeRates takes amt from pl's buckets.
func (st *batchState) takeRates(pl plan, meter string, amt decimal.Decimal) {
	for _, s := range pl.rates {
		r := st.rate.rows[rateKey{s, meter}]
		r.taken = r.taken.Add(amt)
	}
}

// refuseRate counts a refusal by the bucket of scope.
func (st *batchState) refuseRate(scope, meter string) {
	if r := st.rate.rows[rateKey{scope, meter}]; r != nil {
		r.refused++
	}
}

// rateSkew is the reclaim margin of a grant drawing from pl's buckets: the
// smallest of the deployment's and its rules' own max_skew.
func (st *batchState) rateSkew(pl plan, meter string, deployment time.Duration) time.Duration {
	skew := deployment
	for _, s := range pl.rates {
		if r := st.rate.rows[rateKey{s, meter}]; r != nil && r.maxSkew > 0 && r.maxSkew < skew {
			skew = r.maxSkew
		}
	}
	return skew
}

// addRateDraws records g's draws from pl's buckets.
func (w *rateDraws) add(g Grant, pl plan) {
	for _, s := range pl.rates {
		w.ids, w.scopes, w.meters, w.until = append(w.ids, g.ID), append(w.scopes, s), append(w.meters, g.Meter), append(w.until, g.ValidUntil)
	}
}

// queueRateWrites adds the buckets' takes and the grants' draws to the
// write round trip (after the grants: the draws refer to them).
func (st *batchState) queueRateWrites(b *pgx.Batch, w *rateDraws) {
	var scopes, meters, deltas []string
	var refused []int64
	for _, k := range st.rate.keys {
		r := st.rate.rows[k]
		if r.taken.IsZero() && r.refused == 0 {
			continue
		}
		scopes, meters, deltas, refused = append(scopes, k.scope), append(meters, k.meter), append(deltas, r.taken.String()), append(refused, r.refused)
	}
	if len(scopes) > 0 {
		b.Queue(qTakeRateBuckets, pgnamed.Args{"rw_scopes": scopes, "rw_meters": meters, "rw_deltas": deltas, "rw_refused": refused})
	}
	if len(w.ids) > 0 {
		b.Queue(qInsertRateDraws, pgnamed.Args{"rd_ids": pguuid.Slice(w.ids), "rd_scopes": w.scopes, "rd_meters": w.meters, "rd_until": w.until})
	}
}

// RateBudget is a rate budget's state (docs/design.md §17): its bucket, the
// rule in force, and its grants.
type RateBudget struct {
	Scope  string          `json:"scope"`
	Meter  string          `json:"meter"`
	Amount decimal.Decimal `json:"amount"`
	Per    string          `json:"per"`
	Burst  decimal.Decimal `json:"burst"`
	// Tokens the bucket holds now (refilled on Postgres's clock; reading
	// writes nothing).
	Tokens decimal.Decimal `json:"tokens"`
	// Live is Σ amount of the live grants drawn from it; Stranded Σ
	// amount − spent of those reclaimed without a final report (counted
	// fully spent: never given back).
	Live     decimal.Decimal `json:"live"`
	Stranded decimal.Decimal `json:"stranded"`
	// Taken and Returned are Σ tokens ever taken by grants and given back
	// by releases; Refused the requests it refused.
	Taken    decimal.Decimal `json:"taken"`
	Returned decimal.Decimal `json:"returned"`
	Refused  int64           `json:"refused"`
}

// qRateBudgets lists the rate buckets of @scopes with their state now.
// A budget no grant has drawn on yet has no bucket row: it is listed
// full at its burst, as the first grant creates it. The bucket's tokens
// are Postgres's clock (now()), as they are refilled; its rule, and its
// grants as live or stranded, the Store's (@now), which issuing reads
// rules by and which wrote the grants' reclaim_at (qEnsureRateBuckets).
const qRateBudgets = `
WITH c AS (
    SELECT scope, meter FROM admission_rate_buckets WHERE scope = ANY(@scopes::text[])
    UNION SELECT 'customer:' || customer, meter FROM quota_rules
          WHERE rate_amount IS NOT NULL AND 'customer:' || customer = ANY(@scopes::text[])
    UNION SELECT scope, meter FROM quota_scope_rules WHERE rate_amount IS NOT NULL AND scope = ANY(@scopes::text[]))
SELECT c.scope, c.meter, r.amount::text, (r.per_us / 1000)::bigint, r.burst::text,
       coalesce(admission_rate_tokens_at(b.scope, b.meter, b.tokens, b.refilled_at, now()), r.burst)::text,
       coalesce((SELECT sum(g.amount) FROM admission_rate_draws d JOIN admission_grants g ON g.id = d.grant_id
                 WHERE (d.scope, d.meter) = (c.scope, c.meter) AND g.ended_at IS NULL AND g.reclaim_at > @now), 0)::text,
       coalesce((SELECT sum(g.amount - g.spent) FROM admission_rate_draws d JOIN admission_grants g ON g.id = d.grant_id
                 WHERE (d.scope, d.meter) = (c.scope, c.meter) AND g.ended_at IS NULL AND g.reclaim_at <= @now), 0)::text,
       coalesce(b.taken, 0)::text, coalesce(b.returned, 0)::text, coalesce(b.refused, 0)
FROM c
JOIN LATERAL admission_rate_rule_in_force(c.scope, c.meter, @now) r ON true
LEFT JOIN admission_rate_buckets b ON (b.scope, b.meter) = (c.scope, c.meter)
ORDER BY c.scope, c.meter`

// RateBudgets lists the rate budgets of scopes ("customer:<id>",
// "pool:<name>", "global") whose rule in force is a rate.
func (s *Store) RateBudgets(ctx context.Context, scopes ...string) ([]RateBudget, error) {
	rows, err := s.db.Query(ctx, qRateBudgets, pgnamed.Args{"scopes": scopes, "now": s.now()})
	if err != nil {
		return nil, fmt.Errorf("admission: read rate budgets: %w", err)
	}
	out, err := pgx.CollectRows(rows, func(row pgx.CollectableRow) (RateBudget, error) {
		var b RateBudget
		var perMS int64
		var amt, burst, tok, live, stranded, taken, returned string
		if err := row.Scan(&b.Scope, &b.Meter, &amt, &perMS, &burst, &tok, &live, &stranded, &taken, &returned, &b.Refused); err != nil {
			return RateBudget{}, err
		}
		b.Per = quota.FormatDuration(time.Duration(perMS) * time.Millisecond)
		for _, f := range []struct {
			s string
			d *decimal.Decimal
		}{{amt, &b.Amount}, {burst, &b.Burst}, {tok, &b.Tokens}, {live, &b.Live}, {stranded, &b.Stranded}, {taken, &b.Taken}, {returned, &b.Returned}} {
			v, err := decimal.NewFromString(f.s)
			if err != nil {
				return RateBudget{}, err
			}
			*f.d = v
		}
		return b, nil
	})
	if err != nil {
		return nil, fmt.Errorf("admission: read rate budgets: %w", err)
	}
	return out, nil
}

// qCustomerScopes are the budget scopes a customer draws from at @now
// (the Store's clock, which membership was written and issuing reads it
// by): its own, its pools' and global.
const qCustomerScopes = `
SELECT 'customer:' || @customer::text UNION SELECT 'global'
UNION SELECT 'pool:' || m.pool FROM pool_members m
      WHERE m.customer = @customer AND m.joined_at <= @now AND (m.left_at IS NULL OR m.left_at > @now)`

// RateBudgetsOf lists the rate budgets a customer draws from: its own,
// its pools' and the global one.
func (s *Store) RateBudgetsOf(ctx context.Context, customer string) ([]RateBudget, error) {
	rows, err := s.db.Query(ctx, qCustomerScopes, pgnamed.Args{"customer": customer, "now": s.now()})
	if err != nil {
		return nil, fmt.Errorf("admission: read rate budgets: %w", err)
	}
	scopes, err := pgx.CollectRows(rows, pgx.RowTo[string])
	if err != nil {
		return nil, fmt.Errorf("admission: read rate budgets: %w", err)
	}
	return s.RateBudgets(ctx, scopes...)
}
