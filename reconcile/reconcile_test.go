package reconcile_test

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/shopspring/decimal"

	"github.com/tally-ledger/tally/amount"
	"github.com/tally-ledger/tally/internal/pgtest"
	"github.com/tally-ledger/tally/ledger"
	"github.com/tally-ledger/tally/periods"
	"github.com/tally-ledger/tally/reconcile"
)

type env struct {
	t    testing.TB
	pool *pgxpool.Pool
	l    *ledger.Ledger
	rc   *reconcile.Reconciler
	now  time.Time
}

func newEnv(t testing.TB) *env {
	e := &env{t: t, pool: pgtest.New(t), now: time.Date(2026, 11, 20, 12, 0, 0, 0, time.UTC)}
	clock := func() time.Time { return e.now }
	var err error
	if e.l, err = ledger.New(ledger.Config{Clock: clock}); err != nil {
		t.Fatal(err)
	}
	if e.rc, err = reconcile.New(reconcile.Config{Pool: e.pool, Clock: clock}); err != nil {
		t.Fatal(err)
	}
	return e
}

// rec is record seq of stream producer/epoch for customer and meter "calls",
// whose quantity is q (total is given). Its operation id names all of them
// unambiguously: (g1, seq 1, total 10) and (g11, seq 1, total 0) are two
// operations.
func rec(producer string, epoch int64, customer string, seq int64, total, q string, at time.Time) ledger.Record {
	r := ledger.Record{
		OperationID: uuid.NewSHA1(uuid.NameSpaceOID, []byte(fmt.Sprintf("%q/%d/%q/%d/%s", producer, epoch, customer, seq, total))),
		Stream:      ledger.StreamKey{Producer: producer, Epoch: epoch, Customer: customer, Meter: "calls"},
		Seq:         seq, Total: amount.MustParse(total), OccurredAt: at,
	}
	if q != "" {
		r.Quantity = decimal.NewNullDecimal(amount.MustParse(q))
	}
	return r
}

func (e *env) apply(recs ...ledger.Record) []ledger.Outcome {
	e.t.Helper()
	var out []ledger.Outcome
	if err := pgx.BeginFunc(context.Background(), e.pool, func(tx pgx.Tx) error {
		var err error
		out, err = e.l.Apply(context.Background(), tx, recs)
		return err
	}); err != nil {
		e.t.Fatal(err)
	}
	return out
}

// indexesOnly makes every new session of e's database use indexes where
// they exist, as on tables of millions of rows (on a few thousand a
// sequential scan may look cheaper).
func (e *env) indexesOnly() {
	e.t.Helper()
	e.exec(`DO $$ BEGIN EXECUTE format('ALTER DATABASE %I SET enable_seqscan = off', current_database()); END $$`)
	e.pool.Reset()
}

// readsOf is how many rows of table Postgres's statistics say fn read (by
// sequential and index scans). A backend reports its statistics once
// idle, within a second or so, all of a transaction's at once: what was
// read before fn is let in first.
func (e *env) readsOf(table string, fn func()) int64 {
	e.t.Helper()
	read := func() int64 {
		var n int64
		if err := e.pool.QueryRow(context.Background(), `SELECT coalesce(seq_tup_read, 0) + coalesce(idx_tup_fetch, 0)
			FROM pg_stat_user_tables WHERE relname = $1`, table).Scan(&n); err != nil {
			e.t.Fatal(err)
		}
		return n
	}
	time.Sleep(1500 * time.Millisecond)
	before := read()
	fn()
	var n int64
	for deadline := time.Now().Add(15 * time.Second); n == 0 && time.Now().Before(deadline); {
		time.Sleep(100 * time.Millisecond)
		n = read() - before
	}
	return n
}

func (e *env) exec(sql string, args ...any) {
	e.t.Helper()
	if _, err := e.pool.Exec(context.Background(), sql, args...); err != nil {
		e.t.Fatal(err)
	}
}

func (e *env) run(opt reconcile.Options) *reconcile.Run {
	e.t.Helper()
	r, err := e.rc.Run(context.Background(), opt)
	if err != nil {
		e.t.Fatalf("run: %v", err)
	}
	return r
}

// only returns the findings of a kind, failing on any other discrepancy.
func findings(t *testing.T, r *reconcile.Run, kind string) []reconcile.Finding {
	t.Helper()
	var out []reconcile.Finding
	for _, f := range r.Findings {
		if f.Kind == kind {
			out = append(out, f)
		} else if f.Severity == reconcile.Discrepancy {
			t.Errorf("unexpected discrepancy %s: %s", f.Kind, f.Detail)
		}
	}
	return out
}

var nov = time.Date(2026, 11, 5, 10, 0, 0, 0, time.UTC)

// TestRecordsOfDifferentCustomersAreDifferentOperations: rec once joined its
// parts with fmt.Sprint, so customer g1's seq 1 at total 10 and g11's seq 1
// at total 0 had one operation id, and the second was a conflict
// (operation_reused). TestPropertyCloseGate, whose customers are g1, g2, ...
// across its examples, saw it as a conflicting record "applied" that its
// seed could not reproduce (the seed alone numbers customers from g1 again).
func TestRecordsOfDifferentCustomersAreDifferentOperations(t *testing.T) {
	e := newEnv(t)
	for _, o := range e.apply(rec("gw", 1, "g1", 1, "10", "10", nov), rec("gw", 1, "g11", 1, "0", "0", nov)) {
		if o.Kind != ledger.Applied {
			t.Fatalf("outcome %v (%s), want applied", o.Kind, o.Detail)
		}
	}
}

func TestCleanRunWithGapIsClean(t *testing.T) {
	e := newEnv(t)
	e.apply(rec("gw", 1, "acme", 1, "10", "10", nov), rec("gw", 1, "acme", 4, "40", "5", nov))
	r := e.run(reconcile.Options{Period: "2026-11-01"})
	if r.Status != reconcile.StatusClean {
		t.Fatalf("status %s: %+v", r.Status, r.Findings)
	}
	gaps := findings(t, r, reconcile.KindOpenGap)
	if len(gaps) != 1 || gaps[0].Amount.String() != "25" || gaps[0].Detail != "seqs 2-3 never arrived; their 25 is billed (inside the next record's total)" {
		t.Fatalf("gap findings: %+v", gaps)
	}
	if len(r.Totals) != 1 || r.Totals[0].Billed.String() != "40" || r.Totals[0].OpenGaps != 1 {
		t.Fatalf("totals: %+v", r.Totals)
	}
	if r.EntriesScanned != 2 {
		t.Fatalf("scanned %d", r.EntriesScanned)
	}
	stored, err := reconcile.Get(context.Background(), e.pool, r.ID)
	if err != nil || stored.Status != r.Status || len(stored.Findings) != 1 || stored.Totals[0].Billed.String() != "40" {
		t.Fatalf("stored: %+v, %v", stored, err)
	}
	var buf bytes.Buffer
	if err := reconcile.WriteReport(&buf, "text", r); err != nil || !strings.Contains(buf.String(), "Status: CLEAN") {
		t.Fatalf("report: %v\n%s", err, buf.String())
	}
}

// TestDailyRollupsInTheCustomersZone: daily rollups follow the local days
// of the period's zone; a run over a New York customer whose usage falls
// on the previous local day (UTC 03:00) is clean.
func TestDailyRollupsInTheCustomersZone(t *testing.T) {
	e := newEnv(t)
	e.exec(`INSERT INTO customers (id, schedule) VALUES ('ny', '[{"effective_from":"0001-01-01T00:00:00Z","calendar":{"cadence":"monthly","anchor_day":1,"anchor_time":"00:00","zone":"America/New_York"}}]')`)
	e.apply(rec("gw", 1, "ny", 1, "5", "5", time.Date(2026, 11, 6, 3, 0, 0, 0, time.UTC)),
		rec("gw", 1, "ny", 2, "12", "7", time.Date(2026, 11, 6, 5, 0, 0, 0, time.UTC)))
	var days string
	if err := e.pool.QueryRow(context.Background(), `SELECT string_agg(day || '=' || quantity, ' ' ORDER BY day) FROM rollups_daily`).Scan(&days); err != nil || days != "2026-11-05=5 2026-11-06=7" {
		t.Fatalf("daily rollups %q, %v", days, err)
	}
	if r := e.run(reconcile.Options{Period: "2026-11-01"}); r.Status != reconcile.StatusClean {
		t.Fatalf("status %s: %+v", r.Status, r.Findings)
	}
}

func TestEachFindingKind(t *testing.T) {
	e := newEnv(t)
	e.apply(rec("gw", 1, "acme", 1, "10", "10", nov), rec("gw", 1, "acme", 2, "15", "4", nov)) // quantity says 4, total grew 5
	e.apply(rec("gw", 2, "acme", 1, "7", "7", nov))                                            // epoch 1 abandoned
	conflicting := rec("gw", 1, "acme", 2, "16", "", nov)                                      // seq 2 again, other id
	if o := e.apply(conflicting); o[0].Kind != ledger.Conflict {
		t.Fatalf("setup: %v", o[0].Kind)
	}
	e.apply(rec("gw", 1, "bolt", 1, "3", "3", nov))
	e.apply(rec("gw", 1, "cole", 1, "2", "2", nov))
	// Corruption: rollups that drifted (bolt's hour and day alike, cole's
	// day alone), and a stream whose state drifted.
	e.exec(`UPDATE rollups SET quantity = quantity + 1 WHERE customer = 'bolt'`)
	e.exec(`UPDATE rollups_daily SET quantity = quantity + 1 WHERE customer = 'bolt'`)
	e.exec(`UPDATE rollups_daily SET quantity = quantity + 2 WHERE customer = 'cole'`)
	e.exec(`UPDATE streams SET last_total = 99 WHERE customer = 'acme' AND epoch = 2`)

	r := e.run(reconcile.Options{Period: "2026-11-01"})
	if r.Status != reconcile.StatusDiscrepancies {
		t.Fatalf("status %s", r.Status)
	}
	want := map[string]string{
		reconcile.KindQuantityMismatch: "notice acme calls gw/1 [-1]",
		reconcile.KindAbandoned:        "notice acme calls gw/1",
		reconcile.KindConflict:         "discrepancy acme calls gw/1",
		reconcile.KindRollupMismatch:   "discrepancy bolt calls [1]",
		reconcile.KindDailyMismatch:    "discrepancy cole calls [2]",
		reconcile.KindStreamMismatch:   "discrepancy acme calls gw/2 [-92]",
	}
	got := map[string]string{}
	for _, f := range r.Findings {
		s := strings.TrimSpace(fmt.Sprintf("%s %s %s %s", f.Severity, f.Customer, f.Meter, f.Stream))
		if f.Amount != nil {
			s += " [" + f.Amount.String() + "]"
		}
		got[f.Kind] = s
	}
	for k, w := range want {
		if got[k] != w {
			t.Errorf("%s: got %q, want %q", k, got[k], w)
		}
	}
	if len(got) != len(want) {
		t.Errorf("findings: %v", got)
	}
	// Per customer: bolt and acme both have discrepancies; neither may close.
	e.now = time.Date(2026, 12, 3, 0, 0, 0, 0, time.UTC)
	err := pgx.BeginFunc(context.Background(), e.pool, func(tx pgx.Tx) error {
		_, err := periods.Store{Clock: func() time.Time { return e.now }, Gate: reconcile.Gate}.Close(context.Background(), tx,
			periods.CloseRequest{Customer: "bolt", Period: "2026-11-01"})
		return err
	})
	if !errors.Is(err, periods.ErrNotReconciled) {
		t.Fatalf("close after a dirty run: %v", err)
	}
}

func TestLateUsageAfterClose(t *testing.T) {
	e := newEnv(t)
	oct := time.Date(2026, 10, 10, 0, 0, 0, 0, time.UTC)
	e.apply(rec("gw", 1, "acme", 1, "10", "10", oct))
	r := e.run(reconcile.Options{Period: "2026-10-01", Close: true})
	if r.Status != reconcile.StatusClean || len(r.Closed) != 1 {
		t.Fatalf("october: %s closed %v %+v", r.Status, r.Closed, r.Findings)
	}
	e.apply(rec("gw", 1, "acme", 2, "12", "2", oct)) // October usage, after the close
	r = e.run(reconcile.Options{Period: "2026-10-01"})
	late := findings(t, r, reconcile.KindLateAfterClose)
	if len(late) != 1 || late[0].Amount.String() != "2" || late[0].Period.Month() != time.November {
		t.Fatalf("late: %+v", late)
	}
}

func TestGateNeedsFreshCleanRun(t *testing.T) {
	e := newEnv(t)
	oct := time.Date(2026, 10, 10, 0, 0, 0, 0, time.UTC)
	e.apply(rec("gw", 1, "acme", 1, "10", "10", oct))
	e.now = time.Date(2026, 11, 1, 12, 0, 0, 0, time.UTC) // October is in grace
	r := e.run(reconcile.Options{Period: "2026-10-01", Close: true})
	if r.Status != reconcile.StatusClean || len(r.Closed) != 0 {
		t.Fatalf("in grace: %s, closed %v", r.Status, r.Closed)
	}
	e.apply(rec("gw", 1, "acme", 2, "11", "1", oct)) // more October usage after the run
	e.now = time.Date(2026, 11, 3, 0, 0, 0, 0, time.UTC)
	store := periods.Store{Clock: func() time.Time { return e.now }, Gate: reconcile.Gate}
	err := pgx.BeginFunc(context.Background(), e.pool, func(tx pgx.Tx) error {
		_, err := store.Close(context.Background(), tx, periods.CloseRequest{Customer: "acme", Period: "2026-10-01"})
		return err
	})
	if !errors.Is(err, periods.ErrNotReconciled) || !strings.Contains(err.Error(), "changed since run") {
		t.Fatalf("close on a stale run: %v", err)
	}
	runs, err := e.rc.Nightly(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	if len(runs) != 2 || runs[0].Period != "2026-10-01" || len(runs[0].Closed) != 1 || runs[1].Period != "current" {
		t.Fatalf("nightly: %+v", runs)
	}
	st, err := store.Statement(context.Background(), e.pool, "acme", "2026-10-01")
	if err != nil || !st.Final || st.ReconciliationID == nil || *st.ReconciliationID != runs[0].ID || st.Lines[0].Billed.String() != "11" {
		t.Fatalf("statement: %+v %v", st, err)
	}
}

func TestOverageIsReported(t *testing.T) {
	e := newEnv(t)
	e.apply(rec("gw", 1, "acme", 1, "120", "120", nov))
	e.exec(`INSERT INTO quota_overage (customer, meter, period_start, period, while_exceeded, while_stale, over_limit, updated_at)
		VALUES ('acme', 'calls', '2026-11-01T00:00:00Z', '2026-11-01', 15, 5, 20, now())`)
	r := e.run(reconcile.Options{Period: "2026-11-01"})
	over := findings(t, r, reconcile.KindOverage)
	if r.Status != reconcile.StatusClean || len(over) != 1 || over[0].Amount.String() != "20" ||
		over[0].Detail != "15 admitted while the quota was exceeded and 5 while its decision was stale (at most 20 over the limit)" {
		t.Fatalf("overage: %s %+v", r.Status, over)
	}
}

// What a pool's or the global lagged quota admitted over is reported too,
// as a finding of no one customer (its scope in the detail), in the runs
// of the customers it concerns: the global one in every run, a pool's in
// the runs of customers that were its members during the period.
func TestPoolAndGlobalOverageIsReported(t *testing.T) {
	e := newEnv(t)
	e.apply(rec("gw", 1, "acme", 1, "120", "120", nov))
	e.exec(`INSERT INTO pools (name, created_at, updated_at) VALUES ('team', '2026-10-01', '2026-10-01'), ('other', '2026-10-01', '2026-10-01')`)
	e.exec(`INSERT INTO pool_members (pool, customer, joined_at, actor) VALUES ('team', 'acme', '2026-10-01', 'test'), ('other', 'globex', '2026-10-01', 'test')`)
	e.exec(`INSERT INTO quota_overage (customer, meter, period_start, period, while_exceeded, while_stale, over_limit, updated_at)
		VALUES ('pool:team', 'calls', '2026-11-01T00:00:00Z', '2026-11-01', 7, 0, 7, now()),
		       ('pool:other', 'calls', '2026-11-01T00:00:00Z', '2026-11-01', 3, 0, 3, now()),
		       ('global', 'calls', '2026-11-01T00:00:00Z', '2026-11-01', 0, 4, 0, now()),
		       ('global', 'calls', '2026-10-01T00:00:00Z', '2026-10-01', 9, 0, 9, now())`)
	r := e.run(reconcile.Options{Period: "2026-11-01", Customer: "acme"})
	over := findings(t, r, reconcile.KindOverage)
	var got []string
	for _, f := range over {
		if f.Customer != "" || f.Period == nil || !f.Period.Equal(time.Date(2026, 11, 1, 0, 0, 0, 0, time.UTC)) {
			t.Errorf("a scope's overage names customer %q, period %v", f.Customer, f.Period)
		}
		got = append(got, f.Amount.String()+" "+f.Detail)
	}
	want := []string{
		"4 global/calls: 0 admitted while the quota was exceeded and 4 while its decision was stale (at most 0 over the limit)",
		"7 pool:team/calls: 7 admitted while the quota was exceeded and 0 while its decision was stale (at most 7 over the limit)",
	}
	if r.Status != reconcile.StatusClean || !slices.Equal(got, want) {
		t.Fatalf("overage: %s\n%s", r.Status, strings.Join(got, "\n"))
	}
}

func TestDeadLettersAndConservation(t *testing.T) {
	e := newEnv(t)
	e.apply(rec("gw", 1, "acme", 1, "10", "10", nov))
	e.exec(`INSERT INTO ingest_partitions (topic, partition, next_offset, messages_in, messages_rejected) VALUES ('tally.meter-batches', 0, 8, 8, 1)`)
	e.exec(`INSERT INTO dead_letters (id, topic, partition, "offset", reason, detail, key, raw, created_at)
		VALUES ('019a3c8e-7a40-7000-8000-0000000000d1', 'tally.meter-batches', 0, 7, 'bad_json', 'invalid JSON at offset 3', 'acme', '{"sch', $1)`, nov)
	r := e.run(reconcile.Options{Period: "2026-11-01"})
	dl := findings(t, r, reconcile.KindDeadLetter)
	if r.Status != reconcile.StatusDiscrepancies || len(dl) != 1 || !strings.Contains(dl[0].Detail, "partition 0 offset 7): bad_json") {
		t.Fatalf("dead letter: %s %+v", r.Status, dl)
	}
	// Tampering: a refused message without its dead letter breaks conservation.
	e.exec(`UPDATE ingest_partitions SET messages_rejected = 2`)
	r = e.run(reconcile.Options{Period: "2026-11-01"})
	var cons []reconcile.Finding
	for _, f := range r.Findings {
		if f.Kind == reconcile.KindConservation {
			cons = append(cons, f)
		}
	}
	if len(cons) != 1 || cons[0].Detail != "tally.meter-batches/0: 2 messages and records refused, but 1 dead letters kept" {
		t.Fatalf("conservation: %+v", cons)
	}
}

func TestLateFillNotReattributed(t *testing.T) {
	e := newEnv(t)
	oct := time.Date(2026, 10, 30, 0, 0, 0, 0, time.UTC)
	e.apply(rec("gw", 1, "acme", 1, "10", "10", oct))
	e.exec(`INSERT INTO period_closes (customer, period_start, period_end, closed_at, statement, forced, reason, actor)
		VALUES ('acme', '2026-10-01T00:00:00Z', '2026-11-01T00:00:00Z', now(), '{}', true, 'test', 'test')`)
	e.apply(rec("gw", 1, "acme", 3, "30", "10", nov))                                         // seq 2 lost so far; its usage is billed in November
	if o := e.apply(rec("gw", 1, "acme", 2, "20", "10", oct)); o[0].Kind != ledger.LateFill { // it happened in closed October
		t.Fatalf("fill: %v", o[0].Kind)
	}
	r := e.run(reconcile.Options{Period: "2026-10-01"})
	nr := findings(t, r, reconcile.KindNotReattributed)
	if len(nr) != 1 || nr[0].Amount.String() != "10" || nr[0].Severity != reconcile.Notice {
		t.Fatalf("not reattributed: %+v", nr)
	}
	// October is closed: the period it was noticed in, which still gates a
	// close, reports it too.
	r = e.run(reconcile.Options{Period: "2026-11-01"})
	if nr := findings(t, r, reconcile.KindNotReattributed); len(nr) != 1 {
		t.Fatalf("november: %+v", r.Findings)
	}
}

// TestUnreadableNumberFailsTheRun: a NUMERIC the run cannot read as an
// exact decimal (here NaN in a tampered rollup) fails the run; it is never
// read as zero.
func TestUnreadableNumberFailsTheRun(t *testing.T) {
	e := newEnv(t)
	e.apply(rec("gw", 1, "acme", 1, "10", "10", nov))
	e.exec(`UPDATE rollups SET quantity = 'NaN'`)
	r, err := e.rc.Run(context.Background(), reconcile.Options{Period: "2026-11-01"})
	if err == nil || r == nil || r.Status != reconcile.StatusFailed {
		t.Fatalf("run over a NaN rollup: %v %+v", err, r)
	}
}

// A run checks each stream's billed deltas against its last total from
// where the last clean run left it, not over the stream's whole life:
// records are never changed, and one arriving at or below a stream's
// last seq is a late fill, billed nothing, so what a run found adding up
// stays added up. A stream billed hourly since June (3,000 records)
// costs November's second run, and its close, the records since the
// first; a stream broken since that run is still found.
func TestStreamTotalsAreCheckedFromTheLastCleanRun(t *testing.T) {
	e := newEnv(t)
	june := time.Date(2026, 6, 1, 0, 0, 0, 0, time.UTC)
	var recs []ledger.Record
	for i := range int64(3000) {
		recs = append(recs, rec("gw", 1, "acme", i+1, fmt.Sprint(2*(i+1)), "2", june.Add(time.Duration(i)*time.Hour)))
		if len(recs) == 500 {
			e.apply(recs...)
			recs = nil
		}
	}
	e.apply(append(recs, rec("gw", 1, "acme", 3001, "6010", "8", nov))...)
	e.indexesOnly()
	if r := e.run(reconcile.Options{Period: "2026-11-01"}); r.Status != reconcile.StatusClean {
		t.Fatalf("first run: %s %+v", r.Status, r.Findings)
	}
	e.apply(rec("gw", 1, "acme", 3002, "6011", "1", nov.Add(time.Hour)), rec("gw", 1, "acme", 3003, "6013", "2", nov.Add(2*time.Hour)))
	var r *reconcile.Run
	// One customer's run (a run of every customer reads the period's
	// records by a scan of the table: qRollupsCheck).
	read := e.readsOf("records", func() { r = e.run(reconcile.Options{Period: "2026-11-01", Customer: "acme"}) })
	t.Logf("November's second run read %d records", read)
	if read > 50 {
		t.Fatalf("November's second run read %d records, want those since the first run's (at most 50)", read)
	}
	if r.Status != reconcile.StatusClean {
		t.Fatalf("second run: %s %+v", r.Status, r.Findings)
	}
	e.now = time.Date(2026, 12, 3, 0, 0, 0, 0, time.UTC) // November's grace has ended
	var err error
	read = e.readsOf("records", func() { _, err = e.close("acme", "2026-11-01") })
	t.Logf("November's close read %d records", read)
	if err != nil || read > 50 {
		t.Fatalf("close: %v, after reading %d records (want at most 50)", err, read)
	}
	// A stream whose last total no longer adds up is found as before.
	e.exec(`UPDATE streams SET last_total = last_total + 1 WHERE customer = 'acme'`)
	r = e.run(reconcile.Options{Period: "2026-12-01"})
	if got := findings(t, r, reconcile.KindStreamMismatch); len(got) != 1 {
		t.Fatalf("tampered stream: %+v", r.Findings)
	}
}
