package periods_test

import (
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"pgregory.net/rapid"

	"github.com/tally-ledger/tally/periods"
)

// walk lists the periods of s from the one containing from, n of them, as
// "name [start, end)" in UTC.
func walk(t *testing.T, s periods.Schedule, from time.Time, n int) []string {
	t.Helper()
	p, err := s.PeriodAt(from)
	if err != nil {
		t.Fatal(err)
	}
	var out []string
	for range n {
		out = append(out, fmt.Sprintf("%s [%s, %s)", p.Name, p.Start.UTC().Format(time.RFC3339), p.End.UTC().Format(time.RFC3339)))
		if p, err = s.Next(p); err != nil {
			t.Fatal(err)
		}
	}
	return out
}

func equalLines(t *testing.T, got, want []string) {
	t.Helper()
	if strings.Join(got, "\n") != strings.Join(want, "\n") {
		t.Fatalf("got\n\t%s\nwant\n\t%s", strings.Join(got, "\n\t"), strings.Join(want, "\n\t"))
	}
}

func mustChange(t *testing.T, s periods.Schedule, now string, c periods.Calendar) (periods.Schedule, time.Time) {
	t.Helper()
	out, eff, err := s.Change(at(t, now), c)
	if err != nil {
		t.Fatal(err)
	}
	if err := out.Validate(); err != nil {
		t.Fatalf("Change produced an invalid schedule: %v", err)
	}
	return out, eff
}

// unchangedUpTo checks that every period that has started by now is the same
// in both schedules.
func unchangedUpTo(t *testing.T, before, after periods.Schedule, now time.Time) {
	t.Helper()
	for ts := now.AddDate(0, 0, -100); !ts.After(now); ts = ts.Add(37 * time.Minute) {
		a, err := before.PeriodAt(ts)
		if err != nil {
			t.Fatal(err)
		}
		b, err := after.PeriodAt(ts)
		if err != nil {
			t.Fatal(err)
		}
		if !samePeriod(a, b) {
			t.Fatalf("change at %s altered the started period %s [%s, %s) into %s [%s, %s)", now,
				a.Name, a.Start, a.End, b.Name, b.Start, b.End)
		}
	}
}

func TestScheduleChange(t *testing.T) {
	s := periods.NewSchedule(periods.DefaultCalendar())
	berlin15 := monthly(15, "00:00", "Europe/Berlin")

	s1, eff := mustChange(t, s, "2026-11-15T10:00:00Z", berlin15)
	if want := at(t, "2026-12-01T00:00:00Z"); !eff.Equal(want) {
		t.Fatalf("effective %s, want %s", eff, want)
	}
	if len(s) != 1 || len(s1) != 2 {
		t.Fatalf("len before %d after %d, want 1 and 2 (the receiver is not modified)", len(s), len(s1))
	}
	unchangedUpTo(t, s, s1, at(t, "2026-11-15T10:00:00Z"))
	equalLines(t, walk(t, s1, at(t, "2026-10-05T00:00:00Z"), 4), []string{
		"2026-10-01 [2026-10-01T00:00:00Z, 2026-11-01T00:00:00Z)",
		"2026-11-01 [2026-11-01T00:00:00Z, 2026-12-01T00:00:00Z)",
		"2026-12-01 [2026-12-01T00:00:00Z, 2026-12-14T23:00:00Z)", // short: up to the new anchor
		"2026-12-15 [2026-12-14T23:00:00Z, 2027-01-14T23:00:00Z)",
	})

	t.Run("second change before the first takes effect replaces it", func(t *testing.T) {
		s2, eff := mustChange(t, s1, "2026-11-20T00:00:00Z", weekly(1, "", ""))
		if len(s2) != 2 || s2[1].Calendar != weekly(1, "", "") || !eff.Equal(at(t, "2026-12-01T00:00:00Z")) {
			t.Fatalf("got %+v effective %s", s2, eff)
		}
		unchangedUpTo(t, s1, s2, at(t, "2026-11-20T00:00:00Z"))
		equalLines(t, walk(t, s2, at(t, "2026-11-05T00:00:00Z"), 3), []string{
			"2026-11-01 [2026-11-01T00:00:00Z, 2026-12-01T00:00:00Z)",
			"2026-12-01 [2026-12-01T00:00:00Z, 2026-12-07T00:00:00Z)", // a Tuesday to Monday
			"2026-12-07 [2026-12-07T00:00:00Z, 2026-12-14T00:00:00Z)",
		})
	})

	t.Run("changing back to the calendar in effect cancels the pending change", func(t *testing.T) {
		s2, eff := mustChange(t, s1, "2026-11-20T00:00:00Z", periods.Calendar{Cadence: periods.Monthly, AnchorDay: 1})
		if len(s2) != 1 || !eff.Equal(at(t, "2026-12-01T00:00:00Z")) {
			t.Fatalf("got %+v effective %s", s2, eff)
		}
	})

	t.Run("change after the first took effect appends, ends a long first period", func(t *testing.T) {
		now := "2026-12-20T00:00:00Z"
		s3, eff := mustChange(t, s1, now, daily("00:00", "UTC"))
		if len(s3) != 3 || !eff.Equal(at(t, "2027-01-14T23:00:00Z")) {
			t.Fatalf("got %d versions effective %s", len(s3), eff)
		}
		unchangedUpTo(t, s1, s3, at(t, now))
		// 23:00Z is already 2027-01-15 in Berlin: the first daily period takes
		// that name and runs to the next UTC midnight on a later date.
		equalLines(t, walk(t, s3, at(t, now), 3), []string{
			"2026-12-15 [2026-12-14T23:00:00Z, 2027-01-14T23:00:00Z)",
			"2027-01-15 [2027-01-14T23:00:00Z, 2027-01-16T00:00:00Z)",
			"2027-01-16 [2027-01-16T00:00:00Z, 2027-01-17T00:00:00Z)",
		})
	})

	t.Run("a change never alters the current period even at its last instant", func(t *testing.T) {
		now := at(t, "2026-11-30T23:59:59.999999999Z")
		s2, eff, err := s.Change(now, weekly(3, "", ""))
		if err != nil {
			t.Fatal(err)
		}
		if !eff.Equal(at(t, "2026-12-01T00:00:00Z")) {
			t.Fatalf("effective %s", eff)
		}
		unchangedUpTo(t, s, s2, now)
	})

	t.Run("invalid calendar", func(t *testing.T) {
		_, _, err := s.Change(at(t, "2026-11-15T00:00:00Z"), monthly(1, "", "Mars/Base"))
		if err == nil || err.Error() != `change calendar: zone: unknown time zone "Mars/Base"` {
			t.Fatalf("err = %v", err)
		}
	})
}

func TestScheduleFirstPeriodAfterChange(t *testing.T) {
	tests := []struct {
		name string
		from periods.Calendar
		to   periods.Calendar
		now  string
		want []string // from the period containing now
	}{
		{"later anchor day: short period", periods.DefaultCalendar(), monthly(15, "", ""), "2026-11-15T00:00:00Z", []string{
			"2026-11-01 [2026-11-01T00:00:00Z, 2026-12-01T00:00:00Z)",
			"2026-12-01 [2026-12-01T00:00:00Z, 2026-12-15T00:00:00Z)",
			"2026-12-15 [2026-12-15T00:00:00Z, 2027-01-15T00:00:00Z)",
		}},
		{"earlier anchor day: short period", monthly(15, "", ""), periods.DefaultCalendar(), "2026-11-20T00:00:00Z", []string{
			"2026-11-15 [2026-11-15T00:00:00Z, 2026-12-15T00:00:00Z)",
			"2026-12-15 [2026-12-15T00:00:00Z, 2027-01-01T00:00:00Z)",
			"2027-01-01 [2027-01-01T00:00:00Z, 2027-02-01T00:00:00Z)",
		}},
		// A half-day period would share its name with the next one.
		{"later anchor time on the same date: long period", periods.DefaultCalendar(), monthly(1, "12:00", "UTC"), "2026-11-15T00:00:00Z", []string{
			"2026-11-01 [2026-11-01T00:00:00Z, 2026-12-01T00:00:00Z)",
			"2026-12-01 [2026-12-01T00:00:00Z, 2027-01-01T12:00:00Z)",
			"2027-01-01 [2027-01-01T12:00:00Z, 2027-02-01T12:00:00Z)",
		}},
		{"zone moves west: named by the old zone's date", periods.DefaultCalendar(), monthly(1, "", "America/New_York"), "2026-11-15T00:00:00Z", []string{
			"2026-11-01 [2026-11-01T00:00:00Z, 2026-12-01T00:00:00Z)",
			"2026-12-01 [2026-12-01T00:00:00Z, 2027-01-01T05:00:00Z)",
			"2027-01-01 [2027-01-01T05:00:00Z, 2027-02-01T05:00:00Z)",
		}},
		{"zone moves east", periods.DefaultCalendar(), monthly(1, "", "Asia/Kolkata"), "2026-11-15T00:00:00Z", []string{
			"2026-11-01 [2026-11-01T00:00:00Z, 2026-12-01T00:00:00Z)",
			"2026-12-01 [2026-12-01T00:00:00Z, 2026-12-31T18:30:00Z)",
			"2027-01-01 [2026-12-31T18:30:00Z, 2027-01-31T18:30:00Z)",
		}},
		{"daily, zone moves west by 10h", daily("", "UTC"), daily("", "Pacific/Honolulu"), "2026-11-01T12:00:00Z", []string{
			"2026-11-01 [2026-11-01T00:00:00Z, 2026-11-02T00:00:00Z)",
			"2026-11-02 [2026-11-02T00:00:00Z, 2026-11-03T10:00:00Z)",
			"2026-11-03 [2026-11-03T10:00:00Z, 2026-11-04T10:00:00Z)",
		}},
		{"daily, zone moves east across the date line", daily("", "Pacific/Honolulu"), daily("", "Pacific/Kiritimati"), "2026-11-01T12:00:00Z", []string{
			"2026-11-01 [2026-11-01T10:00:00Z, 2026-11-02T10:00:00Z)",
			"2026-11-03 [2026-11-02T10:00:00Z, 2026-11-03T10:00:00Z)",
			"2026-11-04 [2026-11-03T10:00:00Z, 2026-11-04T10:00:00Z)",
		}},
		{"monthly to daily", periods.DefaultCalendar(), daily("", ""), "2026-11-15T00:00:00Z", []string{
			"2026-11-01 [2026-11-01T00:00:00Z, 2026-12-01T00:00:00Z)",
			"2026-12-01 [2026-12-01T00:00:00Z, 2026-12-02T00:00:00Z)",
			"2026-12-02 [2026-12-02T00:00:00Z, 2026-12-03T00:00:00Z)",
		}},
		{"daily to monthly", daily("", ""), periods.DefaultCalendar(), "2026-11-15T12:00:00Z", []string{
			"2026-11-15 [2026-11-15T00:00:00Z, 2026-11-16T00:00:00Z)",
			"2026-11-16 [2026-11-16T00:00:00Z, 2026-12-01T00:00:00Z)",
			"2026-12-01 [2026-12-01T00:00:00Z, 2027-01-01T00:00:00Z)",
		}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			s, _ := mustChange(t, periods.NewSchedule(tt.from), tt.now, tt.to)
			equalLines(t, walk(t, s, at(t, tt.now), len(tt.want)), tt.want)
		})
	}
}

func TestScheduleValidate(t *testing.T) {
	def := periods.DefaultCalendar()
	tests := []struct {
		name string
		s    periods.Schedule
		want string
	}{
		{"new", periods.NewSchedule(def), ""},
		{"change at a boundary", periods.Schedule{{Calendar: def}, {EffectiveFrom: at(t, "2026-12-01T00:00:00Z"), Calendar: weekly(1, "", "")}}, ""},
		{"empty", periods.Schedule{}, "schedule: has no versions"},
		{"first version not from the zero time",
			periods.Schedule{{EffectiveFrom: at(t, "2026-01-01T00:00:00Z"), Calendar: def}},
			"schedule[0].effective_from: 2026-01-01T00:00:00Z must be the zero time"},
		{"change inside a period",
			periods.Schedule{{Calendar: def}, {EffectiveFrom: at(t, "2026-11-15T00:00:00Z"), Calendar: weekly(1, "", "")}},
			"schedule[1].effective_from: 2026-11-15T00:00:00Z is not a period boundary; the period containing it ends 2026-12-01T00:00:00Z"},
		{"not ascending",
			periods.Schedule{{Calendar: def}, {EffectiveFrom: at(t, "2026-12-01T00:00:00Z"), Calendar: daily("", "")}, {EffectiveFrom: at(t, "2026-11-01T00:00:00Z"), Calendar: def}},
			"schedule[2].effective_from: 2026-11-01T00:00:00Z is not after schedule[1]'s 2026-12-01T00:00:00Z"},
		{"bad calendars",
			periods.Schedule{{Calendar: monthly(0, "", "Mars/Base")}, {EffectiveFrom: at(t, "2026-12-01T00:00:00Z"), Calendar: daily("7:00", "")}},
			"schedule[0].calendar.anchor_day: 0 is out of range 1..31 for a monthly calendar\n" +
				"schedule[0].calendar.zone: unknown time zone \"Mars/Base\"\n" +
				"schedule[1].calendar.anchor_time: \"7:00\" is not HH:MM"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			err := tt.s.Validate()
			if tt.want == "" {
				if err != nil {
					t.Fatalf("Validate() = %v", err)
				}
				return
			}
			if err == nil || err.Error() != tt.want {
				t.Fatalf("Validate() = %v\nwant %s", err, tt.want)
			}
		})
	}
	if _, err := (periods.Schedule{}).PeriodAt(time.Now()); err == nil {
		t.Error("PeriodAt on an empty schedule: no error")
	}
}

func TestScheduleResolve(t *testing.T) {
	s, _ := mustChange(t, periods.NewSchedule(periods.DefaultCalendar()), "2026-11-15T10:00:00Z", monthly(15, "00:00", "Europe/Berlin"))
	tests := []struct {
		ref, now string
		want     string // period name, or the error text
	}{
		{"current", "2026-11-15T10:00:00Z", "2026-11-01"},
		{"previous", "2026-11-15T10:00:00Z", "2026-10-01"},
		{"current", "2026-12-05T00:00:00Z", "2026-12-01"},
		{"previous", "2026-12-05T00:00:00Z", "2026-11-01"},
		{"previous", "2026-12-20T00:00:00Z", "2026-12-01"},
		{"current", "2026-12-14T23:00:00Z", "2026-12-15"},
		{"current", "2026-12-14T22:59:59.999999999Z", "2026-12-01"},
		{"2026-11-01", "2026-11-15T10:00:00Z", "2026-11-01"},
		{"2026-12-01", "2026-11-15T10:00:00Z", "2026-12-01"},
		{"2026-12-15", "2026-11-15T10:00:00Z", "2026-12-15"},
		{"2027-03-15", "2026-11-15T10:00:00Z", "2027-03-15"},
		{"2020-02-01", "2026-11-15T10:00:00Z", "2020-02-01"},
		{"2026-11-02", "2026-11-15T10:00:00Z", `period "2026-11-02": no period of this calendar starts on that date; the period containing it starts 2026-11-01`},
		{"2026-10-31", "2026-11-15T10:00:00Z", `period "2026-10-31": no period of this calendar starts on that date; the period containing it starts 2026-10-01`},
		{"2026-12-14", "2026-11-15T10:00:00Z", `period "2026-12-14": no period of this calendar starts on that date; the period containing it starts 2026-12-01`},
		{"2027-01-01", "2026-11-15T10:00:00Z", `period "2027-01-01": no period of this calendar starts on that date; the period containing it starts 2026-12-15`},
		{"yesterday", "2026-11-15T10:00:00Z", `period "yesterday": invalid period reference: want "current", "previous" or a start date YYYY-MM-DD`},
		{"2026-13-01", "2026-11-15T10:00:00Z", `period "2026-13-01": invalid period reference: want "current", "previous" or a start date YYYY-MM-DD`},
		{"2026-11-1", "2026-11-15T10:00:00Z", `period "2026-11-1": invalid period reference: want "current", "previous" or a start date YYYY-MM-DD`},
		{"", "2026-11-15T10:00:00Z", `period "": invalid period reference: want "current", "previous" or a start date YYYY-MM-DD`},
		// Periods end before the year 10000 (RFC 3339 ends there) and start from 1970.
		{"9998-12-15", "2026-11-15T10:00:00Z", "9998-12-15"},
		{"9999-01-15", "2026-11-15T10:00:00Z", `period "9999-01-15": invalid period reference: outside the supported range 1970-01-01 to 9998-12-31`},
		{"0000-01-01", "2026-11-15T10:00:00Z", `period "0000-01-01": invalid period reference: outside the supported range 1970-01-01 to 9998-12-31`},
		{"1969-12-01", "2026-11-15T10:00:00Z", `period "1969-12-01": invalid period reference: outside the supported range 1970-01-01 to 9998-12-31`},
	}
	for _, tt := range tests {
		t.Run(tt.ref+"@"+tt.now, func(t *testing.T) {
			p, err := s.Resolve(tt.ref, at(t, tt.now))
			if strings.HasPrefix(tt.want, "period ") {
				if err == nil || err.Error() != tt.want {
					t.Fatalf("Resolve = %v, %v\nwant error %s", p.Name, err, tt.want)
				}
				wantNoSuch := strings.Contains(tt.want, "no period")
				if errors.Is(err, periods.ErrNoSuchPeriod) != wantNoSuch || errors.Is(err, periods.ErrInvalidPeriodRef) == wantNoSuch {
					t.Fatalf("error %v: Is(ErrNoSuchPeriod) = %v, want %v", err, errors.Is(err, periods.ErrNoSuchPeriod), wantNoSuch)
				}
				var ns *periods.NoSuchPeriodError
				if errors.As(err, &ns) != wantNoSuch {
					t.Fatalf("error %v: As(*NoSuchPeriodError) = %v, want %v", err, !wantNoSuch, wantNoSuch)
				}
				if wantNoSuch {
					d := at(t, tt.ref+"T12:00:00Z")
					if ns.Ref != tt.ref || !strings.HasSuffix(tt.want, " "+ns.Containing.Name) ||
						d.Before(ns.Containing.Start.Add(-24*time.Hour)) || !d.Before(ns.Containing.End.Add(24*time.Hour)) {
						t.Fatalf("NoSuchPeriodError %+v for %q", ns, tt.ref)
					}
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if p.Name != tt.want {
				t.Fatalf("Resolve = %s, want %s", p.Name, tt.want)
			}
			if byName, err := s.Resolve(p.Name, time.Time{}); err != nil || !samePeriod(byName, p) {
				t.Fatalf("Resolve(%s) = %v, %v, want the same period", p.Name, byName, err)
			}
		})
	}
}

// zonesForProperties mixes common zones with ones whose rules are unusual:
// 30- and 45-minute offsets and DST, negative DST (Dublin), a 2-hour DST
// (Troll), midnight transitions (Havana, Santiago), Ramadan DST (Casablanca),
// and skipped days (Apia, Kiritimati).
var zonesForProperties = []string{
	"UTC", "Europe/Berlin", "America/New_York", "Australia/Lord_Howe", "Asia/Kolkata",
	"Pacific/Chatham", "Pacific/Apia", "Pacific/Kiritimati", "Pacific/Honolulu",
	"America/St_Johns", "Asia/Kathmandu", "Europe/Dublin", "Antarctica/Troll",
	"America/Havana", "America/Santiago", "Africa/Casablanca", "Asia/Tehran",
	"America/Sao_Paulo", "Europe/London", "Australia/Adelaide",
}

func calendarGen() *rapid.Generator[periods.Calendar] {
	return rapid.Custom(func(t *rapid.T) periods.Calendar {
		c := periods.Calendar{
			Cadence: rapid.SampledFrom([]periods.Cadence{periods.Monthly, periods.Weekly, periods.Daily}).Draw(t, "cadence"),
			Zone:    rapid.SampledFrom(zonesForProperties).Draw(t, "zone"),
		}
		switch c.Cadence {
		case periods.Monthly:
			c.AnchorDay = rapid.OneOf(rapid.IntRange(1, 31), rapid.IntRange(28, 31)).Draw(t, "anchor_day")
		case periods.Weekly:
			c.AnchorDay = rapid.IntRange(1, 7).Draw(t, "anchor_day")
		}
		// Bias towards the hours where DST transitions happen.
		h := rapid.OneOf(rapid.IntRange(0, 23), rapid.IntRange(0, 3), rapid.IntRange(22, 23)).Draw(t, "hour")
		m := rapid.OneOf(rapid.SampledFrom([]int{0, 15, 30, 45}), rapid.IntRange(0, 59)).Draw(t, "minute")
		c.AnchorTime = fmt.Sprintf("%02d:%02d", h, m)
		return c
	})
}

var (
	propMin = time.Date(1900, 1, 1, 0, 0, 0, 0, time.UTC).Unix()
	propMax = time.Date(2100, 1, 1, 0, 0, 0, 0, time.UTC).Unix()
)

func instantGen(lo, hi int64) *rapid.Generator[time.Time] {
	return rapid.Custom(func(t *rapid.T) time.Time {
		sec := rapid.Int64Range(lo, hi).Draw(t, "sec")
		ns := rapid.OneOf(rapid.Just(0), rapid.IntRange(0, 999_999_999)).Draw(t, "ns")
		return time.Unix(sec, int64(ns)).UTC()
	})
}

// TestSchedulePropertiesTile checks, for random calendars, schedules built by
// Change, and instants: periods contain their instants, touch their
// neighbours with no gap or overlap, have increasing names, round-trip
// through Resolve, and a change never alters a period that has started.
func TestSchedulePropertiesTile(t *testing.T) {
	rapid.Check(t, func(t *rapid.T) {
		s := periods.NewSchedule(calendarGen().Draw(t, "calendar"))
		now := instantGen(propMin, propMax).Draw(t, "first change")
		first := now
		for i := range rapid.IntRange(0, 4).Draw(t, "changes") {
			before := s
			c := calendarGen().Draw(t, fmt.Sprintf("calendar %d", i+1))
			next, eff, err := s.Change(now, c)
			if err != nil {
				t.Fatalf("Change(%s, %+v): %v", now, c, err)
			}
			if !eff.After(now) {
				t.Fatalf("Change at %s effective %s, not after now", now, eff)
			}
			if err := next.Validate(); err != nil {
				t.Fatalf("Change made an invalid schedule: %v", err)
			}
			for _, ts := range []time.Time{now, now.Add(-time.Nanosecond), instantGen(now.Unix()-100*86400, now.Unix()).Draw(t, "started")} {
				if ts.After(now) {
					continue
				}
				a, err1 := before.PeriodAt(ts)
				b, err2 := next.PeriodAt(ts)
				if err1 != nil || err2 != nil || !samePeriod(a, b) {
					t.Fatalf("change at %s altered the started period at %s: %+v → %+v (%v %v)", now, ts, a, b, err1, err2)
				}
			}
			s = next
			now = now.Add(time.Duration(rapid.Int64Range(0, 120*86400).Draw(t, "wait")) * time.Second)
		}
		probes := []*rapid.Generator[time.Time]{
			instantGen(first.Unix()-200*86400, now.Unix()+200*86400),
			instantGen(propMin, propMax),
		}
		for _, v := range s[1:] {
			e := v.EffectiveFrom.Unix()
			probes = append(probes, instantGen(e-3*86400, e+3*86400))
		}
		for i := range 10 {
			ts := rapid.SampledFrom(probes).Draw(t, fmt.Sprintf("probe %d", i)).Draw(t, fmt.Sprintf("t%d", i))
			checkTiling(t, s, ts)
		}
	})
}

func checkTiling(t *rapid.T, s periods.Schedule, ts time.Time) {
	p, err := s.PeriodAt(ts)
	if err != nil {
		t.Fatalf("PeriodAt(%s): %v", ts, err)
	}
	if !p.Contains(ts) || !p.Start.Before(p.End) {
		t.Fatalf("PeriodAt(%s) = %s [%s, %s)", ts, p.Name, p.Start, p.End)
	}
	n, err := s.Next(p)
	if err != nil {
		t.Fatal(err)
	}
	if !n.Start.Equal(p.End) || !n.Start.Before(n.End) || n.Name <= p.Name {
		t.Fatalf("%s [%s, %s) is followed by %s [%s, %s)", p.Name, p.Start, p.End, n.Name, n.Start, n.End)
	}
	q, err := s.Previous(p)
	if err != nil {
		t.Fatal(err)
	}
	if !q.End.Equal(p.Start) || !q.Start.Before(q.End) || q.Name >= p.Name {
		t.Fatalf("%s [%s, %s) is preceded by %s [%s, %s)", p.Name, p.Start, p.End, q.Name, q.Start, q.End)
	}
	for ref, want := range map[string]periods.Period{p.Name: p, "current": p, "previous": q} {
		got, err := s.Resolve(ref, ts)
		if ref == p.Name && (p.Name < "1970-01-01" || p.Name > "9998-12-31") {
			if !errors.Is(err, periods.ErrInvalidPeriodRef) {
				t.Fatalf("Resolve(%q) outside the supported range = %s, %v", ref, got.Name, err)
			}
			continue
		}
		if err != nil || !samePeriod(got, want) {
			t.Fatalf("Resolve(%q, %s) = %s [%s, %s), %v; want %s [%s, %s)", ref, ts, got.Name, got.Start, got.End, err, want.Name, want.Start, want.End)
		}
	}
	if len(s) == 1 {
		c, err := s[0].Calendar.PeriodAt(ts)
		if err != nil || !samePeriod(c, p) {
			t.Fatalf("Calendar.PeriodAt = %+v, %v; Schedule.PeriodAt = %+v", c, err, p)
		}
		if p.Name != p.Start.Format(time.DateOnly) {
			t.Fatalf("Name %s is not the local start date of %s", p.Name, p.Start)
		}
	}
}
