package periods_test

import (
	"strings"
	"testing"
	"time"

	"pgregory.net/rapid"

	"github.com/tally-ledger/tally/periods"
)

func at(t testing.TB, s string) time.Time {
	t.Helper()
	v, err := time.Parse(time.RFC3339Nano, s)
	if err != nil {
		t.Fatal(err)
	}
	return v
}

func samePeriod(a, b periods.Period) bool {
	return a.Start.Equal(b.Start) && a.End.Equal(b.End) && a.Name == b.Name
}

func monthly(day int, clock, zone string) periods.Calendar {
	return periods.Calendar{Cadence: periods.Monthly, AnchorDay: day, AnchorTime: clock, Zone: zone}
}

func weekly(day int, clock, zone string) periods.Calendar {
	return periods.Calendar{Cadence: periods.Weekly, AnchorDay: day, AnchorTime: clock, Zone: zone}
}

func daily(clock, zone string) periods.Calendar {
	return periods.Calendar{Cadence: periods.Daily, AnchorTime: clock, Zone: zone}
}

func TestCalendarPeriodAt(t *testing.T) {
	tests := []struct {
		name       string
		cal        periods.Calendar
		at         string
		start, end string // RFC 3339 instants
		period     string // Name
	}{
		// Monthly, UTC.
		{"default calendar", periods.DefaultCalendar(), "2026-11-15T10:00:00Z", "2026-11-01T00:00:00Z", "2026-12-01T00:00:00Z", "2026-11-01"},
		{"zero value fields default", periods.Calendar{Cadence: periods.Monthly, AnchorDay: 1}, "2026-11-15T10:00:00Z", "2026-11-01T00:00:00Z", "2026-12-01T00:00:00Z", "2026-11-01"},
		{"exactly on the boundary", periods.DefaultCalendar(), "2026-11-01T00:00:00Z", "2026-11-01T00:00:00Z", "2026-12-01T00:00:00Z", "2026-11-01"},
		{"last nanosecond of a year", periods.DefaultCalendar(), "2026-12-31T23:59:59.999999999Z", "2026-12-01T00:00:00Z", "2027-01-01T00:00:00Z", "2026-12-01"},
		{"anchor 15 across the year end", monthly(15, "00:00", "UTC"), "2027-01-03T00:00:00Z", "2026-12-15T00:00:00Z", "2027-01-15T00:00:00Z", "2026-12-15"},
		{"anchor time before it", monthly(1, "06:00", "UTC"), "2026-11-01T05:59:59Z", "2026-10-01T06:00:00Z", "2026-11-01T06:00:00Z", "2026-10-01"},
		{"far past", periods.DefaultCalendar(), "1901-03-04T00:00:00Z", "1901-03-01T00:00:00Z", "1901-04-01T00:00:00Z", "1901-03-01"},

		// Anchors 29, 30, 31 clamp to the end of shorter months.
		{"31: January", monthly(31, "", ""), "2026-02-15T00:00:00Z", "2026-01-31T00:00:00Z", "2026-02-28T00:00:00Z", "2026-01-31"},
		{"31: February non-leap", monthly(31, "", ""), "2026-02-28T00:00:00Z", "2026-02-28T00:00:00Z", "2026-03-31T00:00:00Z", "2026-02-28"},
		{"31: February leap", monthly(31, "", ""), "2028-02-29T12:00:00Z", "2028-02-29T00:00:00Z", "2028-03-31T00:00:00Z", "2028-02-29"},
		{"31: before leap day", monthly(31, "", ""), "2028-02-28T23:59:00Z", "2028-01-31T00:00:00Z", "2028-02-29T00:00:00Z", "2028-01-31"},
		{"31: April", monthly(31, "", ""), "2026-04-30T00:00:00Z", "2026-04-30T00:00:00Z", "2026-05-31T00:00:00Z", "2026-04-30"},
		{"31: before April 30", monthly(31, "", ""), "2026-04-29T00:00:00Z", "2026-03-31T00:00:00Z", "2026-04-30T00:00:00Z", "2026-03-31"},
		{"31: year end", monthly(31, "", ""), "2027-01-01T00:00:00Z", "2026-12-31T00:00:00Z", "2027-01-31T00:00:00Z", "2026-12-31"},
		{"30: February non-leap", monthly(30, "", ""), "2026-02-27T00:00:00Z", "2026-01-30T00:00:00Z", "2026-02-28T00:00:00Z", "2026-01-30"},
		{"30: March non-leap", monthly(30, "", ""), "2026-03-01T00:00:00Z", "2026-02-28T00:00:00Z", "2026-03-30T00:00:00Z", "2026-02-28"},
		{"30: March leap", monthly(30, "", ""), "2028-03-01T00:00:00Z", "2028-02-29T00:00:00Z", "2028-03-30T00:00:00Z", "2028-02-29"},
		{"29: non-leap", monthly(29, "", ""), "2026-03-01T00:00:00Z", "2026-02-28T00:00:00Z", "2026-03-29T00:00:00Z", "2026-02-28"},
		{"29: leap", monthly(29, "", ""), "2028-02-28T12:00:00Z", "2028-01-29T00:00:00Z", "2028-02-29T00:00:00Z", "2028-01-29"},
		{"29: leap day itself", monthly(29, "", ""), "2028-03-01T00:00:00Z", "2028-02-29T00:00:00Z", "2028-03-29T00:00:00Z", "2028-02-29"},
		{"29: century non-leap 2100", monthly(29, "", ""), "2100-03-01T00:00:00Z", "2100-02-28T00:00:00Z", "2100-03-29T00:00:00Z", "2100-02-28"},
		{"29: 2000 is leap", monthly(29, "", ""), "2000-03-01T00:00:00Z", "2000-02-29T00:00:00Z", "2000-03-29T00:00:00Z", "2000-02-29"},

		// Monthly in other zones: boundaries at local midnight.
		{"Berlin", monthly(1, "00:00", "Europe/Berlin"), "2026-11-15T00:00:00Z", "2026-11-01T00:00:00+01:00", "2026-12-01T00:00:00+01:00", "2026-11-01"},
		{"Berlin: UTC still October", monthly(1, "00:00", "Europe/Berlin"), "2026-10-31T23:30:00Z", "2026-10-31T23:00:00Z", "2026-11-30T23:00:00Z", "2026-11-01"},
		{"Berlin: across spring forward", monthly(1, "00:00", "Europe/Berlin"), "2026-03-15T00:00:00Z", "2026-03-01T00:00:00+01:00", "2026-04-01T00:00:00+02:00", "2026-03-01"},
		{"Berlin: 31 in February", monthly(31, "00:00", "Europe/Berlin"), "2026-03-08T12:00:00Z", "2026-02-28T00:00:00+01:00", "2026-03-31T00:00:00+02:00", "2026-02-28"},
		{"New York: UTC already November", monthly(1, "00:00", "America/New_York"), "2026-11-01T03:00:00Z", "2026-10-01T04:00:00Z", "2026-11-01T04:00:00Z", "2026-10-01"},
		{"New York: anchor in the spring gap", monthly(8, "02:30", "America/New_York"), "2026-03-20T00:00:00Z", "2026-03-08T07:00:00Z", "2026-04-08T06:30:00Z", "2026-03-08"},
		{"Kolkata", monthly(1, "00:00", "Asia/Kolkata"), "2026-11-10T00:00:00Z", "2026-10-31T18:30:00Z", "2026-11-30T18:30:00Z", "2026-11-01"},
		{"Chatham", monthly(1, "00:00", "Pacific/Chatham"), "2026-11-15T00:00:00Z", "2026-10-31T10:15:00Z", "2026-11-30T10:15:00Z", "2026-11-01"},
		{"Lord Howe", monthly(1, "00:00", "Australia/Lord_Howe"), "2026-11-15T00:00:00Z", "2026-10-31T13:00:00Z", "2026-11-30T13:00:00Z", "2026-11-01"},

		// Weekly.
		{"weekly Monday", weekly(1, "", ""), "2026-11-15T12:00:00Z", "2026-11-09T00:00:00Z", "2026-11-16T00:00:00Z", "2026-11-09"},
		{"weekly Monday on the boundary", weekly(1, "", ""), "2026-11-16T00:00:00Z", "2026-11-16T00:00:00Z", "2026-11-23T00:00:00Z", "2026-11-16"},
		{"weekly Thursday across the year end", weekly(4, "", ""), "2027-01-01T00:00:00Z", "2026-12-31T00:00:00Z", "2027-01-07T00:00:00Z", "2026-12-31"},
		{"weekly Sunday 18:00 Berlin", weekly(7, "18:00", "Europe/Berlin"), "2026-11-15T16:00:00Z", "2026-11-08T18:00:00+01:00", "2026-11-15T18:00:00+01:00", "2026-11-08"},
		{"weekly across spring forward is 167h", weekly(1, "00:00", "Europe/Berlin"), "2026-03-29T12:00:00Z", "2026-03-23T00:00:00+01:00", "2026-03-30T00:00:00+02:00", "2026-03-23"},

		// Daily, DST days are 23 and 25 hours long.
		{"daily UTC year end", daily("", ""), "2026-12-31T23:59:59Z", "2026-12-31T00:00:00Z", "2027-01-01T00:00:00Z", "2026-12-31"},
		{"daily Kolkata 09:30", daily("09:30", "Asia/Kolkata"), "2026-11-15T03:00:00Z", "2026-11-14T09:30:00+05:30", "2026-11-15T09:30:00+05:30", "2026-11-14"},
		{"daily Berlin spring forward", daily("00:00", "Europe/Berlin"), "2026-03-29T12:00:00Z", "2026-03-29T00:00:00+01:00", "2026-03-30T00:00:00+02:00", "2026-03-29"},
		{"daily Berlin fall back", daily("00:00", "Europe/Berlin"), "2026-10-25T12:00:00Z", "2026-10-25T00:00:00+02:00", "2026-10-26T00:00:00+01:00", "2026-10-25"},
		{"daily New York spring forward", daily("00:00", "America/New_York"), "2026-03-08T12:00:00Z", "2026-03-08T05:00:00Z", "2026-03-09T04:00:00Z", "2026-03-08"},
		{"daily New York fall back", daily("00:00", "America/New_York"), "2026-11-01T12:00:00Z", "2026-11-01T04:00:00Z", "2026-11-02T05:00:00Z", "2026-11-01"},

		// Anchor times in DST gaps: the first instant after the gap.
		{"New York 02:30 in the gap", daily("02:30", "America/New_York"), "2026-03-08T12:00:00Z", "2026-03-08T07:00:00Z", "2026-03-09T06:30:00Z", "2026-03-08"},
		{"New York 02:30 day before the gap", daily("02:30", "America/New_York"), "2026-03-08T06:59:59Z", "2026-03-07T07:30:00Z", "2026-03-08T07:00:00Z", "2026-03-07"},
		{"Berlin 02:30 in the gap", daily("02:30", "Europe/Berlin"), "2026-03-29T01:00:00Z", "2026-03-29T01:00:00Z", "2026-03-30T00:30:00Z", "2026-03-29"},
		{"Lord Howe 02:15 in the 30-minute gap", daily("02:15", "Australia/Lord_Howe"), "2026-10-04T00:00:00Z", "2026-10-03T15:30:00Z", "2026-10-04T15:15:00Z", "2026-10-04"},
		{"Chatham 03:00 in the gap", daily("03:00", "Pacific/Chatham"), "2026-09-27T00:00:00Z", "2026-09-26T14:00:00Z", "2026-09-27T13:15:00Z", "2026-09-27"},
		{"Chatham day before the gap", daily("03:00", "Pacific/Chatham"), "2026-09-26T13:59:59Z", "2026-09-25T14:15:00Z", "2026-09-26T14:00:00Z", "2026-09-26"},

		// Anchor times that occur twice: the first occurrence, even for an
		// instant whose (second) wall time is before the anchor.
		{"New York 01:30 fall back, second 01:15", daily("01:30", "America/New_York"), "2026-11-01T06:15:00Z", "2026-11-01T05:30:00Z", "2026-11-02T06:30:00Z", "2026-11-01"},
		{"New York 01:30 fall back, first 01:15", daily("01:30", "America/New_York"), "2026-11-01T05:15:00Z", "2026-10-31T05:30:00Z", "2026-11-01T05:30:00Z", "2026-10-31"},
		{"Berlin 02:30 fall back", daily("02:30", "Europe/Berlin"), "2026-10-25T01:10:00Z", "2026-10-25T00:30:00Z", "2026-10-26T01:30:00Z", "2026-10-25"},
		{"Lord Howe 01:45 fall back (30 min)", daily("01:45", "Australia/Lord_Howe"), "2026-04-04T15:05:00Z", "2026-04-04T14:45:00Z", "2026-04-05T15:15:00Z", "2026-04-05"},
		{"Chatham 03:00 fall back", daily("03:00", "Pacific/Chatham"), "2026-04-04T14:05:00Z", "2026-04-04T13:15:00Z", "2026-04-05T14:15:00Z", "2026-04-05"},

		// The last UTC day of a leap year far enough ahead to be computed
		// from the zone's TZ rule (golang/go#81583).
		{"Berlin daily, Dec 31 of leap 2040", daily("00:00", "Europe/Berlin"), "2040-12-31T12:00:00Z", "2040-12-31T00:00:00+01:00", "2041-01-01T00:00:00+01:00", "2040-12-31"},
		{"Berlin monthly, Dec 31 of leap 2040", monthly(1, "00:00", "Europe/Berlin"), "2040-12-31T23:30:00Z", "2041-01-01T00:00:00+01:00", "2041-02-01T00:00:00+01:00", "2041-01-01"},
		{"Lord Howe weekly, Dec 31 of leap 2084", weekly(7, "01:12", "Australia/Lord_Howe"), "2084-12-31T12:00:00Z", "2084-12-31T01:12:00+11:00", "2085-01-07T01:12:00+11:00", "2084-12-31"},

		// Pacific/Apia skipped 2011-12-30: no daily period starts that day.
		{"Apia skipped day, 12:00", daily("12:00", "Pacific/Apia"), "2011-12-30T12:00:00Z", "2011-12-29T22:00:00Z", "2011-12-30T22:00:00Z", "2011-12-29"},
		{"Apia skipped day, 00:00", daily("00:00", "Pacific/Apia"), "2011-12-30T09:59:59Z", "2011-12-29T10:00:00Z", "2011-12-30T10:00:00Z", "2011-12-29"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, err := tt.cal.PeriodAt(at(t, tt.at))
			if err != nil {
				t.Fatal(err)
			}
			want := periods.Period{Start: at(t, tt.start), End: at(t, tt.end), Name: tt.period}
			if !samePeriod(got, want) {
				t.Fatalf("PeriodAt(%s) = %s [%s, %s), want %s [%s, %s)", tt.at,
					got.Name, got.Start.Format(time.RFC3339), got.End.Format(time.RFC3339),
					want.Name, want.Start.Format(time.RFC3339), want.End.Format(time.RFC3339))
			}
			loc, _ := tt.cal.Location()
			if got.Start.Location() != loc || got.End.Location() != loc {
				t.Errorf("period in %v/%v, want %v", got.Start.Location(), got.End.Location(), loc)
			}
			if got.Name != got.Start.Format(time.DateOnly) {
				t.Errorf("Name %s is not the start date %s", got.Name, got.Start.Format(time.DateOnly))
			}
			next, err := tt.cal.Next(got)
			if err != nil {
				t.Fatal(err)
			}
			if !next.Start.Equal(got.End) || !next.End.After(next.Start) || next.Name <= got.Name {
				t.Errorf("Next = %s [%s, %s), does not follow", next.Name, next.Start, next.End)
			}
		})
	}
}

// TestResolveWallOracle checks the boundary of a wall-clock time against its
// definition, using only the zone's offset at single instants: the first
// instant whose wall clock reads w, or, if none does, the instant the clock
// jumps over w.
func TestResolveWallOracle(t *testing.T) {
	rapid.Check(t, func(t *rapid.T) {
		loc, err := time.LoadLocation(rapid.SampledFrom(zonesForProperties).Draw(t, "zone"))
		if err != nil {
			t.Fatal(err)
		}
		wall := func(ts int64) int64 {
			_, off := time.Unix(ts, 0).In(loc).Zone()
			return ts + int64(off)
		}
		x := rapid.Int64Range(propMin, propMax).Draw(t, "near")
		var w int64
		if rapid.Bool().Draw(t, "near a transition") {
			// Wall times around the start of the offset span containing x.
			start, _ := time.Unix(x, 0).In(loc).ZoneBounds()
			if !start.IsZero() {
				x = start.Unix()
			}
			w = wall(x-1) + rapid.Int64Range(-3*3600, 3*3600).Draw(t, "delta")
		} else {
			w = wall(x)
		}
		r, gap := periods.ResolveWall(loc, w)
		if !gap && wall(r) != w {
			t.Fatalf("ResolveWall(%d) = %s, whose wall clock reads %d", w, time.Unix(r, 0).In(loc), wall(r))
		}
		if gap && !(wall(r-1) < w && wall(r) > w) {
			t.Fatalf("ResolveWall(%d) = %s is not where the clock jumps over it", w, time.Unix(r, 0).In(loc))
		}
		for ts := r - 48*3600; ts < r; ts += 600 {
			_, off := time.Unix(ts, 0).In(loc).Zone()
			if c := w - int64(off); c < r && wall(c) == w {
				t.Fatalf("ResolveWall(%d) = %s (gap %v), but %s reads the same wall time earlier", w,
					time.Unix(r, 0).In(loc), gap, time.Unix(c, 0).In(loc))
			}
		}
	})
}

func TestCalendarDayLengths(t *testing.T) {
	tests := []struct {
		cal  periods.Calendar
		day  string // an instant inside the period
		want time.Duration
	}{
		{daily("", "Europe/Berlin"), "2026-03-29T12:00:00Z", 23 * time.Hour},
		{daily("", "Europe/Berlin"), "2026-10-25T12:00:00Z", 25 * time.Hour},
		{daily("", "Europe/Berlin"), "2026-07-01T12:00:00Z", 24 * time.Hour},
		{daily("", "Australia/Lord_Howe"), "2026-10-04T00:00:00Z", 23*time.Hour + 30*time.Minute},
		{daily("", "Australia/Lord_Howe"), "2026-04-05T00:00:00Z", 24*time.Hour + 30*time.Minute},
		{daily("", "Pacific/Chatham"), "2026-09-27T00:00:00Z", 23 * time.Hour},
		{daily("", "Asia/Kolkata"), "2026-03-29T12:00:00Z", 24 * time.Hour},
	}
	for _, tt := range tests {
		p, err := tt.cal.PeriodAt(at(t, tt.day))
		if err != nil {
			t.Fatal(err)
		}
		if got := p.End.Sub(p.Start); got != tt.want {
			t.Errorf("%s %s: period %s is %v long, want %v", tt.cal.Zone, tt.day, p.Name, got, tt.want)
		}
	}
}

func TestCalendarValidate(t *testing.T) {
	tests := []struct {
		name string
		cal  periods.Calendar
		want string // "" for valid
	}{
		{"default", periods.DefaultCalendar(), ""},
		{"empty time and zone default", periods.Calendar{Cadence: periods.Monthly, AnchorDay: 31}, ""},
		{"weekly Sunday", weekly(7, "23:59", "Asia/Kolkata"), ""},
		{"daily", daily("02:30", "America/New_York"), ""},
		{"monthly day 32", monthly(32, "00:00", "UTC"), "anchor_day: 32 is out of range 1..31 for a monthly calendar"},
		{"monthly day 0", monthly(0, "00:00", "UTC"), "anchor_day: 0 is out of range 1..31 for a monthly calendar"},
		{"weekly day 8", weekly(8, "00:00", "UTC"), "anchor_day: 8 is out of range 1..7 (ISO weekday, 1 = Monday) for a weekly calendar"},
		{"weekly day 0", weekly(0, "00:00", "UTC"), "anchor_day: 0 is out of range 1..7 (ISO weekday, 1 = Monday) for a weekly calendar"},
		{"daily with a day", periods.Calendar{Cadence: periods.Daily, AnchorDay: 1}, "anchor_day: 1 must be 0 for a daily calendar"},
		{"unknown zone", monthly(1, "00:00", "Mars/Base"), `zone: unknown time zone "Mars/Base"`},
		{"server-local zone", monthly(1, "00:00", "Local"), `zone: unknown time zone "Local"`},
		{"hour 24", monthly(1, "24:00", "UTC"), `anchor_time: "24:00" is not HH:MM`},
		{"minute 60", monthly(1, "09:60", "UTC"), `anchor_time: "09:60" is not HH:MM`},
		{"one-digit hour", monthly(1, "9:00", "UTC"), `anchor_time: "9:00" is not HH:MM`},
		{"seconds", monthly(1, "09:00:00", "UTC"), `anchor_time: "09:00:00" is not HH:MM`},
		{"wrong separator", monthly(1, "09.00", "UTC"), `anchor_time: "09.00" is not HH:MM`},
		{"empty cadence", periods.Calendar{AnchorDay: 1}, `cadence: "" is not one of monthly, weekly, daily`},
		{"everything wrong", periods.Calendar{Cadence: "yearly", AnchorDay: 1, AnchorTime: "25:00", Zone: "Mars/Base"},
			"cadence: \"yearly\" is not one of monthly, weekly, daily\n" +
				"anchor_time: \"25:00\" is not HH:MM\n" +
				"zone: unknown time zone \"Mars/Base\""},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			err := tt.cal.Validate()
			switch {
			case tt.want == "" && err != nil:
				t.Fatalf("Validate() = %v, want nil", err)
			case tt.want != "" && err == nil:
				t.Fatalf("Validate() = nil, want %q", tt.want)
			case tt.want != "" && err.Error() != tt.want:
				t.Fatalf("Validate() = %q, want %q", err, tt.want)
			}
			// An invalid calendar has no periods.
			if _, perr := tt.cal.PeriodAt(time.Now()); (perr != nil) != (tt.want != "") {
				t.Fatalf("PeriodAt error = %v, Validate error = %v", perr, err)
			} else if perr != nil && !strings.Contains(perr.Error(), tt.want) {
				t.Fatalf("PeriodAt error %q does not explain %q", perr, tt.want)
			}
		})
	}
}

func TestCalendarLocation(t *testing.T) {
	c := monthly(1, "", "Europe/Berlin")
	a, err := c.Location()
	if err != nil {
		t.Fatal(err)
	}
	b, err := c.Location()
	if err != nil {
		t.Fatal(err)
	}
	if a != b || a.String() != "Europe/Berlin" {
		t.Fatalf("Location() = %p %v then %p %v, want one cached Europe/Berlin", a, a, b, b)
	}
	if l, err := periods.DefaultCalendar().Location(); err != nil || l != time.UTC {
		t.Fatalf("default Location() = %v, %v", l, err)
	}
	if l, err := (periods.Calendar{}).Location(); err != nil || l != time.UTC {
		t.Fatalf("empty zone Location() = %v, %v", l, err)
	}
	if _, err := monthly(1, "", "Mars/Base").Location(); err == nil || err.Error() != `zone: unknown time zone "Mars/Base"` {
		t.Fatalf("unknown zone: %v", err)
	}
}

func TestPeriodContains(t *testing.T) {
	p := periods.Period{Start: at(t, "2026-11-01T00:00:00Z"), End: at(t, "2026-12-01T00:00:00Z"), Name: "2026-11-01"}
	for s, want := range map[string]bool{
		"2026-10-31T23:59:59.999999999Z": false,
		"2026-11-01T00:00:00Z":           true,
		"2026-11-01T01:00:00+01:00":      true,
		"2026-11-30T23:59:59.999999999Z": true,
		"2026-12-01T00:00:00Z":           false,
	} {
		if got := p.Contains(at(t, s)); got != want {
			t.Errorf("Contains(%s) = %v, want %v", s, got, want)
		}
	}
}

func BenchmarkPeriodAt(b *testing.B) {
	now := time.Date(2026, 11, 15, 10, 30, 0, 0, time.UTC)
	cals := map[string]periods.Calendar{
		"monthly_UTC":         periods.DefaultCalendar(),
		"monthly_Berlin":      monthly(31, "00:00", "Europe/Berlin"),
		"weekly_Chatham":      weekly(1, "03:00", "Pacific/Chatham"),
		"daily_New_York_2:30": daily("02:30", "America/New_York"),
	}
	for name, c := range cals {
		b.Run("Calendar/"+name, func(b *testing.B) {
			b.ReportAllocs()
			for i := 0; b.Loop(); i++ {
				if _, err := c.PeriodAt(now.Add(time.Duration(i%1000) * time.Minute)); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
	s := periods.NewSchedule(periods.DefaultCalendar())
	s, _, _ = s.Change(now.AddDate(0, -3, 0), monthly(15, "00:00", "Europe/Berlin"))
	s, _, _ = s.Change(now.AddDate(0, -1, 0), daily("00:00", "America/New_York"))
	b.Run("Schedule/3_versions", func(b *testing.B) {
		b.ReportAllocs()
		for i := 0; b.Loop(); i++ {
			if _, err := s.PeriodAt(now.Add(time.Duration(i%1000) * time.Minute)); err != nil {
				b.Fatal(err)
			}
		}
	})
}

func TestDayStart(t *testing.T) {
	tests := []struct {
		zone, date, want string
	}{
		{"UTC", "2026-11-01", "2026-11-01T00:00:00Z"},
		{"America/New_York", "2026-11-01", "2026-11-01T04:00:00Z"},
		{"Asia/Kathmandu", "2026-11-01", "2026-10-31T18:15:00Z"},
		// Clocks skip midnight: the day starts at 01:00, when they jump.
		{"America/Havana", "2026-03-08", "2026-03-08T05:00:00Z"},
		{"America/Santiago", "2026-09-06", "2026-09-06T04:00:00Z"},
		{"Asia/Beirut", "2026-03-29", "2026-03-28T22:00:00Z"},
		// Midnight twice (Havana falls back from 01:00 CDT to 00:00 CST): the first.
		{"America/Havana", "2026-11-01", "2026-11-01T04:00:00Z"},
		// Pacific/Apia skipped 2011-12-30: it starts where the 31st does.
		{"Pacific/Apia", "2011-12-30", "2011-12-30T10:00:00Z"},
		{"Pacific/Apia", "2011-12-31", "2011-12-30T10:00:00Z"},
	}
	for _, tt := range tests {
		loc, err := time.LoadLocation(tt.zone)
		if err != nil {
			t.Fatal(err)
		}
		d := at(t, tt.date+"T00:00:00Z")
		got := periods.DayStart(loc, d.Year(), d.Month(), d.Day())
		if !got.Equal(at(t, tt.want)) || got.Location() != loc {
			t.Errorf("DayStart(%s, %s) = %s, want %s", tt.zone, tt.date, got.UTC().Format(time.RFC3339), tt.want)
		}
	}
	// Out-of-range days and months roll over as time.Date's do.
	if got := periods.DayStart(time.UTC, 2026, 12, 32); !got.Equal(at(t, "2027-01-01T00:00:00Z")) {
		t.Errorf("2026-12-32 = %s", got)
	}
	if got := periods.DayStart(time.UTC, 2026, 13, 1); !got.Equal(at(t, "2027-01-01T00:00:00Z")) {
		t.Errorf("2026-13-01 = %s", got)
	}
}
