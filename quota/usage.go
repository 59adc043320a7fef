package quota

import (
	"context"
	"encoding/json"
	"fmt"
	"time"

	"github.com/shopspring/decimal"

	"github.com/tally-ledger/tally/ledger"
	"github.com/tally-ledger/tally/periods"
)

// DefaultIngestTopic is the meter-batch topic whose ingest position gives as_of.
const DefaultIngestTopic = "tally.meter-batches"

// DefaultRateWindow is how far back the recent rate of usage looks.
const DefaultRateWindow = 5 * time.Minute

// ruleUsage is one current rule with its period's usage and freshness.
type ruleUsage struct {
	rule   Rule
	period periods.Period
	used   decimal.Decimal
	// prev is the period before; prevUsed its usage (settling overage
	// across a period boundary).
	prev     periods.Period
	prevUsed decimal.Decimal
	asOf     *time.Time
	// fallback is the rate over the rollup buckets since the start of the
	// hour bucket containing now - window, up to asOf: coarse (buckets are
	// hours), used until the enforcer has samples of its own.
	fallback *rate
}

// snapshotQuery says what to read.
type snapshotQuery struct {
	now         time.Time
	customer    *string // nil: every customer
	ingestTopic string
	window      time.Duration
	byCustomer  bool // the ingest_customers table exists
}

// loadSnapshot reads every current rule and its usage in two round trips,
// independent of the amount of usage: the rules with their calendars, then
// one set-based query over rollups and ingest positions. An error is
// returned whole: a partial read is never treated as zero usage.
func loadSnapshot(ctx context.Context, db DBTX, q snapshotQuery) ([]ruleUsage, error) {
	out, err := loadCustomerSnapshot(ctx, db, q)
	if err != nil || q.customer != nil {
		return out, err
	}
	scoped, err := loadScopeSnapshot(ctx, db, q)
	if err != nil {
		return nil, err
	}
	return append(out, scoped...), nil
}

func loadCustomerSnapshot(ctx context.Context, db DBTX, q snapshotQuery) ([]ruleUsage, error) {
	rows, err := db.Query(ctx, qEffectiveRules, q.now, q.customer)
	if err != nil {
		return nil, fmt.Errorf("quota: read rules: %w", err)
	}
	var out []ruleUsage
	schedules := map[string]periods.Schedule{}
	for rows.Next() {
		var raw []byte
		r, err := scanRule(rows, &raw)
		if err != nil {
			rows.Close()
			return nil, fmt.Errorf("quota: read rules: %w", err)
		}
		if _, ok := schedules[r.Customer]; !ok {
			sch, err := customerSchedule(r.Customer, raw)
			if err != nil {
				rows.Close()
				return nil, err
			}
			schedules[r.Customer] = sch
		}
		out = append(out, ruleUsage{rule: r})
	}
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("quota: read rules: %w", err)
	}
	if len(out) == 0 {
		return nil, nil
	}
	n := len(out)
	customers, meters := make([]string, n), make([]string, n)
	starts, prevStarts, recentFrom := make([]time.Time, n), make([]time.Time, n), make([]time.Time, n)
	for i := range out {
		u := &out[i]
		sch := schedules[u.rule.Customer]
		p, err := sch.PeriodAt(q.now)
		if err != nil {
			return nil, fmt.Errorf("quota: customer %q: period at %s: %w", u.rule.Customer, q.now, err)
		}
		prev, err := sch.Previous(p)
		if err != nil {
			prev = p
		}
		from, err := ledger.Bucket(sch, q.now.Add(-q.window))
		if err != nil {
			return nil, fmt.Errorf("quota: customer %q: %w", u.rule.Customer, err)
		}
		u.period, u.prev = p, prev
		customers[i], meters[i] = u.rule.Customer, u.rule.Meter
		starts[i], prevStarts[i], recentFrom[i] = p.Start.UTC(), prev.Start.UTC(), from
	}
	sql := qUsageByTopic
	if q.byCustomer {
		sql = qUsageByCustomer
	}
	rows, err = db.Query(ctx, sql, customers, meters, starts, prevStarts, recentFrom, q.ingestTopic)
	if err != nil {
		return nil, fmt.Errorf("quota: read usage: %w", err)
	}
	defer rows.Close()
	seen := 0
	for rows.Next() {
		var i int64
		var used, recent, prevUsed string
		var asOf *time.Time
		if err := rows.Scan(&i, &used, &recent, &prevUsed, &asOf); err != nil {
			return nil, fmt.Errorf("quota: read usage: %w", err)
		}
		if i < 1 || int(i) > n {
			return nil, fmt.Errorf("quota: read usage: row %d of %d", i, n)
		}
		u := &out[i-1]
		if u.used, err = decimal.NewFromString(used); err != nil {
			return nil, fmt.Errorf("quota: read usage: %q: %w", used, err)
		}
		if u.prevUsed, err = decimal.NewFromString(prevUsed); err != nil {
			return nil, fmt.Errorf("quota: read usage: %q: %w", prevUsed, err)
		}
		rq, err := decimal.NewFromString(recent)
		if err != nil {
			return nil, fmt.Errorf("quota: read usage: %q: %w", recent, err)
		}
		if asOf != nil {
			a := asOf.UTC()
			u.asOf = &a
			if ms := a.Sub(recentFrom[i-1]).Milliseconds(); ms > 0 && rq.IsPositive() {
				u.fallback = &rate{Quantity: rq, Millis: ms}
			}
		}
		seen++
	}
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("quota: read usage: %w", err)
	}
	if seen != n {
		return nil, fmt.Errorf("quota: read usage: %d rows for %d rules", seen, n)
	}
	items := make([]kindItem, n)
	for i := range out {
		u := &out[i]
		items[i] = kindItem{customer: u.rule.Customer, meter: u.rule.Meter, period: u.period, prev: u.prev,
			used: &u.used, prevUsed: &u.prevUsed, fallback: &u.fallback}
	}
	rows.Close()
	if err := kindUsed(ctx, db, q.now, items); err != nil {
		return nil, err
	}
	return out, nil
}

// customerSchedule is a customer's billing calendar as customers.schedule
// stores it; nil (a customer without usage yet) is the default calendar.
func customerSchedule(customer string, raw []byte) (periods.Schedule, error) {
	sch := periods.NewSchedule(periods.DefaultCalendar())
	if raw != nil {
		if err := json.Unmarshal(raw, &sch); err != nil {
			return periods.Schedule{}, fmt.Errorf("quota: customer %q: stored calendar: %w", customer, err)
		}
	}
	return sch, nil
}
