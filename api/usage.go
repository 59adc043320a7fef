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

	var meterArg *string
	if oneMeter {
		meterArg = &meter
	}
	query := qUsageByHour
	var days []time.Time // by day: the starts of the period's local days
	if groupBy == "day" {
		query, days = qUsageByDay, localDays(p)
	}
	rows, err := a.pool.Query(ctx, query, customer, p.Start.UTC(), meterArg, a.topic)
	if err != nil {
		return fmt.Errorf("usage: %w", err)
	}
	var closed bool
	var asOf *time.Time
	var items []meterUsage
	var m, qty *string
	var key *time.Time
	day := 0 // index into days of the last day row
	_, err = pgx.ForEachRow(rows, []any{&closed, &asOf, &m, &key, &qty}, func() error {
		switch {
		case m == nil: // no usage: the header alone
			return nil
		case key == nil: // the meter's total comes first
			items = append(items, meterUsage{Meter: *m, Total: *qty, Series: []bucketView{}})
			return nil
		case len(items) == 0 || items[len(items)-1].Meter != *m:
			return fmt.Errorf("usage: series row of meter %q before its total", *m)
		}
		var start, end time.Time
		if days == nil {
			start, end = *key, key.Add(time.Hour)
		} else {
			// Rows come in date order: find the day whose local date it is.
			if len(items[len(items)-1].Series) == 0 {
				day = 0
			}
			for day < len(days) && !sameDate(days[day], *key) {
				day++
			}
			if day == len(days) {
				return fmt.Errorf("usage: daily rollup of %s outside period %s", key.Format(time.DateOnly), p.Name)
			}
			start, end = days[day], p.End
			if day+1 < len(days) {
				end = days[day+1]
			}
		}
		// Clamp to the period: boundaries need not be whole local hours.
		start, end = maxTime(start, p.Start), minTime(end, p.End)
		it := &items[len(items)-1]
		it.Series = append(it.Series, bucketView{Start: rfc3339(start), End: rfc3339(end), Quantity: *qty})
		return nil
	})
	if err != nil {
		return fmt.Errorf("usage: %w", err)
	}
	var lag *float64
	if asOf != nil {
		t := asOf.UTC()
		l := math.Round(max(now.Sub(t).Seconds(), 0)*1000) / 1000
		asOf, lag = &t, &l
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

// sameDate reports whether local day start t falls on date d (a date
// column: midnight UTC of that date).
func sameDate(t, d time.Time) bool {
	y, m, dd := t.Date()
	y2, m2, d2 := d.UTC().Date()
	return y == y2 && m == m2 && dd == d2
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
