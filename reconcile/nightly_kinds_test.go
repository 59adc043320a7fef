package reconcile_test

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/shopspring/decimal"

	"github.com/tally-ledger/tally/ledger"
	"github.com/tally-ledger/tally/periods"
	"github.com/tally-ledger/tally/reconcile"
)

// closedState is the state of a customer's period as a statement says.
func (e *env) closedState(customer, period string) periods.State {
	e.t.Helper()
	st, err := periods.Store{Clock: func() time.Time { return e.now }}.Statement(context.Background(), e.pool, customer, period)
	if err != nil {
		e.t.Fatalf("%s %s: %v", customer, period, err)
	}
	return st.State
}

// The nightly job closes every ended period, a customer's whose usage is
// only gauge or unique readings too: their first period is found from
// those readings as from a counter's rollups, also when ingest applied
// them after the period ended (the customer row created later).
func TestNightlyClosesPeriodsOfGaugeAndUniqueOnlyCustomers(t *testing.T) {
	e := newEnv(t)
	ctx := context.Background()
	e.exec(`INSERT INTO meters (meter, kind, created_at, updated_at) VALUES ('seats', 'gauge', now(), now()), ('mau', 'unique', now(), now())`)
	e.now = time.Date(2026, 11, 2, 12, 0, 0, 0, time.UTC)
	oct := time.Date(2026, 10, 20, 0, 0, 0, 0, time.UTC)
	e.apply(
		ledger.Record{OperationID: uuid.New(), Stream: ledger.StreamKey{Producer: "p", Epoch: 1, Customer: "gauge-only", Meter: "seats"},
			Seq: 1, OccurredAt: oct, Shape: ledger.Gauge, Level: decimal.NewFromInt(4)},
		ledger.Record{OperationID: uuid.New(), Stream: ledger.StreamKey{Producer: "p", Epoch: 1, Customer: "unique-only", Meter: "mau"},
			Seq: 1, OccurredAt: oct, Shape: ledger.Unique, Member: "alice"})
	e.exec(`UPDATE customers SET created_at = $1`, e.now) // registered when ingest caught up, in November
	e.now = time.Date(2026, 11, 20, 0, 0, 0, 0, time.UTC)
	// Listed before it is closed, as a counter's period with usage is.
	ps, err := periods.Store{Clock: func() time.Time { return e.now }}.List(ctx, e.pool, "gauge-only")
	if err != nil || len(ps) != 2 || ps[1].Name != "2026-10-01" || ps[1].State != periods.AwaitingClose {
		t.Errorf("gauge-only's periods: %+v %v, want November and October awaiting close", ps, err)
	}
	if _, err := e.rc.Nightly(ctx); err != nil {
		t.Fatal(err)
	}
	for _, c := range []string{"gauge-only", "unique-only"} {
		if s := e.closedState(c, "2026-10-01"); s != periods.Closed {
			t.Errorf("%s's October after the nightly job: %s, want closed", c, s)
		}
	}
}

// The nightly job's bound on periods per customer counts the periods it
// has to reconcile, not those closed already: a customer with thousands
// of closed daily periods (one record at the epoch from a broken clock)
// still has yesterday's closed.
func TestNightlyBoundCountsOnlyUnclosedPeriods(t *testing.T) {
	e := newEnv(t) // 2026-11-20 12:00
	ctx := context.Background()
	e.exec(`INSERT INTO customers (id, schedule) VALUES ('d', '[{"effective_from":"0001-01-01T00:00:00Z","calendar":{"cadence":"daily","anchor_day":0,"anchor_time":"00:00","zone":"UTC"}}]')`)
	e.apply(rec("gw", 1, "d", 1, "1", "1", time.Date(1970, 1, 1, 0, 0, 0, 0, time.UTC)),
		rec("gw", 1, "d", 2, "6", "5", time.Date(2026, 11, 18, 10, 0, 0, 0, time.UTC)))
	// Earlier nights closed every day from the epoch to 2026-11-16.
	e.exec(`INSERT INTO period_closes (customer, period_start, period_end, closed_at, statement, forced, reason, actor)
	        SELECT 'd', s, s + interval '1 day', now(), '{}', true, 'earlier nights', 'cron'
	        FROM generate_series('1970-01-01'::timestamptz, '2026-11-16'::timestamptz, interval '1 day') s`)
	if _, err := e.rc.Nightly(ctx); err != nil {
		t.Fatal(err)
	}
	if s := e.closedState("d", "2026-11-18"); s != periods.Closed {
		t.Errorf("2026-11-18 after the nightly job: %s, want closed", s)
	}
}

// A gauge's or unique meter's conflict is a finding like a counter's: its
// payload has a level or a member where a counter's has a total, and the
// run once failed reading it (for every customer of the period).
func TestKindConflictsAreFindings(t *testing.T) {
	e := newEnv(t) // 2026-11-20 12:00
	ctx := context.Background()
	e.exec(`INSERT INTO meters (meter, kind, created_at, updated_at) VALUES ('gg', 'gauge', now(), now())`)
	at := func(s int) time.Time { return time.Date(2026, 11, 20, 1, 0, s, 0, time.UTC) }
	reading := func(seq int64, level int64, sec int) ledger.Record {
		return ledger.Record{OperationID: uuid.New(), Stream: ledger.StreamKey{Producer: "p", Epoch: 1, Customer: "q1", Meter: "gg"},
			Seq: seq, OccurredAt: at(sec), Shape: ledger.Gauge, Level: decimal.NewFromInt(level)}
	}
	e.apply(reading(1, 10, 0), reading(3, 30, 20), reading(2, 20, 10))
	e.apply(reading(4, 40, 5)) // before seq 3's occurred_at: a conflict
	run, err := e.rc.Run(ctx, reconcile.Options{Period: "current"})
	if err != nil {
		t.Fatalf("reconcile: %v", err)
	}
	found := false
	for _, f := range run.Findings {
		if f.Customer == "q1" && strings.Contains(f.Detail, "level 40") {
			found = true
		}
	}
	if !found {
		t.Fatalf("findings %+v, want q1's conflict with its level", run.Findings)
	}
}
