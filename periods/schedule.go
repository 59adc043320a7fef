package periods

import (
	"errors"
	"fmt"
	"slices"
	"time"

	"github.com/tally-ledger/tally/validation"
)

// Version is one calendar of a schedule and the instant it applies from.
type Version struct {
	EffectiveFrom time.Time `json:"effective_from"`
	Calendar      Calendar  `json:"calendar"`
}

// A Schedule is a customer's calendar history: each version applies from
// EffectiveFrom (an instant) until the next version. The first version's
// EffectiveFrom is the zero time and it applies to all earlier instants.
//
// A calendar change takes effect at a period boundary, so periods never
// overlap or leave a hole. The period before a change ends exactly at its
// EffectiveFrom. The first period after it starts there and ends at the first
// boundary of the new calendar that falls on a later date than the period's
// name, so it may be short (monthly on the 1st → on the 15th) or long (anchor
// 00:00 → 12:00 gives one period of a month and a half day, not a half-day
// period sharing its name with the next). It is named by the date of
// EffectiveFrom in the old or the new zone, whichever is later, so names keep
// increasing when a change moves the zone west.
type Schedule []Version // ascending EffectiveFrom

var (
	// ErrNoSuchPeriod: a date that names no period of the schedule.
	ErrNoSuchPeriod = errors.New("no such period")
	// ErrInvalidPeriodRef: a reference that is neither "current", "previous" nor a date.
	ErrInvalidPeriodRef = errors.New("invalid period reference")
)

// NewSchedule returns the schedule of a customer that always had calendar c.
func NewSchedule(c Calendar) Schedule {
	return Schedule{{Calendar: c}}
}

// Validate reports every problem of s at once, each naming its field
// (errors.Join of *validation.FieldError). Besides each calendar, it checks
// that versions ascend and that each change takes effect at a period
// boundary of the schedule before it, as Change does.
func (s Schedule) Validate() error {
	if len(s) == 0 {
		return validation.Errorf("schedule", "has no versions")
	}
	var errs []error
	calendarsOK := true
	for i, v := range s {
		for _, fe := range v.Calendar.problems() {
			errs = append(errs, validation.Errorf(fmt.Sprintf("schedule[%d].calendar.%s", i, fe.Field), "%s", fe.Detail))
			calendarsOK = false
		}
	}
	if !s[0].EffectiveFrom.IsZero() {
		errs = append(errs, validation.Errorf("schedule[0].effective_from", "%s must be the zero time", s[0].EffectiveFrom.Format(time.RFC3339Nano)))
	}
	ascending := true
	for i := 1; i < len(s); i++ {
		if !s[i].EffectiveFrom.After(s[i-1].EffectiveFrom) {
			errs = append(errs, validation.Errorf(fmt.Sprintf("schedule[%d].effective_from", i), "%s is not after schedule[%d]'s %s",
				s[i].EffectiveFrom.Format(time.RFC3339Nano), i-1, s[i-1].EffectiveFrom.Format(time.RFC3339Nano)))
			ascending = false
		}
	}
	if calendarsOK && ascending {
		for i := 1; i < len(s); i++ {
			eff := s[i].EffectiveFrom
			p, err := s[:i].PeriodAt(eff.Add(-time.Nanosecond))
			if err != nil {
				errs = append(errs, validation.Errorf(fmt.Sprintf("schedule[%d].effective_from", i), "%v", err))
			} else if !p.End.Equal(eff) {
				errs = append(errs, validation.Errorf(fmt.Sprintf("schedule[%d].effective_from", i), "%s is not a period boundary; the period containing it ends %s",
					eff.Format(time.RFC3339Nano), p.End.Format(time.RFC3339)))
			}
		}
	}
	return errors.Join(errs...)
}

// PeriodAt returns the period of s containing t.
func (s Schedule) PeriodAt(t time.Time) (Period, error) {
	p, _, err := s.periodAt(t)
	return p, err
}

// Next returns the period of s that follows p.
func (s Schedule) Next(p Period) (Period, error) {
	return s.PeriodAt(p.End)
}

// Previous returns the period of s that precedes p.
func (s Schedule) Previous(p Period) (Period, error) {
	return s.PeriodAt(p.Start.Add(-time.Nanosecond))
}

// CalendarAt is the calendar in force at t (the first version's for any
// earlier instant). s must not be empty.
func (s Schedule) CalendarAt(t time.Time) Calendar {
	return s[s.versionAt(t)].Calendar
}

// versionAt is the index of the version in force at t.
func (s Schedule) versionAt(t time.Time) int {
	i := len(s) - 1 // usage is mostly recent: search from the newest version
	for i > 0 && s[i].EffectiveFrom.After(t) {
		i--
	}
	return i
}

// periodAt also returns the period's name as a day number.
func (s Schedule) periodAt(t time.Time) (Period, int64, error) {
	if len(s) == 0 {
		return Period{}, 0, errors.New("empty schedule")
	}
	i := s.versionAt(t)
	r, err := s[i].Calendar.rule()
	if err != nil {
		return Period{}, 0, fmt.Errorf("schedule[%d]: %w", i, err)
	}
	start, end := r.period(t.Unix())
	name := localDay(r.loc, start)
	startT := time.Unix(start, 0).In(r.loc)
	if i > 0 {
		eff := s[i].EffectiveFrom
		prev, err := s[i-1].Calendar.rule()
		if err != nil {
			return Period{}, 0, fmt.Errorf("schedule[%d]: %w", i-1, err)
		}
		effSec := eff.Unix()
		first := max(localDay(prev.loc, effSec), localDay(r.loc, effSec))
		if !startT.After(eff) || name <= first {
			// t is in the first period after the change.
			_, end = r.period(effSec)
			for localDay(r.loc, end) <= first {
				_, end = r.period(end)
			}
			startT, name = eff.In(r.loc), first
		}
	}
	p := Period{Start: startT, End: time.Unix(end, 0).In(r.loc), Name: dayName(name)}
	if i+1 < len(s) && p.End.After(s[i+1].EffectiveFrom) {
		p.End = s[i+1].EffectiveFrom.In(r.loc)
	}
	return p, name, nil
}

// Change returns the schedule with c effective from the end of the period
// containing now (the next boundary), replacing any version not yet in effect
// at now. It never changes a period that has started. It returns that
// effective instant too. Changing back to the calendar in effect at now only
// drops the pending versions.
func (s Schedule) Change(now time.Time, c Calendar) (Schedule, time.Time, error) {
	if err := c.Validate(); err != nil {
		return nil, time.Time{}, fmt.Errorf("change calendar: %w", err)
	}
	if err := s.Validate(); err != nil {
		// %v: s is stored state, not the caller's input (see package validation).
		return nil, time.Time{}, fmt.Errorf("change calendar: %v", err)
	}
	n := len(s)
	for n > 1 && s[n-1].EffectiveFrom.After(now) {
		n--
	}
	out := slices.Clone(s[:n])
	cur, err := out.PeriodAt(now)
	if err != nil {
		return nil, time.Time{}, fmt.Errorf("change calendar: %w", err)
	}
	if out[n-1].Calendar.normalized() != c.normalized() {
		out = append(out, Version{EffectiveFrom: cur.End, Calendar: c})
	}
	return out, cur.End, nil
}

func (c Calendar) normalized() Calendar {
	if c.AnchorTime == "" {
		c.AnchorTime = "00:00"
	}
	if c.Zone == "" {
		c.Zone = "UTC"
	}
	return c
}

// Resolve turns a period reference into a period: "current" (the period
// containing now), "previous" (the one before it), or a start date such as
// "2026-11-01", which must be exactly the Name of a period of s.
func (s Schedule) Resolve(ref string, now time.Time) (Period, error) {
	switch ref {
	case "current":
		return s.PeriodAt(now)
	case "previous":
		p, err := s.PeriodAt(now)
		if err != nil {
			return Period{}, err
		}
		return s.Previous(p)
	}
	d, err := parseRef(ref)
	if err != nil {
		return Period{}, err
	}
	return s.resolveDate(ref, d)
}

// The dates a period reference may name: from 1970 (ingest refuses older
// usage) through 9998, so that the period of any calendar ends before the
// year 10000, whose instants RFC 3339 (and JSON answers) cannot express.
var (
	MinRefDate = time.Date(1970, 1, 1, 0, 0, 0, 0, time.UTC)
	MaxRefDate = time.Date(9998, 12, 31, 0, 0, 0, 0, time.UTC)
)

// RangeText says which period dates are supported, for error messages.
const RangeText = "outside the supported range 1970-01-01 to 9998-12-31"

// CheckRef reports a period reference that is neither "current",
// "previous" nor a start date YYYY-MM-DD in the supported range, as an
// error wrapping ErrInvalidPeriodRef.
func CheckRef(ref string) error {
	if ref == "current" || ref == "previous" {
		return nil
	}
	_, err := parseRef(ref)
	return err
}

func parseRef(ref string) (time.Time, error) {
	d, err := time.Parse(time.DateOnly, ref)
	if err != nil || len(ref) != len(time.DateOnly) {
		return time.Time{}, &InvalidPeriodRefError{Ref: ref, Detail: `want "current", "previous" or a start date YYYY-MM-DD`}
	}
	if d.Before(MinRefDate) || d.After(MaxRefDate) {
		return time.Time{}, &InvalidPeriodRefError{Ref: ref, Detail: RangeText}
	}
	return d, nil
}

// resolveDate is the period of s named d.
func (s Schedule) resolveDate(ref string, d time.Time) (Period, error) {
	want := daysFromCivil(int64(d.Year()), int(d.Month()), d.Day())
	// Names increase with time; noon UTC of that date is within a day of its
	// midnight in any zone, so this walk takes a step or two.
	p, name, err := s.periodAt(time.Unix(want*86400+12*3600, 0))
	for err == nil && name > want {
		p, name, err = s.periodAt(p.Start.Add(-time.Nanosecond))
	}
	for err == nil {
		n, nname, nerr := s.periodAt(p.End)
		if nerr != nil {
			err = nerr
			break
		}
		if nname > want {
			break
		}
		p, name = n, nname
	}
	if err != nil {
		return Period{}, err
	}
	if name != want {
		return Period{}, &NoSuchPeriodError{Ref: ref, Containing: p}
	}
	return p, nil
}

// InvalidPeriodRefError is a period reference that is neither "current",
// "previous" nor a start date in the supported range. It wraps
// ErrInvalidPeriodRef.
type InvalidPeriodRefError struct {
	Ref    string // the reference, as given
	Detail string // why it is not one
}

func (e *InvalidPeriodRefError) Error() string {
	return fmt.Sprintf("period %q: %v: %s", e.Ref, ErrInvalidPeriodRef, e.Detail)
}

func (e *InvalidPeriodRefError) Unwrap() error { return ErrInvalidPeriodRef }

// NoSuchPeriodError is a date that is not the start of a period of the
// schedule. It wraps ErrNoSuchPeriod.
type NoSuchPeriodError struct {
	Ref        string // the date asked for, as given
	Containing Period // the period the date lies in
}

func (e *NoSuchPeriodError) Error() string {
	return fmt.Sprintf("period %q: no period of this calendar starts on that date; the period containing it starts %s", e.Ref, e.Containing.Name)
}

func (e *NoSuchPeriodError) Unwrap() error { return ErrNoSuchPeriod }
