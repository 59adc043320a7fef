// Package periods owns the accounting calendar (docs/design.md §4): which accounting
// period an instant belongs to, for one customer's billing calendar and for
// its history of calendar changes (a Schedule).
//
// Invariants:
//   - A period is [Start, End) with Start < End. The periods of a Calendar or a
//     Schedule tile time: every instant lies in exactly one period, and each
//     period ends exactly where the next one starts, across calendar changes too.
//   - Boundaries are local wall-clock times in the calendar's IANA zone, so
//     they follow DST. An anchor time that does not exist on a day (spring
//     forward) resolves to the first instant after the gap; one that occurs
//     twice (fall back) resolves to the first occurrence.
//   - A period is named by its start date in the calendar's zone; names strictly
//     increase with time, so a name identifies one period of a schedule.
//   - A calendar change takes effect at the next boundary and never alters a
//     period that has started.
//
// Store owns the customers table (each customer's Schedule): only
// SetCalendar and QueueCreateCustomers (the ledger's create-on-first-usage)
// write it.
//
// Calendar and Schedule are pure (no database, no I/O beyond loading time
// zones, which are cached) and cheap enough to call for every ingested record.
package periods
