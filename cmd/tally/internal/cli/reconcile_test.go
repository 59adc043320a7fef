package cli

import (
	"bytes"
	"context"
	"encoding/csv"
	"encoding/json"
	"errors"
	"net"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/shopspring/decimal"

	"github.com/tally-ledger/tally/internal/kafkatest"
	"github.com/tally-ledger/tally/internal/pgtest"
	"github.com/tally-ledger/tally/quota"
)

// TestReconcileValidatesFlagsFirst: a bad --format is refused before the
// run is stored or any period closed.
func TestReconcileValidatesFlagsFirst(t *testing.T) {
	url := pgtest.NewURL(t)
	_, err := runTally(t, "reconcile", "--database-url", url, "--period", "2026-10-01", "--close", "--format", "yaml")
	if err == nil || !strings.Contains(err.Error(), "format") {
		t.Fatalf("bad format: %v", err)
	}
	pool, err := pgxpool.New(context.Background(), url)
	if err != nil {
		t.Fatal(err)
	}
	defer pool.Close()
	var n int
	if err := pool.QueryRow(context.Background(), `SELECT count(*) FROM reconciliation_runs`).Scan(&n); err != nil || n != 0 {
		t.Fatalf("runs stored despite a bad flag: %d %v", n, err)
	}
}

// TestReconcileAccept: an accepted dead letter is recorded with who and why.
func TestReconcileAccept(t *testing.T) {
	url := pgtest.NewURL(t)
	pool, err := pgxpool.New(context.Background(), url)
	if err != nil {
		t.Fatal(err)
	}
	defer pool.Close()
	if _, err := pool.Exec(context.Background(), `INSERT INTO dead_letters (id, topic, partition, "offset", reason, detail, key, raw, created_at)
		VALUES ('019a3c8e-7a40-7000-8000-0000000000d4', 't', 0, 1, 'schema', 'x', 'newco', '{}', now())`); err != nil {
		t.Fatal(err)
	}
	if _, err := runTally(t, "reconcile", "accept", "--database-url", url, "--dead-letter", "019a3c8e-7a40-7000-8000-0000000000d4", "--actor", "alice"); err == nil {
		t.Fatal("accepted without a reason")
	}
	out, err := runTally(t, "reconcile", "accept", "--database-url", url, "--dead-letter", "019a3c8e-7a40-7000-8000-0000000000d4",
		"--actor", "alice", "--reason", "test traffic")
	if err != nil || !strings.Contains(out, "accepted") {
		t.Fatalf("accept: %q %v", out, err)
	}
	var actor, reason string
	if err := pool.QueryRow(context.Background(), `SELECT actor, reason FROM reconciliation_acceptances`).Scan(&actor, &reason); err != nil ||
		actor != "alice" || reason != "test traffic" {
		t.Fatalf("acceptance: %s %s %v", actor, reason, err)
	}
}

// TestReconcileAcceptUnknownID: accepting a dead letter or an offset jump
// that does not exist says which one is missing, not that a
// reconciliation run is.
func TestReconcileAcceptUnknownID(t *testing.T) {
	url := pgtest.NewURL(t)
	const id = "019a3c8e-7a40-7000-8000-0000000000f9"
	for flag, want := range map[string]string{"--dead-letter": "dead letter " + id + " not found", "--offset-jump": "offset jump " + id + " not found"} {
		_, err := runTally(t, "reconcile", "accept", "--database-url", url, flag, id, "--actor", "alice", "--reason", "r")
		if err == nil || err.Error() != want {
			t.Errorf("accept %s unknown: got %v; want %q", flag, err, want)
		}
	}
}

// TestReconcileGatedCustomer: a customer with a quota rule and no usage yet
// is a customer: reconciling it finds an empty, clean period instead of
// refusing an "unknown customer".
func TestReconcileGatedCustomer(t *testing.T) {
	url := pgtest.NewURL(t)
	pool, err := pgxpool.New(context.Background(), url)
	if err != nil {
		t.Fatal(err)
	}
	defer pool.Close()
	if _, err := quota.PutRuleDB(context.Background(), pool, quota.RuleInput{
		Customer: "newco2", Meter: "calls", Limit: decimal.RequireFromString("500"), Admission: quota.Exact, Actor: "admin"}); err != nil {
		t.Fatal(err)
	}
	out, err := runTally(t, "reconcile", "--database-url", url, "--period", "current", "--customer", "newco2")
	if err != nil {
		t.Fatalf("reconcile --customer newco2: %v\n%s", err, out)
	}
	if !strings.Contains(out, "newco2") {
		t.Fatalf("the report does not name newco2:\n%s", out)
	}
}

// countRuns is the number of reconciliation runs stored in the database.
func countRuns(t *testing.T, url string) int {
	t.Helper()
	pool, err := pgxpool.New(context.Background(), url)
	if err != nil {
		t.Fatal(err)
	}
	defer pool.Close()
	var n int
	if err := pool.QueryRow(context.Background(), `SELECT count(*) FROM reconciliation_runs`).Scan(&n); err != nil {
		t.Fatal(err)
	}
	return n
}

// TestReconcileDeepBrokers: --deep reads Kafka at the documented default
// broker (docs/operations.md: TALLY_KAFKA_BROKERS defaults to
// 127.0.0.1:9092 for reconcile --deep), and an empty or invalid broker
// setting is refused, naming the flag and the variable, before any run is
// stored.
func TestReconcileDeepBrokers(t *testing.T) {
	t.Setenv("TALLY_KAFKA_BROKERS", "") // restored at the end
	os.Unsetenv("TALLY_KAFKA_BROKERS")
	help, err := runTally(t, "reconcile", "--help")
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(help, `--kafka-brokers string`) || !strings.Contains(help, `(default "127.0.0.1:9092")`) {
		t.Errorf("reconcile --help shows no default broker:\n%s", help)
	}

	url := pgtest.NewURL(t)
	for _, tc := range []struct {
		env  *string
		args []string
	}{
		{nil, []string{"--kafka-brokers", ""}},
		{nil, []string{"--kafka-brokers", " , "}},
		{nil, []string{"--kafka-brokers", "kafka-1:"}},
		{nil, []string{"--kafka-brokers", "::1"}},
		{nil, []string{"--kafka-brokers", "127.0.0.1:9092,kafka-2:port"}},
		{ptr(""), nil},
		{ptr("kafka-1:0"), nil},
	} {
		if tc.env != nil {
			t.Setenv("TALLY_KAFKA_BROKERS", *tc.env)
		}
		args := append([]string{"reconcile", "--database-url", url, "--period", "current", "--deep"}, tc.args...)
		out, err := runTally(t, args...)
		if err == nil || !strings.Contains(err.Error(), "--kafka-brokers") || !strings.Contains(err.Error(), "TALLY_KAFKA_BROKERS") {
			t.Errorf("%v (TALLY_KAFKA_BROKERS %v): got %v; want an error naming --kafka-brokers and TALLY_KAFKA_BROKERS", tc.args, tc.env, err)
		}
		if out != "" {
			t.Errorf("%v: a report was printed besides the error:\n%s", tc.args, out)
		}
		if n := countRuns(t, url); n != 0 {
			t.Fatalf("%v: %d runs stored despite the broker setting", tc.args, n)
		}
		os.Unsetenv("TALLY_KAFKA_BROKERS")
	}
	// Without --deep the brokers are not used, so not checked.
	t.Setenv("TALLY_KAFKA_BROKERS", "")
	if _, err := runTally(t, "reconcile", "--database-url", url, "--period", "current"); err != nil {
		t.Errorf("reconcile without --deep, TALLY_KAFKA_BROKERS empty: %v", err)
	}
}

func ptr[T any](v T) *T { return &v }

// TestReconcileCSVNamesTheResolvedPeriod: with --period current, every
// row of the CSV report, findings included, names the period the
// reference resolved to (its start date), never "current".
func TestReconcileCSVNamesTheResolvedPeriod(t *testing.T) {
	url := pgtest.NewURL(t)
	pool, err := pgxpool.New(context.Background(), url)
	if err != nil {
		t.Fatal(err)
	}
	defer pool.Close()
	if _, err := quota.PutRuleDB(context.Background(), pool, quota.RuleInput{
		Customer: "newco3", Meter: "calls", Limit: decimal.RequireFromString("500"), Admission: quota.Exact, Actor: "admin"}); err != nil {
		t.Fatal(err)
	}
	// A dead letter of newco3, and one of a customer the ledger does not
	// know (a finding of every customer's period).
	if _, err := pool.Exec(context.Background(), `INSERT INTO dead_letters (id, topic, partition, "offset", reason, detail, key, raw, created_at)
		VALUES ('019a3c8e-7a40-7000-8000-0000000000d5', 't', 0, 1, 'schema', 'x', 'newco3', '{}', now()),
		       ('019a3c8e-7a40-7000-8000-0000000000d6', 't', 0, 2, 'schema', 'x', 'ghost', '{}', now())`); err != nil {
		t.Fatal(err)
	}
	before := time.Now().UTC().Format("2006-01") + "-01" // the default calendar: monthly, UTC
	out, err := runTally(t, "reconcile", "--database-url", url, "--period", "current", "--customer", "newco3", "--format", "csv")
	var ee *ExitError
	if !errors.As(err, &ee) || ee.Code != 3 {
		t.Fatalf("reconcile: %v, want exit 3 (the dead letters)\n%s", err, out)
	}
	rows, err := csv.NewReader(strings.NewReader(out)).ReadAll()
	if err != nil {
		t.Fatal(err)
	}
	after := time.Now().UTC().Format("2006-01") + "-01"
	// The month may have ended during the run (then either month is right),
	// but the reference resolved once: every row names the same period.
	resolved := ""
	if len(rows) > 1 {
		resolved = rows[1][1]
	}
	if resolved != before && resolved != after {
		t.Errorf("the first row names period %q, want %q", resolved, before)
	}
	findings := 0
	for _, row := range rows[1:] {
		if row[3] == "finding" {
			findings++
		}
		if row[1] != resolved {
			t.Errorf("a %s row names period %q, want %q as the first row: %v", row[3], row[1], resolved, row)
		}
	}
	if findings != 2 {
		t.Errorf("%d finding rows, want 2:\n%s", findings, out)
	}
}

// An empty --customer (an unset shell variable: --customer "$C") is not
// "every customer": with --close it closed every customer's period, which
// nothing undoes. It is a usage error naming the flag, and nothing runs.
func TestReconcileEmptyCustomerClosesNothing(t *testing.T) {
	db := pgtest.NewURL(t)
	pool, err := pgxpool.New(t.Context(), db)
	if err != nil {
		t.Fatal(err)
	}
	defer pool.Close()
	if _, err := pool.Exec(t.Context(), `INSERT INTO customers (id, schedule) SELECT c, '[{"effective_from":"0001-01-01T00:00:00Z",
		"calendar":{"cadence":"monthly","anchor_day":1,"anchor_time":"00:00","zone":"UTC"}}]' FROM unnest(ARRAY['acme','globex']) c`); err != nil {
		t.Fatal(err)
	}
	var out, errOut bytes.Buffer
	code := execute(t.Context(), []string{"reconcile", "--period", "2026-10-01", "--customer", "", "--close", "--grace", "0s",
		"--database-url", db}, &out, &errOut)
	var closed int
	if err := pool.QueryRow(t.Context(), `SELECT count(*) FROM period_closes`).Scan(&closed); err != nil {
		t.Fatal(err)
	}
	if code != exitUsage || closed != 0 || !strings.Contains(errOut.String(), "--customer") {
		t.Fatalf(`reconcile --customer "" --close: exit %d, %d periods closed, want exit 2 naming --customer and none closed; stdout:
%s
stderr:
%s`, code, closed, out.String(), errOut.String())
	}
}

// reconcile --nightly --format json is an array of runs however many
// periods were due: on a night with none due (only the current periods'
// check) it was that one run's object, so a job reading an array failed
// on quiet nights. A --period run that never started (an unknown
// customer) prints no report: it printed "null" (json) or a bare CSV
// header on stdout.
func TestReconcileJSONShapeDoesNotDependOnTheData(t *testing.T) {
	db := pgtest.NewURL(t)
	var runs []map[string]any
	out, err := runTally(t, "reconcile", "--nightly", "--format", "json", "--database-url", db)
	if err != nil || json.Unmarshal([]byte(out), &runs) != nil || len(runs) != 1 || runs[0]["period"] != "current" {
		t.Fatalf("nightly with nothing due: %v; want an array of one run (the current periods'), got:\n%s", err, out)
	}
	for _, format := range []string{"json", "csv", "text"} {
		out, err := runTally(t, "reconcile", "--period", "previous", "--customer", "nobody", "--format", format, "--database-url", db)
		if err == nil || out != "" {
			t.Errorf("--format %s for an unknown customer: %v; want an error and nothing on stdout, got %q", format, err, out)
		}
	}
}

// reconcile --deep reads its brokers as serve does: a bare host is the
// host at Kafka's default port (it was refused, "not a host:port", while
// serve took it). The test's broker stands at a port of its own, made
// the default for the test, so that the machine's 9092 may be in use.
func TestReconcileDeepTakesABareHost(t *testing.T) {
	k := kafkatest.New(t, kafkatest.Options{Topics: []kafkatest.Topic{{Name: "tally.meter-batches", Partitions: 1}}})
	host, port, err := net.SplitHostPort(k.Addrs[0])
	if err != nil {
		t.Fatal(err)
	}
	was := defaultKafkaPort
	defaultKafkaPort = port
	t.Cleanup(func() { defaultKafkaPort = was })
	url := pgtest.NewURL(t)
	out, err := runTally(t, "reconcile", "--database-url", url, "--period", "current", "--deep", "--kafka-brokers", host)
	if err != nil || !strings.Contains(out, "deep") {
		t.Fatalf("reconcile --deep --kafka-brokers %s (port %s by default): %v\n%s", host, port, err, out)
	}
}
