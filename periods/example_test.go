package periods_test

import (
	"fmt"
	"time"

	"github.com/tally-ledger/tally/periods"
)

// A customer billed monthly on the 31st in Berlin moves to the 15th. The
// change waits for the current period to end; the period in between is short.
func Example() {
	s := periods.NewSchedule(periods.Calendar{Cadence: periods.Monthly, AnchorDay: 31, AnchorTime: "00:00", Zone: "Europe/Berlin"})
	now := time.Date(2027, 2, 10, 9, 0, 0, 0, time.UTC)

	s, eff, err := s.Change(now, periods.Calendar{Cadence: periods.Monthly, AnchorDay: 15, AnchorTime: "00:00", Zone: "Europe/Berlin"})
	if err != nil {
		fmt.Println(err)
		return
	}
	fmt.Println("effective from", eff.Format(time.RFC3339))

	p, err := s.Resolve("current", now)
	for range 5 {
		if err != nil {
			fmt.Println(err)
			return
		}
		fmt.Printf("%s  %s → %s\n", p.Name, p.Start.Format(time.RFC3339), p.End.Format(time.RFC3339))
		p, err = s.Next(p)
	}

	_, err = s.Resolve("2027-03-01", now)
	fmt.Println(err)
	// Output:
	// effective from 2027-02-28T00:00:00+01:00
	// 2027-01-31  2027-01-31T00:00:00+01:00 → 2027-02-28T00:00:00+01:00
	// 2027-02-28  2027-02-28T00:00:00+01:00 → 2027-03-15T00:00:00+01:00
	// 2027-03-15  2027-03-15T00:00:00+01:00 → 2027-04-15T00:00:00+02:00
	// 2027-04-15  2027-04-15T00:00:00+02:00 → 2027-05-15T00:00:00+02:00
	// 2027-05-15  2027-05-15T00:00:00+02:00 → 2027-06-15T00:00:00+02:00
	// period "2027-03-01": no period of this calendar starts on that date; the period containing it starts 2027-02-28
}
