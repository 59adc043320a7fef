package periods

import (
	"errors"
	"fmt"
	"sync"
	"time"

	// Fallback zone database for hosts and images without /usr/share/zoneinfo:
	// a missing zone file must not stop ingest for every non-UTC customer.
	// The system database still wins when present.
	_ "time/tzdata"

	"github.com/tally-ledger/tally/validation"
)

// Cadence is how often a calendar's periods repeat.
type Cadence string

// The cadences a calendar may have.
const (
	Monthly Cadence = "monthly"
	Weekly  Cadence = "weekly"
	Daily   Cadence = "daily"
)

// Calendar is one customer's billing calendar.
//
// A period boundary is the anchor day at the anchor wall-clock time in Zone.
// When that wall time does not exist on the day (a spring-forward gap, e.g.
// "02:30" in America/New_York on the day DST starts) the boundary is the first
// instant after the gap (03:00 EDT). When it occurs twice (fall back) the
// boundary is its first occurrence. A daily calendar has no boundary on a date
// that the zone skipped entirely (Pacific/Apia, 2011-12-30).
type Calendar struct {
	Cadence Cadence `json:"cadence"`
	// AnchorDay is the boundary's day: for monthly 1..31, where 29, 30 and 31
	// mean the last day of months that are shorter; for weekly 1..7, the ISO
	// weekday (1 = Monday); for daily it must be 0.
	AnchorDay int `json:"anchor_day"`
	// AnchorTime is the boundary's local wall-clock time, "HH:MM"; empty means "00:00".
	AnchorTime string `json:"anchor_time"`
	// Zone is an IANA time zone name; empty means "UTC".
	Zone string `json:"zone"`
}

// DefaultCalendar is the calendar of a customer nobody configured:
// monthly, from the 1st at 00:00 UTC.
func DefaultCalendar() Calendar {
	return Calendar{Cadence: Monthly, AnchorDay: 1, AnchorTime: "00:00", Zone: "UTC"}
}

// Validate reports every problem of c at once, each naming its JSON field:
// errors.Join of *validation.FieldError.
func (c Calendar) Validate() error {
	var errs []error
	for _, fe := range c.problems() {
		errs = append(errs, fe)
	}
	return errors.Join(errs...)
}

func (c Calendar) problems() []*validation.FieldError {
	var errs []*validation.FieldError
	switch c.Cadence {
	case Monthly:
		if c.AnchorDay < 1 || c.AnchorDay > 31 {
			errs = append(errs, validation.Errorf("anchor_day", "%d is out of range 1..31 for a monthly calendar", c.AnchorDay))
		}
	case Weekly:
		if c.AnchorDay < 1 || c.AnchorDay > 7 {
			errs = append(errs, validation.Errorf("anchor_day", "%d is out of range 1..7 (ISO weekday, 1 = Monday) for a weekly calendar", c.AnchorDay))
		}
	case Daily:
		if c.AnchorDay != 0 {
			errs = append(errs, validation.Errorf("anchor_day", "%d must be 0 for a daily calendar", c.AnchorDay))
		}
	default:
		errs = append(errs, validation.Errorf("cadence", "%q is not one of monthly, weekly, daily", c.Cadence))
	}
	if _, ok := parseClock(c.AnchorTime); !ok {
		errs = append(errs, validation.Errorf("anchor_time", "%q is not HH:MM", c.AnchorTime))
	}
	if _, err := c.Location(); err != nil {
		errs = append(errs, validation.Errorf("zone", "unknown time zone %q", c.Zone))
	}
	return errs
}

// zones caches loaded locations by zone name: time.LoadLocation reads and
// parses a file, and PeriodAt runs for every ingested record.
var zones sync.Map // string → *time.Location

// Location returns the calendar's time zone.
func (c Calendar) Location() (*time.Location, error) {
	return loadZone(c.Zone)
}

func loadZone(name string) (*time.Location, error) {
	if name == "" || name == "UTC" {
		return time.UTC, nil
	}
	if l, ok := zones.Load(name); ok {
		return l.(*time.Location), nil
	}
	// "Local" is whatever the server runs in; a customer's bill must not be.
	if name == "Local" {
		return nil, fmt.Errorf("zone: unknown time zone %q", name)
	}
	l, err := time.LoadLocation(name)
	if err != nil {
		return nil, fmt.Errorf("zone: unknown time zone %q", name)
	}
	actual, _ := zones.LoadOrStore(name, l)
	return actual.(*time.Location), nil
}

// parseClock reads "HH:MM" (empty means "00:00") as seconds after midnight.
func parseClock(s string) (int64, bool) {
	if s == "" {
		return 0, true
	}
	if len(s) != 5 || s[2] != ':' {
		return 0, false
	}
	for _, i := range [4]int{0, 1, 3, 4} {
		if s[i] < '0' || s[i] > '9' {
			return 0, false
		}
	}
	h := int64(s[0]-'0')*10 + int64(s[1]-'0')
	m := int64(s[3]-'0')*10 + int64(s[4]-'0')
	if h > 23 || m > 59 {
		return 0, false
	}
	return h*3600 + m*60, true
}

// Period is one accounting period: [Start, End).
type Period struct {
	Start time.Time // instant, in the calendar's location
	End   time.Time
	Name  string // start date in the calendar's zone, "2006-01-02"
}

// Contains reports whether t lies in [p.Start, p.End).
func (p Period) Contains(t time.Time) bool {
	return !t.Before(p.Start) && t.Before(p.End)
}

// PeriodAt returns the period of c containing t.
func (c Calendar) PeriodAt(t time.Time) (Period, error) {
	r, err := c.rule()
	if err != nil {
		return Period{}, err
	}
	s, e := r.period(t.Unix())
	return r.makePeriod(s, e), nil
}

// Next returns the period of c that follows p.
func (c Calendar) Next(p Period) (Period, error) {
	return c.PeriodAt(p.End)
}

// rule is a validated calendar ready for arithmetic. All instants are Unix
// seconds: boundaries are whole seconds, so comparing t.Unix() (which floors)
// against a boundary gives the same order as comparing the instants.
type rule struct {
	cadence Cadence
	day     int64 // anchor day
	clock   int64 // anchor time, seconds after local midnight
	loc     *time.Location
}

func (c Calendar) rule() (rule, error) {
	clock, ok := parseClock(c.AnchorTime)
	loc, zerr := loadZone(c.Zone)
	switch c.Cadence {
	case Monthly:
		ok = ok && c.AnchorDay >= 1 && c.AnchorDay <= 31
	case Weekly:
		ok = ok && c.AnchorDay >= 1 && c.AnchorDay <= 7
	case Daily:
		ok = ok && c.AnchorDay == 0
	default:
		ok = false
	}
	if !ok || zerr != nil {
		return rule{}, fmt.Errorf("invalid calendar: %v", c.Validate()) // %v: a stored calendar is not the caller's input
	}
	return rule{cadence: c.Cadence, day: int64(c.AnchorDay), clock: clock, loc: loc}, nil
}

func (r rule) makePeriod(s, e int64) Period {
	return Period{
		Start: time.Unix(s, 0).In(r.loc),
		End:   time.Unix(e, 0).In(r.loc),
		Name:  dayName(localDay(r.loc, s)),
	}
}

// period returns the boundaries [s, e) around the instant ts.
// It starts from the period index of ts's local date, which is right or one
// off (anchor time, DST overlaps), and steps at most a few boundaries.
func (r rule) period(ts int64) (s, e int64) {
	k := r.index(localDay(r.loc, ts))
	s, k = r.atOrBefore(k)
	for s > ts {
		s, k = r.atOrBefore(k - 1)
	}
	e, k2 := r.atOrAfter(k + 1)
	for e <= ts {
		s, k = e, k2
		e, k2 = r.atOrAfter(k2 + 1)
	}
	return s, e
}

// index numbers the periods: months since year 0, weeks, or days since 1970.
// Boundary k+1 is always after boundary k.
func (r rule) index(day int64) int64 {
	switch r.cadence {
	case Monthly:
		y, m, _ := civil(day)
		return y*12 + int64(m-1)
	case Weekly:
		return floorDiv(day-r.weekOffset(), 7)
	default:
		return day
	}
}

// weekOffset is the day number, modulo 7, of the anchor weekday:
// day 0 (1970-01-01) is a Thursday, ISO weekday 4.
func (r rule) weekOffset() int64 { return r.day - 4 }

// boundary returns the instant of boundary k, or false if it does not exist.
func (r rule) boundary(k int64) (int64, bool) {
	var day int64
	switch r.cadence {
	case Monthly:
		y := floorDiv(k, 12)
		m := int(k-y*12) + 1
		day = daysFromCivil(y, m, int(min(r.day, int64(daysIn(y, m)))))
	case Weekly:
		day = 7*k + r.weekOffset()
	default:
		day = k
	}
	b, gap := resolveWall(r.loc, day*86400+r.clock)
	// A gap that swallows the rest of the date (a skipped day) would give two
	// daily boundaries on one date, or one instant for two boundaries.
	if gap && r.cadence == Daily && localDay(r.loc, b) != day {
		return 0, false
	}
	return b, true
}

func (r rule) atOrBefore(k int64) (int64, int64) {
	for {
		if b, ok := r.boundary(k); ok {
			return b, k
		}
		k--
	}
}

func (r rule) atOrAfter(k int64) (int64, int64) {
	for {
		if b, ok := r.boundary(k); ok {
			return b, k
		}
		k++
	}
}

// maxOffset bounds the UTC offset of any zone, past or present (local mean
// times reach about ±16h).
const maxOffset = 24 * 3600

// resolveWall returns the instant at which the local wall clock of loc reads
// w (seconds since 1970-01-01T00:00 on that clock): the first such instant if
// it occurs twice, or the first instant after the gap (gap = true) if the wall
// clock skips it. time.Date leaves that choice unspecified, so walk the zone's
// offset spans from before the earliest candidate instead.
func resolveWall(loc *time.Location, w int64) (int64, bool) {
	if loc == time.UTC {
		return w, false
	}
	t := time.Unix(w-maxOffset, 0).In(loc)
	for {
		_, off := t.Zone()
		_, end := t.ZoneBounds()
		if !end.IsZero() && !end.After(t) {
			// golang/go#81583: on the last UTC day of a leap year served by
			// the zone's TZ rule, ZoneBounds ends the span a day early (before
			// t). The offset really holds to the end of the year.
			end = end.Add(24 * time.Hour)
			if !end.After(t) {
				end = t.Add(time.Hour)
			}
		}
		at := w - int64(off)
		if end.IsZero() || at < end.Unix() {
			// The span's wall clock runs from at most w (we came from
			// earlier) up to end+off > w, so it reads w at this instant.
			return at, false
		}
		e := end.Unix()
		_, next := end.Zone()
		if w-int64(next) < e {
			// The clock jumps at e from below w to above it.
			return e, true
		}
		t = end
	}
}

// DayStart is the first instant of the local date y-m-d in loc (m and d
// may run out of range, as time.Date's may): its midnight, or, where the
// zone's clocks skip midnight that day, the instant they jump past it. (For
// such a midnight time.Date may answer an instant of the day before:
// 23:00 CST for 2026-03-08 in America/Havana, whose clocks go from 23:59:59
// CST to 01:00 CDT.) A date the zone skipped entirely starts where the
// next one does.
func DayStart(loc *time.Location, y int, m time.Month, d int) time.Time {
	day := time.Date(y, m, d, 0, 0, 0, 0, time.UTC).Unix() / 86400
	ts, _ := resolveWall(loc, day*86400)
	return time.Unix(ts, 0).In(loc)
}

// localDay is the date of instant ts in loc, as days since 1970-01-01.
func localDay(loc *time.Location, ts int64) int64 {
	if loc == time.UTC {
		return floorDiv(ts, 86400)
	}
	_, off := time.Unix(ts, 0).In(loc).Zone()
	return floorDiv(ts+int64(off), 86400)
}

func floorDiv(a, b int64) int64 {
	q := a / b
	if (a%b != 0) && ((a < 0) != (b < 0)) {
		q--
	}
	return q
}

// daysFromCivil and civil convert between proleptic Gregorian dates and days
// since 1970-01-01 (H. Hinnant's algorithms): no allocation, no time.Date.
func daysFromCivil(y int64, m, d int) int64 {
	if m <= 2 {
		y--
	}
	era := floorDiv(y, 400)
	yoe := y - era*400
	mp := int64((m + 9) % 12)
	doy := (153*mp+2)/5 + int64(d) - 1
	doe := yoe*365 + yoe/4 - yoe/100 + doy
	return era*146097 + doe - 719468
}

func civil(day int64) (y int64, m, d int) {
	z := day + 719468
	era := floorDiv(z, 146097)
	doe := z - era*146097
	yoe := (doe - doe/1460 + doe/36524 - doe/146096) / 365
	doy := doe - (365*yoe + yoe/4 - yoe/100)
	mp := (5*doy + 2) / 153
	d = int(doy - (153*mp+2)/5 + 1)
	m = int(mp) + 3
	if m > 12 {
		m -= 12
	}
	y = yoe + era*400
	if m <= 2 {
		y++
	}
	return y, m, d
}

func daysIn(y int64, m int) int {
	switch m {
	case 2:
		if y%4 == 0 && (y%100 != 0 || y%400 == 0) {
			return 29
		}
		return 28
	case 4, 6, 9, 11:
		return 30
	}
	return 31
}

// dayName formats a day number as "2006-01-02".
func dayName(day int64) string {
	y, m, d := civil(day)
	if y < 0 || y > 9999 {
		return time.Date(int(y), time.Month(m), d, 0, 0, 0, 0, time.UTC).Format(time.DateOnly)
	}
	b := [10]byte{
		byte('0' + y/1000), byte('0' + y/100%10), byte('0' + y/10%10), byte('0' + y%10), '-',
		byte('0' + m/10), byte('0' + m%10), '-',
		byte('0' + d/10), byte('0' + d%10),
	}
	return string(b[:])
}
