package api

import (
	"context"
	"encoding/json"
	"fmt"
	"math"
	"net/http"
	"slices"
	"sort"
	"strconv"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgtype"

	"github.com/tally-ledger/tally/internal/ids"
	"github.com/tally-ledger/tally/ledger"
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

// usageView answers ?meter=: one meter; its "series" member follows,
// written from meterUsage.series.
type usageView struct {
	Customer   string     `json:"customer"`
	Meter      string     `json:"meter"`
	Period     periodView `json:"period"`
	GroupBy    string     `json:"group_by"`
	Total      string     `json:"total"`
	AsOf       *time.Time `json:"as_of"`
	LagSeconds *float64   `json:"lag_seconds"`
	// Kind, Gauge and Unique: a gauge's or unique meter's aggregates
	// (docs/design.md §16); absent for counters.
	Kind   string             `json:"kind,omitempty"`
	Gauge  *ledger.GaugeUsage `json:"gauge,omitempty"`
	Unique *uniqueView        `json:"unique,omitempty"`
}

// usageAllView answers without ?meter=: every meter with usage in the
// period; its "items" member follows, written from meterUsage.json.
type usageAllView struct {
	Customer   string     `json:"customer"`
	Period     periodView `json:"period"`
	GroupBy    string     `json:"group_by"`
	AsOf       *time.Time `json:"as_of"`
	LagSeconds *float64   `json:"lag_seconds"`
}

// meterUsage is one meter's answer, encoded once, when read from
// Postgres: a cached answer is served many times, and encoding/json
// re-scans a json.RawMessage each time it writes one (a tenth of the
// API's CPU on cache hits).
type meterUsage struct {
	total string
	// json is the item of an all-meters answer,
	// {"meter":…,"total":…,"series":[…]}; series is its series.
	json, series []byte
}

// newMeterUsage encodes one meter's answer.
func newMeterUsage(meter, total string, series []bucketView) (meterUsage, error) {
	raw, err := json.Marshal(series)
	if err != nil {
		return meterUsage{}, err
	}
	m, _ := json.Marshal(meter) // a string always encodes
	t, _ := json.Marshal(total)
	item := slices.Concat([]byte(`{"meter":`), m, []byte(`,"total":`), t, []byte(`,"series":`), raw, []byte(`}`))
	end := len(item) - 1
	return meterUsage{total: total, json: item, series: item[end-len(raw) : end]}, nil
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
	if oneMeter && !ids.Valid(meter) {
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

	ans, err := a.answerUsage(ctx, customer, ref, meter, groupBy == "hour")
	if err != nil {
		return err
	}
	key, items, pv, asOfTime, lag := ans.key, ans.data.items, ans.period, ans.asOf, ans.lag

	if key.meter != "" {
		v := usageView{Customer: customer, Meter: meter, Period: pv, GroupBy: groupBy, Total: "0",
			AsOf: asOfTime, LagSeconds: lag}
		series := []byte("[]")
		if len(items) == 1 {
			v.Total, series = items[0].total, items[0].series
		}
		for _, k := range kindItems(ans, a.now()) {
			v.Total, v.Kind, v.Gauge, v.Unique, series = k.Total, k.Kind, k.Gauge, k.Unique, k.series
		}
		writeJSONWith(w, http.StatusOK, v, "series", series)
		return nil
	}
	for _, k := range kindItems(ans, a.now()) {
		raw, err := json.Marshal(k)
		if err != nil {
			return err
		}
		// The series member follows, as in the counters' items.
		raw = append(append(raw[:len(raw)-1], `,"series":`...), k.series...)
		items = append(items, meterUsage{json: append(raw, '}')})
	}
	list := make([][]byte, 0, 2*len(items)+1)
	list = append(list, []byte("["))
	for i, it := range items {
		if i > 0 {
			list = append(list, []byte(","))
		}
		list = append(list, it.json)
	}
	list = append(list, []byte("]"))
	writeJSONWith(w, http.StatusOK, usageAllView{Customer: customer, Period: pv, GroupBy: groupBy, AsOf: asOfTime, LagSeconds: lag}, "items", list...)
	return nil
}

// usageAnswer is a usage answer before encoding: what getUsage and Usage
// (the console's) serve.
type usageAnswer struct {
	key    usageKey
	data   usageData
	period periodView
	p      periods.Period
	asOf   *time.Time
	lag    *float64 // seconds, to the millisecond
}

// answerUsage reads a usage answer from the cache or Postgres. customer
// and meter ("" for all) are checked ids; ref a period reference.
func (a *API) answerUsage(ctx context.Context, customer, ref, meter string, byHour bool) (usageAnswer, error) {
	now := a.now()
	p, err := a.resolvePeriod(ctx, customer, ref, now)
	if err != nil {
		return usageAnswer{}, err
	}
	key := usageKey{customer: customer, period: p.Start.UnixMicro(), meter: meter, byHour: byHour}
	d, ok := a.watch.get(key, now)
	if ok {
		a.metrics.usageHits.Inc()
	} else {
		a.metrics.usageMisses.Inc()
		ticket := a.watch.ticket(customer)
		if d, err = a.readUsage(ctx, key, p); err != nil {
			return usageAnswer{}, err
		}
		a.watch.put(ticket, key, d, now)
	}
	ans := usageAnswer{key: key, data: d, p: p}
	if d.asOf.Valid {
		t := d.asOf.Time.UTC()
		l := math.Round(max(now.Sub(t).Seconds(), 0)*1000) / 1000
		ans.asOf, ans.lag = &t, &l
	}
	graceEnds := periods.GraceEnds(p, a.grace).UTC()
	ans.period = periodView{Name: p.Name, Start: p.Start.UTC(), End: p.End.UTC(), State: periods.StateOf(p, now, a.grace, d.closed), GraceEnds: &graceEnds}
	return ans, nil
}

// kindItem is a gauge's or unique meter's item of a usage answer.
type kindItem struct {
	Meter  string             `json:"meter"`
	Total  string             `json:"total"`
	Kind   string             `json:"kind"`
	Gauge  *ledger.GaugeUsage `json:"gauge,omitempty"`
	Unique *uniqueView        `json:"unique,omitempty"`
	series []byte
}

// uniqueView is a unique meter's distinct members.
type uniqueView struct {
	Count int64 `json:"count"`
}

// kindItems answers the gauges and unique meters of a usage answer at now:
// a gauge's total is its unit_seconds, a unique meter's its distinct
// members; a unique meter's series counts distinct members per day.
func kindItems(ans usageAnswer, now time.Time) []kindItem {
	var out []kindItem
	for _, g := range ans.data.kinds.Gauges(now) {
		g := g
		out = append(out, kindItem{Meter: g.Meter, Total: g.UnitSeconds.String(), Kind: string(ledger.Gauge), Gauge: &g, series: []byte("[]")})
	}
	for _, u := range ans.data.kinds.Uniques {
		days := localDays(ans.p)
		series := make([]bucketView, len(u.Days))
		for i, d := range u.Days {
			end := ans.p.End
			// The bucket day ends where the next local day starts (ledger.DayBucket).
			if j := sort.Search(len(days), func(j int) bool { return days[j].After(d.Start) }); j < len(days) {
				end = days[j]
			}
			series[i] = bucketView{Start: rfc3339(d.Start), End: rfc3339(end), Quantity: strconv.FormatInt(d.Count, 10)}
		}
		raw, _ := json.Marshal(series)
		out = append(out, kindItem{Meter: u.Meter, Total: strconv.FormatInt(u.Count, 10), Kind: string(ledger.Unique),
			Unique: &uniqueView{Count: u.Count}, series: raw})
	}
	return out
}

// usageKey identifies a usage answer; meter "" is every meter.
type usageKey struct {
	customer string
	period   int64 // start, unix microseconds
	meter    string
	byHour   bool
}

// usageData is what Postgres said of a usageKey. It is cached and shared:
// never modified after readUsage returns it.
type usageData struct {
	closed bool
	asOf   pgtype.Timestamptz
	// partition is the customer's ingest partition, whose position as_of
	// is; -1 for a customer ingest has not seen (the oldest position).
	partition int32
	items     []meterUsage
	// kinds: the period's gauges and unique meters (docs/design.md §16).
	kinds ledger.KindsUsage
}

// readUsage reads a usage answer: its counters with one statement (one
// snapshot), in one round trip with its gauges and unique meters.
func (a *API) readUsage(ctx context.Context, key usageKey, p periods.Period) (usageData, error) {
	var meterArg *string
	if key.meter != "" {
		meterArg = &key.meter
	}
	query := qUsageByDay
	var days []time.Time // by day: the starts of the period's local days
	if key.byHour {
		query = qUsageByHour
	} else {
		days = localDays(p)
	}
	var d usageData
	var part pgtype.Int4
	var m, total pgtype.Text
	var keys []time.Time // hours, or dates (midnight UTC)
	var qtys []string
	// One round trip: the counters' statement and the gauge and unique
	// reads share the batch.
	b := &pgx.Batch{}
	b.Queue(query, key.customer, p.Start.UTC(), meterArg, a.topic).Query(func(rows pgx.Rows) error {
		_, err := pgx.ForEachRow(rows, []any{&d.closed, &d.asOf, &part, &m, &keys, &qtys, &total}, func() error {
			if !m.Valid { // no usage: the header alone
				return nil
			}
			if len(keys) != len(qtys) {
				return fmt.Errorf("meter %q: %d buckets, %d quantities", m.String, len(keys), len(qtys))
			}
			series := make([]bucketView, len(keys))
			for j, k := range keys {
				var start, end time.Time
				if days == nil {
					start, end = k, k.Add(time.Hour)
				} else {
					i := dayIndex(days, k)
					if i < 0 {
						return fmt.Errorf("daily rollup of %s outside period %s", k.Format(time.DateOnly), p.Name)
					}
					start, end = days[i], p.End
					if i+1 < len(days) {
						end = days[i+1]
					}
				}
				// Clamp to the period: boundaries need not be whole local hours.
				start, end = maxTime(start, p.Start), minTime(end, p.End)
				series[j] = bucketView{Start: rfc3339(start), End: rfc3339(end), Quantity: qtys[j]}
			}
			it, err := newMeterUsage(m.String, total.String, series)
			d.items = append(d.items, it)
			return err
		})
		return err
	})
	kinds := ledger.QueueKinds(b, key.customer, key.meter, p, a.now())
	if err := a.pool.SendBatch(ctx, b).Close(); err != nil {
		return usageData{}, fmt.Errorf("usage: %w", err)
	}
	d.partition = -1
	if part.Valid {
		d.partition = part.Int32
	}
	var err error
	if d.kinds, err = kinds.Finish(ctx, a.pool); err != nil {
		return usageData{}, fmt.Errorf("usage: %w", err)
	}
	return d, nil
}

// forgetUsage drops the cached usage answers of customer ("": of every
// customer) after a write through this process (adjustment, close,
// calendar change, dead-letter replay), so the writer reads its write at
// once rather than when the notification arrives.
func (a *API) forgetUsage(customer string) {
	if customer == "" {
		a.watch.forgetAll()
		return
	}
	a.watch.forget(customer)
}

// localDays returns the starts of the local calendar days of p in its
// zone: p.Start, then the start of every later local date before p.End
// (its midnight, or the instant the clocks jump past a midnight they skip),
// as the daily rollups are kept by local date.
func localDays(p periods.Period) []time.Time {
	loc := p.Start.Location()
	out := []time.Time{p.Start}
	y, m, d := p.Start.In(loc).Date()
	for i := 1; ; i++ {
		t := periods.DayStart(loc, y, m, d+i)
		if !t.Before(p.End) {
			return out
		}
		if t.After(out[len(out)-1]) { // a zone that skipped midnight: no empty day
			out = append(out, t)
		}
	}
}

// dayIndex is the index of the day in days (local day starts, ascending)
// whose local date is date d (a date column: midnight UTC), or -1.
func dayIndex(days []time.Time, d time.Time) int {
	want := civil(d.UTC())
	i := sort.Search(len(days), func(i int) bool { return civil(days[i]) >= want })
	if i < len(days) && civil(days[i]) == want {
		return i
	}
	return -1
}

// civil is t's date in its own location as yyyymmdd.
func civil(t time.Time) int {
	y, m, d := t.Date()
	return y*10000 + int(m)*100 + d
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
	if c, ok := a.schedules.Get(customer); ok {
		p, err := c.s.Resolve(ref, now)
		if err == nil && !p.Start.After(now) {
			return p, nil
		}
	}
	c, err := a.periodStore().Customer(ctx, a.pool, customer)
	if err != nil {
		return periods.Period{}, err
	}
	a.schedules.Put(customer, cachedSchedule{c.Schedule})
	return c.Schedule.Resolve(ref, now)
}
