package reconcile

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"sort"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/shopspring/decimal"

	"github.com/tally-ledger/tally/internal/locks"
	"github.com/tally-ledger/tally/periods"
)

// Statuses of a run.
const (
	StatusRunning       = "running"
	StatusClean         = "clean"
	StatusDiscrepancies = "discrepancies"
	StatusFailed        = "failed"
)

// ErrBusy: another run for the same period is in progress.
var ErrBusy = errors.New("another reconciliation of this period is running")

// Config configures a Reconciler.
type Config struct {
	Pool   *pgxpool.Pool
	Logger *slog.Logger     // default: discard
	Clock  func() time.Time // default time.Now
	Grace  time.Duration    // default periods.DefaultGrace; periods.NoGrace for none
	// Progress, when set, receives human progress lines (a terminal): per
	// check, per nightly period, and how far the closes are; logs go to
	// Logger either way.
	Progress io.Writer
	// Deep re-reads Kafka for --deep runs; nil makes the deep check fail
	// with a clear message.
	Deep DeepSource
	// MaxFindings bounds how many findings of one kind a run keeps,
	// stores and reports (default DefaultMaxFindings); the rest are
	// counted in one summary finding per kind and severity.
	MaxFindings int
}

// DefaultMaxFindings is how many findings of one kind a run lists unless
// Config.MaxFindings says otherwise: a ledger broken in a systematic way
// (a finding per stream, per gap or per record) would otherwise make a
// run hold, store and report millions of them.
const DefaultMaxFindings = 10000

// Validate reports every configuration problem.
func (c Config) Validate() error {
	var errs []error
	if c.Pool == nil {
		errs = append(errs, errors.New("reconcile: Pool is required"))
	}
	if err := periods.ValidateGrace(c.Grace); err != nil {
		errs = append(errs, err)
	}
	if c.MaxFindings < 0 {
		errs = append(errs, fmt.Errorf("reconcile: MaxFindings %d is negative (0: the default, %d)", c.MaxFindings, DefaultMaxFindings))
	}
	return errors.Join(errs...)
}

// Reconciler runs reconciliations.
type Reconciler struct {
	cfg Config
	log *slog.Logger
}

// New returns a Reconciler.
func New(cfg Config) (*Reconciler, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	if cfg.Clock == nil {
		cfg.Clock = time.Now
	}
	if cfg.Grace == 0 {
		cfg.Grace = periods.DefaultGrace
	}
	if cfg.MaxFindings == 0 {
		cfg.MaxFindings = DefaultMaxFindings
	}
	log := cfg.Logger
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	return &Reconciler{cfg: cfg, log: log}, nil
}

// Options select what a run covers.
type Options struct {
	Period   string // a period start date, "previous" or "current"
	Customer string // empty: every customer that has this period
	Close    bool   // close the periods of customers found clean (if their grace has ended)
	Deep     bool   // also recompute totals from Kafka's messages
}

// Finding is one thing a run found.
type Finding struct {
	Kind     string           `json:"kind"`
	Severity string           `json:"severity"`
	Customer string           `json:"customer,omitempty"`
	Meter    string           `json:"meter,omitempty"`
	Stream   string           `json:"stream,omitempty"` // producer/epoch
	Period   *time.Time       `json:"period_start,omitempty"`
	Amount   *decimal.Decimal `json:"amount,omitempty"`
	Detail   string           `json:"detail"`
	// PeriodName is the name of the period the finding is about (the
	// reference resolved, e.g. "current" to "2026-12-01"): its customer's,
	// or, for a finding of no customer of the run, the one all its
	// customers share (empty when their calendars differ). Not stored:
	// empty in a run loaded with Get.
	PeriodName string `json:"-"`
	// Omitted is set on a summary finding only: how many findings of its
	// kind and severity the run found beyond Config.MaxFindings and did
	// not list.
	Omitted int `json:"omitted,omitempty"`
}

// Total is what the run saw billed for one customer and meter.
type Total struct {
	Customer    string          `json:"customer"`
	Meter       string          `json:"meter"`
	Period      string          `json:"period"`
	Billed      decimal.Decimal `json:"billed"`
	Usage       decimal.Decimal `json:"usage"`
	PriorPeriod decimal.Decimal `json:"prior_period_adjustments"`
	Adjustments decimal.Decimal `json:"adjustments"`
	OpenGaps    int             `json:"open_gaps"`
	GapAmount   decimal.Decimal `json:"gap_amount"` // billed usage of seqs never received (when known)
}

// Check is the outcome of one check.
type Check struct {
	Name   string `json:"name"`
	Status string `json:"status"` // ok, findings, skipped
	Detail string `json:"detail,omitempty"`
}

// Run is a stored reconciliation run.
type Run struct {
	ID             uuid.UUID  `json:"id"`
	Period         string     `json:"period"`
	Customer       string     `json:"customer,omitempty"`
	Deep           bool       `json:"deep"`
	Status         string     `json:"status"`
	StartedAt      time.Time  `json:"started_at"`
	FinishedAt     *time.Time `json:"finished_at,omitempty"`
	EntriesScanned int64      `json:"entries_scanned"`
	Checks         []Check    `json:"checks"`
	Totals         []Total    `json:"totals"`
	Findings       []Finding  `json:"findings"`
	Closed         []string   `json:"closed,omitempty"` // customers whose period this run closed
	Error          string     `json:"error,omitempty"`
}

// Discrepancies counts the findings that block a close, those a summary
// finding stands for included.
func (r *Run) Discrepancies() int {
	return r.count(Discrepancy)
}

// Notices counts the findings that do not block a close, those a summary
// finding stands for included.
func (r *Run) Notices() int {
	return r.count(Notice)
}

func (r *Run) count(severity string) int {
	n := 0
	for _, f := range r.Findings {
		if f.Severity == severity {
			n += f.stands()
		}
	}
	return n
}

// stands is how many findings f stands for: the omitted ones for a
// summary finding, else itself.
func (f Finding) stands() int {
	if f.Omitted > 0 {
		return f.Omitted
	}
	return 1
}

type runner struct {
	run      *Run
	totals   map[[2]string]*Total
	periodOf map[string]string // customer -> period name
	usage    map[string][]meterUsage
	// rollups is the sum of the targets' hourly rollups per customer and
	// meter, as the rollup check read them (what each meter bills).
	rollups   map[[2]string]decimal.Decimal
	scanned   int64
	hasIngest bool
	// whole: stream totals are summed over every record (a deep run), not
	// from where a run last found them adding up.
	whole bool

	// What find counted: the run lists at most max findings of a kind
	// (listed), and counts the rest per kind and severity (omitted); found
	// is every finding, listed or not. A verdict rests on every finding:
	// dirty holds each customer of the run with a discrepancy, global says
	// a discrepancy had no customer (it blocks every close).
	max     int
	found   int
	listed  map[string]int
	omitted map[[2]string]int
	dirty   map[string]bool
	global  bool
}

func (r *runner) total(customer, meter string) *Total {
	k := [2]string{customer, meter}
	t := r.totals[k]
	if t == nil {
		t = &Total{Customer: customer, Meter: meter, Period: r.periodOf[customer]}
		r.totals[k] = t
	}
	return t
}

// find records a finding: it is counted, and listed unless the run
// already lists max findings of its kind, so a run holds a bounded number
// of findings however many the ledger makes.
func (r *runner) find(f Finding) {
	r.found++
	if f.Severity == Discrepancy {
		if f.Customer == "" {
			r.global = true
		} else if _, ok := r.periodOf[f.Customer]; ok {
			r.dirty[f.Customer] = true
		}
	}
	if r.listed[f.Kind] >= r.max {
		r.omitted[[2]string{f.Kind, f.Severity}]++
		return
	}
	r.listed[f.Kind]++
	if f.PeriodName == "" {
		f.PeriodName = r.periodName(f.Customer)
	}
	r.run.Findings = append(r.run.Findings, f)
}

// summarize lists, after the findings, one summary finding per kind and
// severity that had findings not listed, saying how many (in Omitted and
// in its detail), in kind and severity order.
func (r *runner) summarize() {
	keys := make([][2]string, 0, len(r.omitted))
	for k := range r.omitted {
		keys = append(keys, k)
	}
	sort.Slice(keys, func(i, j int) bool {
		return keys[i][0] < keys[j][0] || keys[i][0] == keys[j][0] && keys[i][1] < keys[j][1]
	})
	for _, k := range keys {
		n := r.omitted[k]
		r.run.Findings = append(r.run.Findings, Finding{Kind: k[0], Severity: k[1], Omitted: n, PeriodName: r.periodName(""),
			Detail: fmt.Sprintf("%d more %s findings (%s) not listed: a run lists the first %d findings of each kind; the ledger is likely broken in a systematic way",
				n, k[0], k[1], r.max)})
	}
}

// periodName is the name of customer's period in the run; for a customer
// not in the run (none, or one the ledger does not know), the name every
// customer's period shares, or "" when they differ.
func (r *runner) periodName(customer string) string {
	if n, ok := r.periodOf[customer]; ok {
		return n
	}
	name := ""
	for _, n := range r.periodOf {
		if name != "" && n != name {
			return ""
		}
		name = n
	}
	return name
}

// Run reconciles one period (for one customer or all), stores the run and
// returns it. A run that could not complete is stored as failed and
// returned with the error.
func (rc *Reconciler) Run(ctx context.Context, opt Options) (*Run, error) {
	if opt.Period == "" {
		return nil, errors.New("reconcile: a period is required (a start date such as 2026-11-01, or previous)")
	}
	now := rc.cfg.Clock().UTC()
	// One run per period at a time, across processes: session locks on a
	// dedicated connection, one per period the reference resolves to in
	// the customers' calendars ("previous" and its date are one period),
	// released when the run ends. The connection is the run's own, not
	// the pool's: the checks take a connection of the pool while the
	// locks are held, so runs holding every connection of the pool with
	// their locks would each wait for another forever.
	conn, err := pgx.ConnectConfig(ctx, rc.cfg.Pool.Config().ConnConfig.Copy())
	if err != nil {
		return nil, fmt.Errorf("reconcile: %w", err)
	}
	defer conn.Close(context.WithoutCancel(ctx))
	locks := &runLocks{conn: conn, held: map[string]bool{}}
	defer locks.release(context.WithoutCancel(ctx))
	if err := pgx.BeginTxFunc(ctx, rc.cfg.Pool, pgx.TxOptions{AccessMode: pgx.ReadOnly}, func(tx pgx.Tx) error {
		_, by, err := rc.targets(ctx, tx, opt, now)
		if err != nil {
			return err
		}
		return locks.lockAll(ctx, by)
	}); err != nil {
		return nil, err
	}

	run := &Run{ID: uuid.Must(uuid.NewV7()), Period: opt.Period, Customer: opt.Customer, Deep: opt.Deep,
		Status: StatusRunning, StartedAt: now.Truncate(time.Microsecond), Findings: []Finding{}, Checks: []Check{}, Totals: []Total{}}
	// The run is marked alive before it is stored as running, so a run
	// stored as running whose mark nobody holds is one whose process died:
	// it is stored as failed now, not shown as running forever.
	if err := locks.markAlive(ctx, run.ID); err != nil {
		return nil, err
	}
	if err := rc.failAbandoned(ctx); err != nil {
		return nil, err
	}
	if _, err := rc.cfg.Pool.Exec(ctx, qRunInsert, pgx.StrictNamedArgs{"id": run.ID, "period": run.Period, "customer": nullable(run.Customer),
		"deep": run.Deep, "status": run.Status, "started_at": run.StartedAt}); err != nil {
		return nil, fmt.Errorf("reconcile: store run: %w", err)
	}
	rc.log.Info("reconciliation started", "run", run.ID, "period", opt.Period, "customer", opt.Customer, "deep", opt.Deep)

	verdicts, err := rc.check(ctx, run, opt, now, locks)
	if err != nil {
		run.Status, run.Error = StatusFailed, err.Error()
		rc.log.Error("reconciliation failed", "run", run.ID, "err", err)
	} else if run.Discrepancies() > 0 {
		run.Status = StatusDiscrepancies
	} else {
		run.Status = StatusClean
	}
	fin := rc.cfg.Clock().UTC().Truncate(time.Microsecond)
	run.FinishedAt = &fin
	if serr := rc.store(context.WithoutCancel(ctx), run, verdicts); serr != nil {
		return run, errors.Join(err, serr)
	}
	if err != nil {
		return run, err
	}
	if opt.Close {
		if err := rc.closeClean(ctx, run, verdicts, now); err != nil {
			return run, err
		}
	}
	rc.log.Info("reconciliation finished", "run", run.ID, "status", run.Status, "findings", run.Discrepancies()+run.Notices(),
		"listed", len(run.Findings), "discrepancies", run.Discrepancies(), "entries_scanned", run.EntriesScanned, "took", fin.Sub(run.StartedAt))
	return run, nil
}

// runLockSpace: see internal/locks.ReconcileRun.
const runLockSpace = locks.ReconcileRun

// runAliveSpace: see internal/locks.ReconcileRunAlive.
const runAliveSpace = locks.ReconcileRunAlive

// runLocks are the period locks of one run, and the mark that it is
// alive, held on one connection.
type runLocks struct {
	conn  *pgx.Conn
	held  map[string]bool
	alive *uuid.UUID
}

// markAlive takes the lock of run id, held until release.
func (l *runLocks) markAlive(ctx context.Context, id uuid.UUID) error {
	if _, err := l.conn.Exec(ctx, qRunAliveLock, runAliveSpace, id.String()); err != nil {
		return fmt.Errorf("reconcile: lock: %w", err)
	}
	l.alive = &id
	return nil
}

// failAbandoned stores as failed every run stored as running whose
// process died before it finished.
func (rc *Reconciler) failAbandoned(ctx context.Context) error {
	rows, err := rc.cfg.Pool.Query(ctx, qRunsAbandoned, runAliveSpace)
	if err != nil {
		return fmt.Errorf("reconcile: runs left running: %w", err)
	}
	ids, err := pgx.CollectRows(rows, pgx.RowTo[uuid.UUID])
	if err != nil {
		return fmt.Errorf("reconcile: runs left running: %w", err)
	}
	for _, id := range ids {
		rc.log.Warn("a run left running by a process that ended is now stored as failed", "run", id)
	}
	return nil
}

// lockAll takes the lock of every period in by (in name order, so two
// runs cannot each hold what the other waits for: neither waits anyway).
func (l *runLocks) lockAll(ctx context.Context, by map[string]periods.Period) error {
	names := make([]string, 0, len(by))
	for _, p := range by {
		if !l.held[p.Name] {
			names = append(names, p.Name)
		}
	}
	sort.Strings(names)
	for _, n := range names {
		if l.held[n] {
			continue
		}
		var got bool
		if err := l.conn.QueryRow(ctx, qRunLockTry, runLockSpace, n).Scan(&got); err != nil {
			return fmt.Errorf("reconcile: lock: %w", err)
		}
		if !got {
			return fmt.Errorf("period %s: %w", n, ErrBusy)
		}
		l.held[n] = true
	}
	return nil
}

func (l *runLocks) release(ctx context.Context) {
	for n := range l.held {
		_, _ = l.conn.Exec(ctx, qRunLockUnlock, runLockSpace, n)
	}
	if l.alive != nil {
		_, _ = l.conn.Exec(ctx, qRunAliveUnlock, runAliveSpace, l.alive.String())
	}
}

// verdict is one customer's result in a run.
type verdict struct {
	customer string
	period   periods.Period
	clean    bool
	totals   map[string]string // meter -> billed
	fp       fingerprint
}

// check resolves the targets and runs every check in one REPEATABLE READ
// transaction, so all checks see the same snapshot of the ledger; then it
// stores where the stream check found streams adding up.
func (rc *Reconciler) check(ctx context.Context, run *Run, opt Options, now time.Time, locks *runLocks) ([]verdict, error) {
	conn, err := rc.cfg.Pool.Acquire(ctx)
	if err != nil {
		return nil, fmt.Errorf("reconcile: %w", err)
	}
	defer conn.Release()
	// The stream check notes the streams it found adding up in a temporary
	// table of this connection, and the deep check keeps what it reads
	// from Kafka in another (deep.go): the read-only transaction can write
	// to them but not create them.
	temporary := [][2]string{{streamChecksTable, streamChecksDrop}}
	if opt.Deep {
		temporary = append(temporary, [2]string{deepKafkaTable, deepKafkaDrop})
	}
	for _, tt := range temporary {
		if _, err := conn.Exec(ctx, tt[0]); err != nil {
			return nil, fmt.Errorf("reconcile: %w", err)
		}
		defer func() {
			// A connection that kept a table goes no further than this run.
			if _, err := conn.Exec(context.WithoutCancel(ctx), tt[1]); err != nil {
				conn.Conn().Close(context.WithoutCancel(ctx))
			}
		}()
	}
	tx, err := conn.BeginTx(ctx, pgx.TxOptions{IsoLevel: pgx.RepeatableRead, AccessMode: pgx.ReadOnly})
	if err != nil {
		return nil, fmt.Errorf("reconcile: %w", err)
	}
	defer tx.Rollback(ctx)
	if _, err := tx.Exec(ctx, qRunSettings); err != nil {
		return nil, fmt.Errorf("reconcile: %w", err)
	}

	tg, byCustomer, err := rc.targets(ctx, tx, opt, now)
	if err != nil {
		return nil, err
	}
	// A customer created since the locks were taken may resolve to a
	// period not locked yet.
	if err := locks.lockAll(ctx, byCustomer); err != nil {
		return nil, err
	}
	r := &runner{run: run, totals: map[[2]string]*Total{}, periodOf: map[string]string{}, usage: map[string][]meterUsage{},
		rollups: map[[2]string]decimal.Decimal{}, whole: opt.Deep,
		max: rc.cfg.MaxFindings, listed: map[string]int{}, omitted: map[[2]string]int{}, dirty: map[string]bool{}}
	for c, p := range byCustomer {
		r.periodOf[c] = p.Name
	}
	if err := tx.QueryRow(ctx, qIngestTablesExist).Scan(&r.hasIngest); err != nil {
		return nil, err
	}
	rc.progress("reconciling %s for %d customers\n", opt.Period, len(tg.customers))

	type step struct {
		name string
		fn   func() error
	}
	steps := []step{
		{CheckRollups, func() error { return r.checkRollups(ctx, tx, tg) }},
		{CheckStreams, func() error { return r.checkStreams(ctx, tx, tg) }},
		{CheckConflicts, func() error { return r.checkConflicts(ctx, tx, tg) }},
		{CheckLate, func() error { return r.checkLate(ctx, tx, tg) }},
		{CheckAbandoned, func() error { return r.checkAbandoned(ctx, tx, tg) }},
	}
	if r.hasIngest {
		steps = append(steps, step{CheckConservation, func() error { return r.checkConservation(ctx, tx) }})
	} else {
		run.Checks = append(run.Checks, Check{Name: CheckConservation, Status: "skipped", Detail: "no ingest tables in this database"})
	}
	steps = append(steps, step{CheckKinds, func() error { return r.checkKinds(ctx, tx, tg, now) }})
	steps = append(steps, step{CheckOverage, func() error { return r.checkOverage(ctx, tx, tg) }})
	steps = append(steps, step{CheckAdmission, func() error { return r.checkAdmission(ctx, tx, tg, now) }})
	for i, s := range steps {
		before := r.found
		start := time.Now()
		if err := s.fn(); err != nil {
			return nil, fmt.Errorf("reconcile: check %s: %w", s.name, err)
		}
		c := Check{Name: s.name, Status: "ok"}
		if n := r.found - before; n > 0 {
			c.Status, c.Detail = "findings", fmt.Sprintf("%d findings", n)
		}
		run.Checks = append(run.Checks, c)
		rc.progress("[%d/%d] %-28s %-8s %s\n", i+1, len(steps), s.name, c.Status, time.Since(start).Round(time.Millisecond))
	}
	if opt.Deep {
		if err := rc.deep(ctx, tx, r, tg); err != nil {
			return nil, fmt.Errorf("reconcile: deep check: %w", err)
		}
	}
	r.summarize()
	run.EntriesScanned = r.scanned
	usage := make(map[string]string, len(r.usage))
	for c, ms := range r.usage {
		usage[c] = usageKey(ms)
	}
	fps, err := fingerprints(ctx, tx, tg, usage)
	if err != nil {
		return nil, fmt.Errorf("reconcile: fingerprint: %w", err)
	}

	// Totals, sorted; customers with a period but no usage still get a verdict.
	for _, t := range r.totals {
		run.Totals = append(run.Totals, *t)
	}
	sort.Slice(run.Totals, func(i, j int) bool {
		a, b := run.Totals[i], run.Totals[j]
		return a.Customer < b.Customer || a.Customer == b.Customer && a.Meter < b.Meter
	})
	// Each customer's totals, in one pass over them (not one per customer:
	// tens of thousands of customers made that quadratic loop the bulk of
	// a run).
	billed := make(map[string]map[string]string, len(byCustomer))
	for _, t := range run.Totals {
		if billed[t.Customer] == nil {
			billed[t.Customer] = map[string]string{}
		}
		billed[t.Customer][t.Meter] = t.Billed.String()
	}
	vs := make([]verdict, 0, len(byCustomer))
	for c, p := range byCustomer {
		totals := billed[c]
		if totals == nil {
			totals = map[string]string{}
		}
		vs = append(vs, verdict{customer: c, period: p, clean: !r.global && !r.dirty[c], totals: totals, fp: fps[c]})
	}
	sort.Slice(vs, func(i, j int) bool { return vs[i].customer < vs[j].customer })
	// The transaction wrote only to stream_checks_found: committed, the
	// rows are stored from there (a failed run stores none).
	if err := tx.Commit(ctx); err != nil {
		return nil, fmt.Errorf("reconcile: %w", err)
	}
	at := rc.cfg.Clock().UTC().Truncate(time.Microsecond)
	if _, err := conn.Exec(ctx, qStreamChecksUpsert, pgx.StrictNamedArgs{"at": at}); err != nil {
		return nil, fmt.Errorf("reconcile: store stream checks: %w", err)
	}
	return vs, nil
}

// targets resolves the period for each customer from its own calendar.
func (rc *Reconciler) targets(ctx context.Context, tx pgx.Tx, opt Options, now time.Time) (target, map[string]periods.Period, error) {
	tg := target{all: opt.Customer == ""}
	by := map[string]periods.Period{}
	rows, err := tx.Query(ctx, qCustomerSchedules, opt.Customer)
	if err != nil {
		return tg, nil, fmt.Errorf("reconcile: customers: %w", err)
	}
	defer rows.Close()
	for rows.Next() {
		var id string
		var raw []byte
		if err := rows.Scan(&id, &raw); err != nil {
			return tg, nil, err
		}
		var s periods.Schedule
		if err := json.Unmarshal(raw, &s); err != nil {
			return tg, nil, fmt.Errorf("customer %q: stored calendar: %w", id, err)
		}
		p, err := s.Resolve(opt.Period, now)
		if err != nil {
			if errors.Is(err, periods.ErrNoSuchPeriod) {
				continue // this customer's calendar has no period starting that day
			}
			return tg, nil, fmt.Errorf("customer %q: %w", id, err)
		}
		by[id] = p
		tg.customers = append(tg.customers, id)
		tg.starts = append(tg.starts, p.Start.UTC())
		tg.ends = append(tg.ends, p.End.UTC())
	}
	if err := rows.Err(); err != nil {
		return tg, nil, err
	}
	if opt.Customer != "" && len(tg.customers) == 0 {
		var exists bool
		_ = tx.QueryRow(ctx, qCustomerExists, opt.Customer).Scan(&exists)
		if !exists {
			return tg, nil, &periods.UnknownCustomerError{Customer: opt.Customer}
		}
		return tg, nil, fmt.Errorf("customer %q has no period starting %s: %w", opt.Customer, opt.Period, periods.ErrNoSuchPeriod)
	}
	return tg, by, nil
}

// store finishes the stored run and writes its findings and (unless it
// failed) its verdicts, one statement each.
func (rc *Reconciler) store(ctx context.Context, run *Run, vs []verdict) error {
	checks, _ := json.Marshal(run.Checks)
	totals, _ := json.Marshal(run.Totals)
	return pgx.BeginFunc(ctx, rc.cfg.Pool, func(tx pgx.Tx) error {
		if _, err := tx.Exec(ctx, qRunFinish, pgx.StrictNamedArgs{"id": run.ID, "status": run.Status, "finished_at": run.FinishedAt,
			"entries_scanned": run.EntriesScanned, "checks": checks, "totals": totals, "error": nullable(run.Error)}); err != nil {
			return fmt.Errorf("reconcile: store run: %w", err)
		}
		if len(run.Findings) > 0 {
			if _, err := tx.Exec(ctx, qFindingsInsert, findingsArgs(run.ID, run.Findings)); err != nil {
				return fmt.Errorf("reconcile: store findings: %w", err)
			}
		}
		if run.Status == StatusFailed {
			return nil
		}
		if len(vs) == 0 {
			return nil
		}
		if _, err := tx.Exec(ctx, qVerdictsInsert, verdictsArgs(run.ID, vs)); err != nil {
			return fmt.Errorf("reconcile: store verdicts: %w", err)
		}
		return nil
	})
}

// findingsArgs turns a run's findings into the columns of qFindingsInsert
// (n: the finding's place in the run).
func findingsArgs(runID uuid.UUID, fs []Finding) pgx.StrictNamedArgs {
	n := make([]int32, len(fs))
	kinds, severities, details := make([]string, len(fs)), make([]string, len(fs)), make([]string, len(fs))
	customers, meters, streams, amounts := make([]*string, len(fs)), make([]*string, len(fs)), make([]*string, len(fs)), make([]*string, len(fs))
	starts, omitted := make([]*time.Time, len(fs)), make([]*int64, len(fs))
	for i, f := range fs {
		n[i], kinds[i], severities[i], details[i] = int32(i), f.Kind, f.Severity, f.Detail
		customers[i], meters[i], streams[i], starts[i] = nullable(f.Customer), nullable(f.Meter), nullable(f.Stream), f.Period
		if f.Amount != nil {
			amounts[i] = nullable(f.Amount.String())
		}
		if f.Omitted > 0 {
			o := int64(f.Omitted)
			omitted[i] = &o
		}
	}
	return pgx.StrictNamedArgs{"run_id": runID, "n": n, "kind": kinds, "severity": severities, "customer": customers,
		"meter": meters, "stream": streams, "period_start": starts, "amount": amounts, "detail": details, "omitted": omitted}
}

// verdictsArgs turns a run's verdicts into the columns of qVerdictsInsert.
func verdictsArgs(runID uuid.UUID, vs []verdict) pgx.StrictNamedArgs {
	customers, starts, clean := make([]string, len(vs)), make([]time.Time, len(vs)), make([]bool, len(vs))
	totals, fps := make([]string, len(vs)), make([]string, len(vs))
	for i, v := range vs {
		t, _ := json.Marshal(v.totals)
		fp, _ := json.Marshal(v.fp)
		customers[i], starts[i], clean[i], totals[i], fps[i] = v.customer, v.period.Start, v.clean, string(t), string(fp)
	}
	return pgx.StrictNamedArgs{"run_id": runID, "customer": customers, "period_start": starts, "clean": clean,
		"totals": totals, "fingerprint": fps}
}

func (rc *Reconciler) progress(format string, args ...any) {
	if rc.cfg.Progress != nil {
		fmt.Fprintf(rc.cfg.Progress, format, args...)
	}
}

func nullable(s string) *string {
	if s == "" {
		return nil
	}
	return &s
}
