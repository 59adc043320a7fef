package alerts_test

import (
	"context"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/tally-ledger/tally/alerts"
)

// statesRead is how many rows of alert_states the statistics say were
// read so far (sequential and index fetches).
func statesRead(t *testing.T, e *env) int64 { return rowsRead(t, e, "alert_states") }

func rowsRead(t *testing.T, e *env, table string) int64 {
	t.Helper()
	var n int64
	if err := e.pool.QueryRow(context.Background(), `SELECT coalesce(seq_tup_read, 0) + coalesce(idx_tup_fetch, 0)
		FROM pg_stat_user_tables WHERE relname = $1`, table).Scan(&n); err != nil {
		t.Fatal(err)
	}
	return n
}

// oldStates stores n states of rule in a period that ended long ago, as
// a rule over every customer leaves behind month after month.
func oldStates(t *testing.T, e *env, rule string, n int) {
	t.Helper()
	if _, err := e.pool.Exec(context.Background(), `
INSERT INTO alert_states (rule, subject, threshold, period_start, period, meter, state, transitions, used, "limit", changed_at)
SELECT $1, 'customer:c' || i, 'value:10', '2024-01-01', '2024-01-01', 'calls', 'ok', 2, 3, NULL, '2024-01-20'
FROM generate_series(1, $2::int) AS i`, rule, n); err != nil {
		t.Fatal(err)
	}
	if _, err := e.pool.Exec(context.Background(), `ANALYZE alert_states`); err != nil {
		t.Fatal(err)
	}
}

// TestAlertStatusReadsThePeriodNotTheHistory: a rule's status shows its
// subjects' current periods; it reads neither the states other periods
// left behind, of its own rule or of others, nor the other rules' states.
func TestAlertStatusReadsThePeriodNotTheHistory(t *testing.T) {
	e := newEnv(t)
	r := e.rule("acme-calls", `{"subject":"customer:acme","meter":"calls","thresholds":[{"value":"10"}]}`)
	oldStates(t, e, "acme-calls", 20_000)
	oldStates(t, e, "other", 20_000)
	conn, err := pgx.Connect(context.Background(), e.pool.Config().ConnString())
	if err != nil {
		t.Fatal(err)
	}
	before, marks := statesRead(t, e), rowsRead(t, e, "alert_rules")
	st, err := alerts.Status(context.Background(), conn, r, ingestTopic, e.clock())
	if err != nil {
		t.Fatal(err)
	}
	// A read of alert_rules after it marks when the backend's reads have
	// been reported: it reports them together as it exits.
	if _, err := conn.Exec(context.Background(), `SELECT count(*) FROM alert_rules`); err != nil {
		t.Fatal(err)
	}
	conn.Close(context.Background())
	waitFor(t, 10*time.Second, "the status's reads reported", func() bool { return rowsRead(t, e, "alert_rules") > marks })
	read := statesRead(t, e) - before
	if len(st) != 1 || read > 100 {
		t.Fatalf("the status of one subject read %d states (40,000 stored of past periods and another rule): %+v", read, st)
	}
}

// TestAlertEvaluationReadsThePeriodNotTheHistory: the evaluator, which
// looks at least once a second, reads the states of the current periods
// and the triggered ones, not every state past periods left behind.
func TestAlertEvaluationReadsThePeriodNotTheHistory(t *testing.T) {
	e := newEnv(t)
	e.rule("acme-calls", `{"subject":"customer:acme","meter":"calls","thresholds":[{"value":"10"}]}`)
	oldStates(t, e, "acme-calls", 20_000)
	e.start(startOptions{})
	e.use("acme", "calls", 20)
	waitFor(t, 10*time.Second, "triggered", func() bool { return len(e.stored()) == 1 })
	before := statesRead(t, e)
	time.Sleep(3 * time.Second) // several evaluations
	if read := statesRead(t, e) - before; read > 10_000 {
		t.Fatalf("3 s of evaluations read %d states, with 20,001 stored: every evaluation reads the history", read)
	}
}
