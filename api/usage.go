package api

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"net/http"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/tally-ledger/tally/periods"
)

type periodView struct {
	Name  string        `json:"name"`
	Start time.Time     `json:"start"`
	End   time.Time     `json:"end"`
	State periods.State `json:"state,omitempty"`
	// GraceEnds is End plus the deployment's grace: the close is due then.
	GraceEnds *time.Time `json:"grace_ends,omitempty"`
}

// bucketView is one series entry. Its times are preformatted: a month by
// hour has hundreds, and time.Time's MarshalJSON is the costliest part of
// encoding them.
type bucketView struct {
	Start    string `json:"start"`
	End      string `json:"end"`
	Quantity string `json:"quantity"`
}

// rfc3339 formats t in UTC. Series boundaries are whole seconds.
func rfc3339(t time.Time) string {
	var b [len(time.RFC3339Nano)]byte
	return string(t.UTC().AppendFormat(b[:0], time.RFC3339Nano))
}

// usageView answers ?meter=: one meter.
type usageView struct {
	Customer   string       `json:"customer"`
	Meter      string       `json:"meter"`
	Period     periodView   `json:"period"`
	GroupBy    string       `json:"group_by"`
	Total      string       `json:"total"`
	AsOf       *time.Time   `json:"as_of"`
	LagSeconds *float64     `json:"lag_seconds"`
	Series     []bucketView `json:"series"`
}

// usageAllView answers without ?meter=: every meter with usage in the period.
type usageAllView struct {
	Customer   string       `json:"customer"`
	Period     periodView   `json:"period"`
	GroupBy    string       `json:"group_by"`
	AsOf       *time.Time   `json:"as_of"`
	LagSeconds *float64     `json:"lag_seconds"`
	Items      []meterUsage `json:"items"`
}

type meterUsage struct {
	Meter  string       `json:"meter"`
	Total  string       `json:"total"`
	Series []bucketView `json:"series"`
}

func (a *API) getUsage(w http.ResponseWriter, r *http.Request) error {
	ctx := r.Context()
	customer, err := readableCustomer(r)
	if err != nil {
		return err
	}
	q, err := queryParams(r, "meter", "period", "group_by")
	if err != nil {
		return err
	}
	var errs []FieldError
	meter, oneMeter := q["meter"]
	if oneMeter && !validID(meter) {
		errs = append(errs, FieldError{Field: "meter", Detail: quote(meter) + " is not 1-128 characters of A-Z a-z 0-9 . _ : -"})
	}
	ref := q["period"]
	if ref == "" {
		ref = "current"
	}
	groupBy := q["group_by"]
	switch groupBy {
	case "":
		groupBy = "day"
	case "day", "hour":
	default:
		errs = append(errs, FieldError{Field: "group_by", Detail: quote(groupBy) + " is not one of hour, day"})
	}
	if len(errs) > 0 {
		return invalid(errs...)
	}

	now := a.now()
	p, err := a.resolvePeriod(ctx, customer, ref, now)
	if err != nil {
		return err
	}

	// One round trip: is the period closed, and its usage.
	var closed bool
	var meterArg *string
	if oneMeter {
		meterArg = &meter
	}
	var days []time.Time
	if groupBy == "day" {
		days = localDays(p)
	}
	var items []meterUsage
	b := &pgx.Batch{}
	b.Queue(qPeriodClosed, customer, p.Start.UTC()).QueryRow(func(row pgx.Row) error { return row.Scan(&closed) })
	scan := func(rows pgx.Rows) error {
		var m, qty string
		var hour *time.Time
		var day *int32
		dest := []any{&m, &hour, &qty}
		if days != nil {
			dest[1] = &day
		}
		_, err := pgx.ForEachRow(rows, dest, func() error {
			if hour == nil && day == nil { // the meter's total comes first
				items = append(items, meterUsage{Meter: m, Total: qty, Series: []bucketView{}})
				return nil
			}
			if len(items) == 0 || items[len(items)-1].Meter != m {
				return fmt.Errorf("usage: series row of meter %q before its total", m)
			}
			var start, end time.Time
			if hour != nil {
				start, end = *hour, hour.Add(time.Hour)
			} else {
				// Index i is [days[i-1], days[i]); the last runs to the
				// period's end (qUsageByDay folds index 0 into 1).
				i := int(*day)
				if i < 1 || i > len(days) {
					return fmt.Errorf("usage: rollup outside period %s (day index %d)", p.Name, i)
				}
				start, end = days[i-1], p.End
				if i < len(days) {
					end = days[i]
				}
			}
			// Clamp to the period: boundaries need not be whole local hours.
			start, end = maxTime(start, p.Start), minTime(end, p.End)
			it := &items[len(items)-1]
			it.Series = append(it.Series, bucketView{Start: rfc3339(start), End: rfc3339(end), Quantity: qty})
			return nil
		})
		return err
	}
	if days != nil {
		b.Queue(qUsageByDay, customer, p.Start.UTC(), meterArg, days).Query(scan)
	} else {
		b.Queue(qUsageByHour, customer, p.Start.UTC(), meterArg).Query(scan)
	}
	if err := a.pool.SendBatch(ctx, b).Close(); err != nil {
		return fmt.Errorf("usage: %w", err)
	}
	asOf, lag, err := a.asOf(ctx, customer, now)
	if err != nil {
		return err
	}
	graceEnds := p.End.Add(a.grace).UTC()
	pv := periodView{Name: p.Name, Start: p.Start.UTC(), End: p.End.UTC(), State: periods.StateOf(p, now, a.grace, closed), GraceEnds: &graceEnds}

	if oneMeter {
		v := usageView{Customer: customer, Meter: meter, Period: pv, GroupBy: groupBy, Total: "0",
			AsOf: asOf, LagSeconds: lag, Series: []bucketView{}}
		if len(items) == 1 {
			v.Total, v.Series = items[0].Total, items[0].Series
		}
		writeJSON(w, http.StatusOK, v)
		return nil
	}
	if items == nil {
		items = []meterUsage{}
	}
	writeJSON(w, http.StatusOK, usageAllView{Customer: customer, Period: pv, GroupBy: groupBy, AsOf: asOf, LagSeconds: lag, Items: items})
	return nil
}

// localDays returns the starts of the local calendar days of p in its
// zone: p.Start, then every local midnight before p.End.
func localDays(p periods.Period) []time.Time {
	loc := p.Start.Location()
	out := []time.Time{p.Start}
	y, m, d := p.Start.In(loc).Date()
	for i := 1; ; i++ {
		t := time.Date(y, m, d+i, 0, 0, 0, 0, loc)
		if !t.Before(p.End) {
			return out
		}
		if t.After(out[len(out)-1]) { // a zone that skipped midnight: no empty day
			out = append(out, t)
		}
	}
}

func maxTime(a, b time.Time) time.Time {
	if a.After(b) {
		return a
	}
	return b
}

func minTime(a, b time.Time) time.Time {
	if a.Before(b) {
		return a
	}
	return b
}

// asOf returns as_of and lag_seconds, both nil when unknown.
func (a *API) asOf(ctx context.Context, customer string, now time.Time) (*time.Time, *float64, error) {
	t, ok, err := a.freshness.AsOf(ctx, customer)
	if err != nil {
		return nil, nil, err
	}
	if !ok {
		return nil, nil, nil
	}
	t = t.UTC()
	lag := math.Round(max(now.Sub(t).Seconds(), 0)*1000) / 1000
	return &t, &lag, nil
}

type cachedSchedule struct {
	s periods.Schedule
}

// resolvePeriod resolves a period reference with the customer's calendar,
// from the schedule cache when it can: a cached schedule resolves every
// period that has started exactly as the stored one (see ScheduleCacheTTL),
// so only a period that starts in the future is resolved from the database.
func (a *API) resolvePeriod(ctx context.Context, customer, ref string, now time.Time) (periods.Period, error) {
	if c, ok := a.schedules.get(customer); ok {
		p, err := c.s.Resolve(ref, now)
		if err == nil && !p.Start.After(now) {
			return p, nil
		}
	}
	s, _, err := a.loadSchedule(ctx, a.pool, customer, false)
	if err != nil {
		return periods.Period{}, err
	}
	a.schedules.put(customer, cachedSchedule{s})
	return s.Resolve(ref, now)
}

// loadSchedule reads a customer's calendar history; forUpdate locks the row
// (in a transaction) so calendar changes serialise.
func (a *API) loadSchedule(ctx context.Context, db DBTX, customer string, forUpdate bool) (periods.Schedule, time.Time, error) {
	query := qSelectSchedule
	if forUpdate {
		query = qSelectScheduleForUpdate
	}
	var raw []byte
	var created time.Time
	err := db.QueryRow(ctx, query, customer).Scan(&raw, &created)
	if errors.Is(err, pgx.ErrNoRows) {
		return nil, time.Time{}, customerNotFound(customer)
	}
	if err != nil {
		return nil, time.Time{}, fmt.Errorf("customer %q: %w", customer, err)
	}
	var s periods.Schedule
	if err := json.Unmarshal(raw, &s); err != nil {
		return nil, time.Time{}, fmt.Errorf("customer %q: stored calendar: %w", customer, err)
	}
	return s, created, nil
}
