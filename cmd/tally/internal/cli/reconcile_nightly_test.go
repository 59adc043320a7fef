package cli

import (
	"bytes"
	"encoding/csv"
	"encoding/json"
	"errors"
	"strings"
	"testing"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/tally-ledger/tally/internal/pgtest"
)

// nightlyOut is reconcile --nightly's stdout: it notes how many runs were
// stored when the first byte of the report came.
type nightlyOut struct {
	t           *testing.T
	pool        *pgxpool.Pool
	runsAtFirst int
	buf         bytes.Buffer
}

func (w *nightlyOut) Write(p []byte) (int, error) {
	if w.buf.Len() == 0 && len(p) > 0 {
		if err := w.pool.QueryRow(w.t.Context(), `SELECT count(*) FROM reconciliation_runs`).Scan(&w.runsAtFirst); err != nil {
			w.t.Error(err)
		}
	}
	return w.buf.Write(p)
}

// TestNightlyReportsEachRunAsItEnds: a nightly run reconciles every period
// due since the job last ran (after an outage of the job, or on a ledger
// with a history, hundreds of periods, each with every customer's totals
// and findings). It writes each run's report when the run ends, holding
// no run in memory until the last has ended; the report is the same, in
// every format: one JSON array, one CSV header.
func TestNightlyReportsEachRunAsItEnds(t *testing.T) {
	const due = 6 // a customer created 6 days ago with a daily calendar: 6 ended periods, and today's
	for _, format := range []string{"json", "csv", "text"} {
		t.Run(format, func(t *testing.T) {
			url, pool := dailyCustomerSince(t, due)
			out := &nightlyOut{t: t, pool: pool}
			var errOut bytes.Buffer
			code := execute(t.Context(), []string{"reconcile", "--nightly", "--grace", "0s", "--format", format, "--database-url", url}, out, &errOut)
			if code != 0 {
				t.Fatalf("nightly: exit %d\n%s\n%s", code, out.buf.String(), errOut.String())
			}
			if out.runsAtFirst != 1 {
				t.Errorf("the report began with %d runs stored, want 1: the first run's report is written when it ends, not after all %d", out.runsAtFirst, due+1)
			}
			switch s := out.buf.String(); format {
			case "json":
				var runs []map[string]any
				if err := json.Unmarshal([]byte(s), &runs); err != nil || len(runs) != due+1 || runs[due]["period"] != "current" {
					t.Errorf("want a JSON array of %d runs, the last the current periods': %v\n%s", due+1, err, s)
				}
			case "csv":
				rows, err := csv.NewReader(strings.NewReader(s)).ReadAll()
				if err != nil || len(rows) != 1 || rows[0][0] != "run" {
					t.Errorf("want the CSV header once (no usage: no rows): %v\n%s", err, s)
				}
			case "text":
				if n := strings.Count(s, "Reconciliation "); n != due+1 {
					t.Errorf("%d reports, want %d:\n%s", n, due+1, s)
				}
			}
		})
	}
}

// brokenOut is a stdout that is closed.
type brokenOut struct{}

func (brokenOut) Write([]byte) (int, error) { return 0, errors.New("write /dev/stdout: broken pipe") }

// A nightly job whose stdout is closed still reconciles and closes every
// period due: the report stops, the job does not, and it exits 1.
func TestNightlyWithAClosedStdoutClosesEveryPeriod(t *testing.T) {
	url, pool := dailyCustomerSince(t, 3)
	var errOut bytes.Buffer
	code := execute(t.Context(), []string{"reconcile", "--nightly", "--grace", "0s", "--format", "json", "--database-url", url}, brokenOut{}, &errOut)
	var runs, closed int
	if err := pool.QueryRow(t.Context(), `SELECT (SELECT count(*) FROM reconciliation_runs), (SELECT count(*) FROM period_closes)`).Scan(&runs, &closed); err != nil {
		t.Fatal(err)
	}
	if code != 1 || runs != 4 || closed != 3 || !strings.Contains(errOut.String(), "broken pipe") {
		t.Fatalf("nightly with stdout closed: exit %d, %d runs, %d periods closed; want exit 1 naming the write error, 4 runs, 3 closed\n%s",
			code, runs, closed, errOut.String())
	}
}

// dailyCustomerSince is a new database (its URL and a pool closed with t)
// with one customer, acme, on a calendar of UTC days, created days days
// before today: that many ended periods, and today's.
func dailyCustomerSince(t *testing.T, days int) (string, *pgxpool.Pool) {
	t.Helper()
	url := pgtest.NewURL(t)
	pool, err := pgxpool.New(t.Context(), url)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pool.Close)
	if _, err := pool.Exec(t.Context(), `INSERT INTO customers (id, schedule, created_at) VALUES ('acme', '[{"effective_from":"0001-01-01T00:00:00Z",
		"calendar":{"cadence":"daily","anchor_day":0,"anchor_time":"00:00","zone":"UTC"}}]', date_trunc('day', now()) - make_interval(days => $1))`, days); err != nil {
		t.Fatal(err)
	}
	return url, pool
}
