package quota

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/shopspring/decimal"

	"github.com/tally-ledger/tally/periods"
)

// A Subject is what usage is counted for: a customer ("customer:<id>"), a
// pool ("pool:<name>") or the global scope ("global"), and one meter.
type Subject struct {
	Scope string
	Meter string
}

// SubjectUsage is a subject's usage in its current period, counted as the
// enforcer counts it, with the quota limit in force.
type SubjectUsage struct {
	Subject
	// Period is the subject's current period: the customer's calendar, or
	// monthly UTC for pools and the global scope.
	Period periods.Period
	// Used is the billed usage of Period from rollups (prior-period
	// adjustments it absorbed included).
	Used decimal.Decimal
	// Previous is the period before Period, PreviousUsed its usage so far
	// (late usage in its grace included).
	Previous     periods.Period
	PreviousUsed decimal.Decimal
	// AsOf is the instant through which the usage is known complete (nil:
	// unknown), as in a decision.
	AsOf *time.Time
	// Limit is the period limit of the quota rule in force for the
	// subject and meter (quota_rule_in_force, quota_scope_rule_in_force),
	// nil when no rule is in force or the rule has no period limit;
	// RuleVersion is that rule's version (0: none).
	Limit       *decimal.Decimal
	RuleVersion int64
}

// UsageQuery says which subjects to read, at which instant.
type UsageQuery struct {
	Now         time.Time
	IngestTopic string // default DefaultIngestTopic
	Subjects    []Subject
}

// qSchedules is the stored calendar of each customer of $1 (absent: the
// default calendar).
const qSchedules = `SELECT id, schedule FROM customers WHERE id = ANY($1::text[])`

// qLimitsInForce is, for each (customer, meter), the version and period
// limit of the rule in force at $3 (NULL when none, or no period limit).
const qLimitsInForce = `
SELECT k.i, coalesce(r.version, 0), r."limit"::text
FROM unnest($1::text[], $2::text[]) WITH ORDINALITY AS k(customer, meter, i)
LEFT JOIN LATERAL quota_rule_in_force(k.customer, k.meter, $3) r ON true
ORDER BY k.i`

// qScopeLimitsInForce is qLimitsInForce for pool and global rules.
const qScopeLimitsInForce = `
SELECT k.i, coalesce(r.version, 0), r."limit"::text
FROM unnest($1::text[], $2::text[]) WITH ORDINALITY AS k(scope, meter, i)
LEFT JOIN LATERAL quota_scope_rule_in_force(k.scope, k.meter, $3) r ON true
ORDER BY k.i`

// UsageOf reads each subject's usage in its current period at q.Now, its
// as_of and the limit in force, with the enforcer's own queries (rollups
// and ingest positions only; a constant number of round trips). An error
// is returned whole: a partial read is never zero usage. The answer is in
// the order of q.Subjects.
func UsageOf(ctx context.Context, db DBTX, q UsageQuery) ([]SubjectUsage, error) {
	if q.IngestTopic == "" {
		q.IngestTopic = DefaultIngestTopic
	}
	out := make([]SubjectUsage, len(q.Subjects))
	var cust, scoped []int
	for i, s := range q.Subjects {
		out[i].Subject = s
		switch {
		case strings.HasPrefix(s.Scope, "customer:"):
			cust = append(cust, i)
		case ValidScope(s.Scope):
			scoped = append(scoped, i)
		default:
			return nil, fmt.Errorf("quota: usage of %q: not a subject", s.Scope)
		}
	}
	var byCust bool
	if err := db.QueryRow(ctx, qHasIngestCustomers).Scan(&byCust); err != nil {
		return nil, fmt.Errorf("quota: read usage: %w", err)
	}
	if err := customerUsage(ctx, db, q, byCust, out, cust); err != nil {
		return nil, err
	}
	if err := scopeUsage(ctx, db, q, byCust, out, scoped); err != nil {
		return nil, err
	}
	return out, nil
}

func customerUsage(ctx context.Context, db DBTX, q UsageQuery, byCust bool, out []SubjectUsage, idx []int) error {
	if len(idx) == 0 {
		return nil
	}
	n := len(idx)
	customers, meters := make([]string, n), make([]string, n)
	for j, i := range idx {
		customers[j] = strings.TrimPrefix(out[i].Scope, "customer:")
		meters[j] = out[i].Meter
	}
	schedules := map[string]periods.Schedule{}
	rows, err := db.Query(ctx, qSchedules, customers)
	if err != nil {
		return fmt.Errorf("quota: read calendars: %w", err)
	}
	for rows.Next() {
		var id string
		var raw []byte
		if err := rows.Scan(&id, &raw); err != nil {
			rows.Close()
			return fmt.Errorf("quota: read calendars: %w", err)
		}
		var sch periods.Schedule
		if err := json.Unmarshal(raw, &sch); err != nil {
			rows.Close()
			return fmt.Errorf("quota: customer %q: stored calendar: %w", id, err)
		}
		schedules[id] = sch
	}
	if err := rows.Err(); err != nil {
		return fmt.Errorf("quota: read calendars: %w", err)
	}
	starts, prevStarts := make([]time.Time, n), make([]time.Time, n)
	nows := make([]time.Time, n)
	for j, i := range idx {
		sch, ok := schedules[customers[j]]
		if !ok {
			sch = periods.NewSchedule(periods.DefaultCalendar())
		}
		p, err := sch.PeriodAt(q.Now)
		if err != nil {
			return fmt.Errorf("quota: customer %q: period at %s: %w", customers[j], q.Now, err)
		}
		prev, err := sch.Previous(p)
		if err != nil {
			prev = p
		}
		out[i].Period, out[i].Previous = p, prev
		starts[j], prevStarts[j], nows[j] = p.Start.UTC(), prev.Start.UTC(), q.Now
	}
	sql := qUsageByTopic
	if byCust {
		sql = qUsageByCustomer
	}
	// The enforcer's usage query (the recent rate is not needed here:
	// recent_from = now).
	rows, err = db.Query(ctx, sql, customers, meters, starts, prevStarts, nows, q.IngestTopic)
	if err != nil {
		return fmt.Errorf("quota: read usage: %w", err)
	}
	seen := 0
	for rows.Next() {
		var k int64
		var used, recent, prevUsed string
		var asOf *time.Time
		if err := rows.Scan(&k, &used, &recent, &prevUsed, &asOf); err != nil {
			rows.Close()
			return fmt.Errorf("quota: read usage: %w", err)
		}
		if k < 1 || int(k) > n {
			rows.Close()
			return fmt.Errorf("quota: read usage: row %d of %d", k, n)
		}
		u := &out[idx[k-1]]
		if u.Used, err = decimal.NewFromString(used); err != nil {
			rows.Close()
			return fmt.Errorf("quota: read usage: %q: %w", used, err)
		}
		if u.PreviousUsed, err = decimal.NewFromString(prevUsed); err != nil {
			rows.Close()
			return fmt.Errorf("quota: read usage: %q: %w", prevUsed, err)
		}
		if asOf != nil {
			a := asOf.UTC()
			u.AsOf = &a
		}
		seen++
	}
	if err := rows.Err(); err != nil {
		return fmt.Errorf("quota: read usage: %w", err)
	}
	if seen != n {
		return fmt.Errorf("quota: read usage: %d rows for %d subjects", seen, n)
	}
	items := make([]kindItem, n)
	for j, i := range idx {
		u := &out[i]
		items[j] = kindItem{customer: customers[j], meter: meters[j], period: u.Period, prev: u.Previous, used: &u.Used, prevUsed: &u.PreviousUsed}
	}
	if err := kindUsed(ctx, db, q.Now, items); err != nil {
		return err
	}
	return readLimits(ctx, db, qLimitsInForce, customers, meters, q.Now, out, idx)
}

func scopeUsage(ctx context.Context, db DBTX, q UsageQuery, byCust bool, out []SubjectUsage, idx []int) error {
	if len(idx) == 0 {
		return nil
	}
	p, err := scopeCalendar.PeriodAt(q.Now)
	if err != nil {
		return err
	}
	prev, err := scopeCalendar.Previous(p)
	if err != nil {
		prev = p
	}
	n := len(idx)
	scopes, meters := make([]string, n), make([]string, n)
	for j, i := range idx {
		scopes[j], meters[j] = out[i].Scope, out[i].Meter
		out[i].Period, out[i].Previous = p, prev
	}
	sql := qScopeUsageByTopic
	if byCust {
		sql = qScopeUsageByCustomer
	}
	rows, err := db.Query(ctx, sql, pgx.NamedArgs{"scopes": scopes, "meters": meters, "start": p.Start.UTC(),
		"end": p.End.UTC(), "prev_start": prev.Start.UTC(), "now": q.Now, "topic": q.IngestTopic})
	if err != nil {
		return fmt.Errorf("quota: read scope usage: %w", err)
	}
	seen := 0
	for rows.Next() {
		var k int64
		var used, prevUsed string
		var asOf *time.Time
		if err := rows.Scan(&k, &used, &prevUsed, &asOf); err != nil {
			rows.Close()
			return fmt.Errorf("quota: read scope usage: %w", err)
		}
		if k < 1 || int(k) > n {
			rows.Close()
			return fmt.Errorf("quota: read scope usage: row %d of %d", k, n)
		}
		u := &out[idx[k-1]]
		if u.Used, err = decimal.NewFromString(used); err != nil {
			rows.Close()
			return fmt.Errorf("quota: read scope usage: %q: %w", used, err)
		}
		if u.PreviousUsed, err = decimal.NewFromString(prevUsed); err != nil {
			rows.Close()
			return fmt.Errorf("quota: read scope usage: %q: %w", prevUsed, err)
		}
		if asOf != nil {
			a := asOf.UTC()
			u.AsOf = &a
		}
		seen++
	}
	if err := rows.Err(); err != nil {
		return fmt.Errorf("quota: read scope usage: %w", err)
	}
	if seen != n {
		return fmt.Errorf("quota: read scope usage: %d rows for %d subjects", seen, n)
	}
	return readLimits(ctx, db, qScopeLimitsInForce, scopes, meters, q.Now, out, idx)
}

// readLimits fills the limit in force of out[idx[k]] from q's rows.
func readLimits(ctx context.Context, db DBTX, q string, keys, meters []string, now time.Time, out []SubjectUsage, idx []int) error {
	rows, err := db.Query(ctx, q, keys, meters, now)
	if err != nil {
		return fmt.Errorf("quota: read limits in force: %w", err)
	}
	defer rows.Close()
	for rows.Next() {
		var k, version int64
		var limit *string
		if err := rows.Scan(&k, &version, &limit); err != nil {
			return fmt.Errorf("quota: read limits in force: %w", err)
		}
		if k < 1 || int(k) > len(idx) {
			return fmt.Errorf("quota: read limits in force: row %d of %d", k, len(idx))
		}
		u := &out[idx[k-1]]
		u.RuleVersion = version
		if limit != nil {
			l, err := decimal.NewFromString(*limit)
			if err != nil {
				return fmt.Errorf("quota: read limits in force: %q: %w", *limit, err)
			}
			u.Limit = &l
		}
	}
	if err := rows.Err(); err != nil {
		return fmt.Errorf("quota: read limits in force: %w", err)
	}
	return nil
}

// Fence is the enforcer's lease while it leads: work that must be done
// by the leader only (alert evaluation) checks it in its own transaction
// with CheckFence, so a deposed leader's write fails.
type Fence struct {
	Name   string
	Holder string
	Epoch  int64
}

// CheckFence holds the lease row (shared) for the rest of tx, or returns
// ErrNotLeader when f is no longer the live lease.
func CheckFence(ctx context.Context, tx pgx.Tx, f Fence) error {
	var one int
	err := tx.QueryRow(ctx, qFence, f.Name, f.Holder, f.Epoch).Scan(&one)
	if errors.Is(err, pgx.ErrNoRows) {
		return ErrNotLeader
	}
	if err != nil {
		return fmt.Errorf("quota: check the lease: %w", err)
	}
	return nil
}

// Leading returns the enforcer's lease while it leads (false otherwise).
// Work that shares the enforcer's leadership runs only while it is true,
// and fences its writes with CheckFence.
func (e *Enforcer) Leading() (Fence, bool) {
	f := e.leading.Load()
	if f == nil {
		return Fence{}, false
	}
	return *f, true
}
