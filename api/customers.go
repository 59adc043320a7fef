package api

import (
	"fmt"
	"net/http"
	"time"

	"github.com/go-chi/chi/v5"

	"github.com/tally-ledger/tally/periods"
)

// customerView is a customer's billing calendar: the one in force, a
// pending change, and the whole history.
type customerView struct {
	Customer      string        `json:"customer"`
	CreatedAt     time.Time     `json:"created_at"`
	Calendar      calendarView  `json:"calendar"`
	CurrentPeriod periodView    `json:"current_period"`
	Pending       *versionView  `json:"pending"`
	History       []versionView `json:"history"`
}

type calendarView struct {
	Cadence    periods.Cadence `json:"cadence"`
	AnchorDay  int             `json:"anchor_day"`
	AnchorTime string          `json:"anchor_time"`
	Zone       string          `json:"zone"`
}

// versionView is one calendar of the history; effective_from is null for
// the first one, which applies from the beginning.
type versionView struct {
	EffectiveFrom *time.Time   `json:"effective_from"`
	Calendar      calendarView `json:"calendar"`
}

// calendarBody is the PUT body. anchor_day defaults to 1 (the 1st, or
// Monday) for monthly and weekly calendars and 0 for daily ones;
// anchor_time to "00:00"; zone to "UTC".
type calendarBody struct {
	Cadence    string `json:"cadence"`
	AnchorDay  *int   `json:"anchor_day"`
	AnchorTime string `json:"anchor_time"`
	Zone       string `json:"zone"`
}

func (b calendarBody) calendar() periods.Calendar {
	c := periods.Calendar{Cadence: periods.Cadence(b.Cadence), AnchorTime: b.AnchorTime, Zone: b.Zone}
	switch {
	case b.AnchorDay != nil:
		c.AnchorDay = *b.AnchorDay
	case c.Cadence == periods.Monthly || c.Cadence == periods.Weekly:
		c.AnchorDay = 1
	}
	if c.AnchorTime == "" {
		c.AnchorTime = "00:00"
	}
	if c.Zone == "" {
		c.Zone = "UTC"
	}
	return c
}

func viewCalendar(c periods.Calendar) calendarView {
	v := calendarView{Cadence: c.Cadence, AnchorDay: c.AnchorDay, AnchorTime: c.AnchorTime, Zone: c.Zone}
	if v.AnchorTime == "" {
		v.AnchorTime = "00:00"
	}
	if v.Zone == "" {
		v.Zone = "UTC"
	}
	return v
}

func (a *API) viewCustomer(customer string, created time.Time, s periods.Schedule, now time.Time) (customerView, error) {
	v := customerView{Customer: customer, CreatedAt: created.UTC(), History: make([]versionView, 0, len(s))}
	for i, ver := range s {
		vv := versionView{Calendar: viewCalendar(ver.Calendar)}
		if i > 0 {
			t := ver.EffectiveFrom.UTC()
			vv.EffectiveFrom = &t
		}
		v.History = append(v.History, vv)
		if !ver.EffectiveFrom.After(now) {
			v.Calendar = vv.Calendar
		} else if v.Pending == nil {
			v.Pending = &v.History[len(v.History)-1]
		}
	}
	if v.Pending != nil {
		p := *v.Pending // not an alias into History
		v.Pending = &p
	}
	p, err := s.PeriodAt(now)
	if err != nil {
		return v, fmt.Errorf("customer %q: current period: %w", customer, err)
	}
	v.CurrentPeriod = periodView{Name: p.Name, Start: p.Start.UTC(), End: p.End.UTC()}
	return v, nil
}

func (a *API) getCustomer(w http.ResponseWriter, r *http.Request) error {
	customer, err := readableCustomer(r)
	if err != nil {
		return err
	}
	if _, err := queryParams(r); err != nil {
		return err
	}
	c, err := a.periodStore().Customer(r.Context(), a.pool, customer)
	if err != nil {
		return err
	}
	v, err := a.viewCustomer(customer, c.CreatedAt, c.Schedule, a.now())
	if err != nil {
		return err
	}
	writeJSON(w, http.StatusOK, v)
	return nil
}

// putCustomer sets a customer's billing calendar (periods.Store.SetCalendar
// says when a change takes effect; an unknown customer is created with it).
func (a *API) putCustomer(w http.ResponseWriter, r *http.Request) error {
	customer := chi.URLParam(r, "customer")
	if err := checkID("customer", customer); err != nil {
		return err
	}
	if _, err := queryParams(r); err != nil {
		return err
	}
	var body calendarBody
	if err := decodeJSON(r, &body); err != nil {
		return err
	}
	cal := body.calendar()
	if err := cal.Validate(); err != nil {
		return err // before the caches below are dropped for nothing
	}
	c, created, err := a.periodStore().SetCalendar(r.Context(), a.pool, customer, cal)
	a.schedules.Del(customer)
	a.forgetUsage(customer)
	if err != nil {
		return err
	}
	v, err := a.viewCustomer(customer, c.CreatedAt, c.Schedule, a.now())
	if err != nil {
		return err
	}
	status := http.StatusOK
	if created {
		status = http.StatusCreated
		w.Header().Set("Location", "/v1/customers/"+customer)
	}
	writeJSON(w, status, v)
	return nil
}
