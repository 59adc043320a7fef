package alerts

import (
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/shopspring/decimal"

	"github.com/tally-ledger/tally/internal/notify"
	"github.com/tally-ledger/tally/internal/pause"
	"github.com/tally-ledger/tally/quota"
)

// Defaults of EvaluatorConfig.
const (
	DefaultInterval    = time.Second
	DefaultMinInterval = 50 * time.Millisecond
	DefaultRetryFor    = 72 * time.Hour
	DefaultTopic       = "tally.alerts"
)

// UsageChannel is the channel the ledger's triggers notify at commit
// (migrations 00007 and 00012): the evaluator wakes on it.
const UsageChannel = "tally_api_cache"

// Leader says whether this process leads, and with which lease (the quota
// enforcer: *quota.Enforcer).
type Leader interface {
	Leading() (quota.Fence, bool)
}

// EvaluatorConfig configures an Evaluator.
type EvaluatorConfig struct {
	Pool *pgxpool.Pool // required
	// Leader is the quota enforcer of this process: the evaluator works
	// only while it leads, fenced by its lease. Required.
	Leader Leader
	// IngestTopic gives as_of, as for decisions. Default
	// quota.DefaultIngestTopic.
	IngestTopic string
	// Kafka: every event is also delivered to the Kafka topic (a "kafka"
	// delivery per event; the Dispatcher needs Brokers).
	Kafka bool
	// Interval is the longest time between evaluations (default 1s);
	// MinInterval the shortest (default 50ms): notifications of new usage
	// wake the evaluator in between.
	Interval, MinInterval time.Duration
	// NoListen: open no listening connection of its own; the evaluator
	// is then woken through Subscriber on another listener of the process
	// (the API's), or only every Interval.
	NoListen bool
	// RetryFor is how long a delivery is retried before it is failed,
	// from when it was written, by the database's clock. Default 72h.
	RetryFor time.Duration
	// Clock gives the evaluation instant: the periods evaluated, the
	// events' occurred_at and the states' changed_at. Default time.Now.
	// The deliveries' times are the database's, which the dispatcher
	// compares them with: a delivery is due when it is written, whatever
	// Clock says.
	Clock      func() time.Time
	Logger     *slog.Logger
	Registerer prometheus.Registerer
	// Committed, if set, is called after each commit that wrote events
	// (the Dispatcher's Wake).
	Committed func()
}

// Validate reports every configuration problem at once.
func (c EvaluatorConfig) Validate() error {
	var errs []error
	if c.Pool == nil {
		errs = append(errs, errors.New("alerts: Pool is nil"))
	}
	if c.Leader == nil {
		errs = append(errs, errors.New("alerts: Leader is nil (the quota enforcer of this process)"))
	}
	if c.Interval < 0 || c.MinInterval < 0 || c.RetryFor < 0 {
		errs = append(errs, errors.New("alerts: negative duration"))
	}
	return errors.Join(errs...)
}

func (c EvaluatorConfig) withDefaults() EvaluatorConfig {
	if c.IngestTopic == "" {
		c.IngestTopic = quota.DefaultIngestTopic
	}
	if c.Interval == 0 {
		c.Interval = DefaultInterval
	}
	if c.MinInterval == 0 {
		c.MinInterval = DefaultMinInterval
	}
	if c.RetryFor == 0 {
		c.RetryFor = DefaultRetryFor
	}
	if c.Clock == nil {
		c.Clock = time.Now
	}
	if c.Logger == nil {
		c.Logger = slog.New(slog.DiscardHandler)
	}
	if c.Registerer == nil {
		c.Registerer = prometheus.NewRegistry()
	}
	return c
}

// Evaluator turns usage into alert transitions while its Leader leads.
type Evaluator struct {
	cfg  EvaluatorConfig
	log  *slog.Logger
	m    *evalMetrics
	wake chan struct{}
}

// NewEvaluator returns an Evaluator; Run starts it.
func NewEvaluator(cfg EvaluatorConfig) (*Evaluator, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	cfg = cfg.withDefaults()
	return &Evaluator{cfg: cfg, log: cfg.Logger, m: newEvalMetrics(cfg.Registerer), wake: make(chan struct{}, 1)}, nil
}

// Run evaluates while the leader leads, at least every Interval and on
// every notification of new usage, until ctx ends.
func (e *Evaluator) Run(ctx context.Context) error {
	done := make(chan struct{})
	if !e.cfg.NoListen {
		l := notify.New(notify.Config{Pool: e.cfg.Pool, Channel: UsageChannel, ApplicationName: "tally-alerts", Logger: e.log})
		l.Subscribe(e.Subscriber())
		go func() {
			defer close(done)
			_ = l.Run(ctx)
		}()
	} else {
		close(done)
	}
	defer func() { <-done }()
	t := time.NewTicker(e.cfg.Interval)
	defer t.Stop()
	for {
		took := time.Duration(0)
		if f, ok := e.cfg.Leader.Leading(); ok {
			start := time.Now()
			err := e.Evaluate(ctx, f)
			took = time.Since(start)
			if err != nil && ctx.Err() == nil {
				if errors.Is(err, quota.ErrNotLeader) {
					e.log.Warn("alerts: fenced: the enforcer lost its lease; evaluating again once it leads")
				} else {
					e.m.failures.Inc()
					e.log.Error("alerts: cannot evaluate; no transition written (retrying)", "err", err)
				}
			}
		}
		// At most half of the time evaluating: many subjects make each
		// evaluation longer and the evaluations rarer, never back to back.
		// A notification during the pause is kept (wake holds one).
		if !pause.For(ctx, max(e.cfg.MinInterval, took)) {
			return nil
		}
		select {
		case <-ctx.Done():
			return nil
		case <-t.C:
		case <-e.wake:
		}
	}
}

// Subscriber wakes the evaluator on each notification of a listener it
// shares (see NoListen).
func (e *Evaluator) Subscriber() notify.Subscriber { return notify.Waker(e.wake) }

// stateKey names one state row.
type stateKey struct {
	rule, subject, threshold string
	periodStart              time.Time
}

// statesWindowDays: the states of periods that began in the last 100
// days are read, which covers any current period (the longest calendar
// period is a quarter); older ones only while triggered.
const statesWindowDays = 100

type state struct {
	stateKey
	period, meter, state string
	transitions          int
	used                 decimal.Decimal
	limit                *decimal.Decimal
	changedAt            time.Time // when the stored state was last written (read only)
}

// transition is one state change to write, with its event (nil when the
// rule does not notify on it).
type transition struct {
	s     state
	event *Event
	value decimal.Decimal // what the threshold stood for when it was crossed (the event's threshold.value)
	body  string
	kinds []string // delivery endpoints
}

// Evaluate runs one evaluation: reads rules, states and usage, decides
// the transitions and writes them with their events and deliveries in one
// transaction fenced by f.
func (e *Evaluator) Evaluate(ctx context.Context, f quota.Fence) error {
	start := time.Now()
	defer func() { e.m.seconds.Observe(time.Since(start).Seconds()) }()
	now := e.cfg.Clock().UTC().Truncate(time.Microsecond)
	rules, err := latestRules(ctx, e.cfg.Pool)
	if err != nil {
		return err
	}
	states, err := loadStates(ctx, e.cfg.Pool, now.AddDate(0, 0, -statesWindowDays))
	if err != nil {
		return err
	}
	if len(rules) == 0 && len(states) == 0 {
		return nil
	}
	plan, err := planSubjects(ctx, e.cfg.Pool, rules, states)
	if err != nil {
		return err
	}
	usage, err := quota.UsageOf(ctx, e.cfg.Pool, quota.UsageQuery{Now: now, IngestTopic: e.cfg.IngestTopic, Subjects: plan.subjects})
	if err != nil {
		return err
	}
	endpoints, err := loadEndpoints(ctx, e.cfg.Pool)
	if err != nil {
		return err
	}
	ts := decideAll(rules, plan, usage, states, now)
	if len(ts) == 0 {
		return nil
	}
	for i := range ts {
		if err := e.prepare(&ts[i], rules, endpoints); err != nil {
			return err
		}
	}
	if err := e.write(ctx, f, ts, now); err != nil {
		return err
	}
	for _, t := range ts {
		if t.event == nil {
			continue
		}
		e.m.events.WithLabelValues(t.event.Type).Inc()
		if t.event.LagSeconds != nil {
			e.m.lag.Observe(t.event.LagSeconds.Duration().Seconds())
		}
		e.log.Info("alert", "type", t.event.Type, "alert", t.event.Alert, "subject", t.event.Subject,
			"threshold", t.s.threshold, "period", t.event.Period, "used", t.event.Used, "reason", t.event.Reason, "id", t.event.ID)
	}
	if e.cfg.Committed != nil {
		e.cfg.Committed()
	}
	return nil
}

// prepare encodes t's event and lists its deliveries.
func (e *Evaluator) prepare(t *transition, rules map[string]Rule, endpoints map[string]endpointConfig) error {
	if t.event == nil {
		return nil
	}
	b, err := json.Marshal(t.event)
	if err != nil {
		return fmt.Errorf("alerts: encode event: %w", err)
	}
	t.body = string(b)
	if e.cfg.Kafka {
		t.kinds = append(t.kinds, KafkaEndpoint)
	}
	if r, ok := rules[t.s.rule]; ok {
		for _, name := range r.Endpoints {
			if c, ok := endpoints[name]; ok && slices.Contains(c.events, t.event.Type) {
				t.kinds = append(t.kinds, name)
			}
		}
	}
	return nil
}

// write commits the transitions, their events and deliveries in one
// transaction, after checking the enforcer's lease in it.
func (e *Evaluator) write(ctx context.Context, f quota.Fence, ts []transition, now time.Time) error {
	n := len(ts)
	rs, subs, ths, pers, ms, sts, used := make([]string, n), make([]string, n), make([]string, n), make([]string, n), make([]string, n), make([]string, n), make([]string, n)
	starts, trans, lims := make([]time.Time, n), make([]int32, n), make([]*string, n)
	var ids []string
	var erules, esubs, emeters, etypes, bodies []string
	var did, dend []string
	for i, t := range ts {
		s := t.s
		rs[i], subs[i], ths[i], pers[i], ms[i], sts[i], used[i] = s.rule, s.subject, s.threshold, s.period, s.meter, s.state, s.used.String()
		starts[i], trans[i] = s.periodStart, int32(s.transitions)
		if s.limit != nil {
			l := s.limit.String()
			lims[i] = &l
		}
		if t.event != nil {
			id := t.event.ID.String()
			ids, erules, esubs, emeters = append(ids, id), append(erules, s.rule), append(esubs, s.subject), append(emeters, s.meter)
			etypes, bodies = append(etypes, t.event.Type), append(bodies, t.body)
			for _, k := range t.kinds {
				did, dend = append(did, id), append(dend, k)
			}
		}
	}
	return pgx.BeginFunc(ctx, e.cfg.Pool, func(tx pgx.Tx) error {
		if err := quota.CheckFence(ctx, tx, f); err != nil {
			return err
		}
		if _, err := tx.Exec(ctx, qUpsertStates, pgx.NamedArgs{"rules": rs, "subjects": subs, "thresholds": ths,
			"starts": starts, "periods": pers, "meters": ms, "states": sts, "transitions": trans, "used": used,
			"limits": lims, "at": now}); err != nil {
			return fmt.Errorf("alerts: write states: %w", err)
		}
		if len(ids) == 0 {
			return nil
		}
		if _, err := tx.Exec(ctx, qInsertEvents, pgx.NamedArgs{"ids": ids, "rules": erules, "subjects": esubs,
			"meters": emeters, "types": etypes, "bodies": bodies, "at": now}); err != nil {
			return fmt.Errorf("alerts: write events: %w", err)
		}
		if len(did) > 0 {
			if _, err := tx.Exec(ctx, qInsertDeliveries, pgx.NamedArgs{"ids": did, "endpoints": dend,
				"retry_for": e.cfg.RetryFor.Seconds()}); err != nil {
				return fmt.Errorf("alerts: write deliveries: %w", err)
			}
		}
		return nil
	})
}

// latestRules is the latest version of every rule, deleted ones included
// (their triggered states are resolved to their endpoints).
func latestRules(ctx context.Context, db DBTX) (map[string]Rule, error) {
	rows, err := db.Query(ctx, qLatestRules)
	if err != nil {
		return nil, fmt.Errorf("alerts: read rules: %w", err)
	}
	rs, err := pgx.CollectRows(rows, func(row pgx.CollectableRow) (Rule, error) { return scanRule(row) })
	if err != nil {
		return nil, fmt.Errorf("alerts: read rules: %w", err)
	}
	out := make(map[string]Rule, len(rs))
	for _, r := range rs {
		out[r.Name] = r
	}
	return out, nil
}

func loadStates(ctx context.Context, db DBTX, since time.Time) (map[stateKey]state, error) {
	return readStates(ctx, db, qStates, pgx.NamedArgs{"since": since})
}

// readStates reads the states query q selects.
func readStates(ctx context.Context, db DBTX, q string, args pgx.NamedArgs) (map[stateKey]state, error) {
	rows, err := db.Query(ctx, q, args)
	if err != nil {
		return nil, fmt.Errorf("alerts: read states: %w", err)
	}
	defer rows.Close()
	out := map[stateKey]state{}
	for rows.Next() {
		var s state
		var used string
		var limit *string
		if err := rows.Scan(&s.rule, &s.subject, &s.threshold, &s.periodStart, &s.period, &s.meter, &s.state, &s.transitions, &used, &limit, &s.changedAt); err != nil {
			return nil, fmt.Errorf("alerts: read states: %w", err)
		}
		s.periodStart, s.changedAt = s.periodStart.UTC(), s.changedAt.UTC()
		s.used, err = decimal.NewFromString(used)
		if err != nil {
			return nil, fmt.Errorf("alerts: read states: %w", err)
		}
		if limit != nil {
			l, err := decimal.NewFromString(*limit)
			if err != nil {
				return nil, fmt.Errorf("alerts: read states: %w", err)
			}
			s.limit = &l
		}
		out[s.stateKey] = s
	}
	return out, rows.Err()
}

// plan is what to read: the subjects of each rule, and every (scope,
// meter) once.
type plan struct {
	subjects []quota.Subject
	index    map[quota.Subject]int
	byRule   map[string][]string // rule → its subjects' scopes
}

func planSubjects(ctx context.Context, db DBTX, rules map[string]Rule, states map[stateKey]state) (plan, error) {
	p := plan{index: map[quota.Subject]int{}, byRule: map[string][]string{}}
	add := func(r Rule, scope string) {
		s := quota.Subject{Scope: scope, Meter: r.Meter}
		if slices.Contains(p.byRule[r.Name], scope) {
			return
		}
		p.byRule[r.Name] = append(p.byRule[r.Name], scope)
		if _, ok := p.index[s]; !ok {
			p.index[s] = len(p.subjects)
			p.subjects = append(p.subjects, s)
		}
	}
	var customers []string
	names := make([]string, 0, len(rules))
	for n := range rules {
		names = append(names, n)
	}
	slices.Sort(names)
	for _, n := range names {
		r := rules[n]
		if r.Deleted {
			continue
		}
		switch r.Subject {
		case SubjectCustomers:
			if customers == nil {
				rows, err := db.Query(ctx, qCustomers)
				if err != nil {
					return plan{}, fmt.Errorf("alerts: read customers: %w", err)
				}
				customers, err = pgx.CollectRows(rows, pgx.RowTo[string])
				if err != nil {
					return plan{}, fmt.Errorf("alerts: read customers: %w", err)
				}
				if customers == nil {
					customers = []string{}
				}
			}
			for _, c := range customers {
				add(r, quota.CustomerScope(c))
			}
		default:
			add(r, r.Subject)
		}
	}
	return p, nil
}

// decideAll is every transition of this evaluation: resolutions of states
// that can no longer stay triggered (a period ended, a rule or threshold
// gone), and each rule × subject × threshold in the current period; in
// the order of inOrder.
func decideAll(rules map[string]Rule, p plan, usage []quota.SubjectUsage, states map[stateKey]state, now time.Time) []transition {
	var out []transition
	current := map[string]quota.SubjectUsage{} // rule/subject → usage
	for name, scopes := range p.byRule {
		r := rules[name]
		for _, sc := range scopes {
			current[name+"\x00"+sc] = usage[p.index[quota.Subject{Scope: sc, Meter: r.Meter}]]
		}
	}
	// Triggered states that end: their period ended, their rule or
	// threshold is gone, the rule's meter or subject changed.
	var ending []state
	done := map[stateKey]bool{} // transitioned already in this evaluation: next time
	for _, s := range states {
		if s.state == Triggered {
			ending = append(ending, s)
		}
	}
	slices.SortFunc(ending, func(a, b state) int {
		return strings.Compare(a.rule+"\x00"+a.subject+"\x00"+a.threshold+a.periodStart.String(),
			b.rule+"\x00"+b.subject+"\x00"+b.threshold+b.periodStart.String())
	})
	for _, s := range ending {
		r, ok := rules[s.rule]
		u, evaluated := current[s.rule+"\x00"+s.subject]
		reason := ""
		switch {
		case !ok || r.Deleted:
			reason = ReasonRuleDeleted
		case !evaluated || r.Meter != s.meter || !slices.ContainsFunc(r.Thresholds, func(t Threshold) bool { return t.Key() == s.threshold }):
			reason = ReasonRuleChanged
		case !u.Period.Start.UTC().Equal(s.periodStart):
			reason = ReasonPeriodEnded
		default:
			continue // evaluated below
		}
		used, at := s.used, (*quota.SubjectUsage)(nil)
		switch {
		case reason == ReasonPeriodEnded && u.Previous.Start.UTC().Equal(s.periodStart):
			// The period just ended: its usage as known now.
			used, at = u.PreviousUsed, &u
		case evaluated && r.Meter == s.meter && u.Period.Start.UTC().Equal(s.periodStart):
			// A rule change that keeps the subject and meter: this
			// evaluation's usage of the same period. (A deleted rule's
			// subject is evaluated no more: the usage of its last
			// transition, the trigger's.)
			used, at = u.Used, &u
		}
		out = append(out, resolve(r, s, used, s.limit, at, now, reason))
		done[s.stateKey] = true
	}
	names := make([]string, 0, len(p.byRule))
	for n := range p.byRule {
		names = append(names, n)
	}
	slices.Sort(names)
	for _, name := range names {
		r := rules[name]
		for _, sc := range p.byRule[name] {
			u := current[name+"\x00"+sc]
			for _, th := range r.Thresholds {
				k := stateKey{rule: name, subject: sc, threshold: th.Key(), periodStart: u.Period.Start.UTC()}
				if done[k] {
					continue
				}
				s, ok := states[k]
				if ok && s.meter != r.Meter {
					s.meter = r.Meter // the rule's meter changed: the count goes on
				}
				if !ok {
					s = state{stateKey: k, period: u.Period.Name, meter: r.Meter, state: "ok"}
				}
				if t, ok := decide(r, th, s, u, now); ok {
					out = append(out, t)
				}
			}
		}
	}
	inOrder(out)
	return out
}

// inOrder sorts one evaluation's transitions into the order their events
// are written, and so delivered (docs/design.md §15): per rule and
// subject, an older period's before a newer one's; in a period,
// resolutions before triggers, resolutions highest threshold first (the
// reverse of how they were crossed), triggers lowest first (80% before
// 100%), by what each threshold stood for when it was crossed. Whatever
// resolved them (a credit, the period's end, a rule change or deletion).
// Thresholds standing for the same usage keep the rule's order.
func inOrder(ts []transition) {
	slices.SortStableFunc(ts, func(a, b transition) int {
		if c := cmp.Or(strings.Compare(a.s.rule, b.s.rule), strings.Compare(a.s.subject, b.s.subject),
			a.s.periodStart.Compare(b.s.periodStart)); c != 0 {
			return c
		}
		ar, br := a.s.state != Triggered, b.s.state != Triggered
		switch {
		case ar && !br:
			return -1
		case br && !ar:
			return 1
		case ar:
			return b.value.Cmp(a.value)
		}
		return a.value.Cmp(b.value)
	})
}

// decide is the state machine of one (rule, subject, threshold, period):
// ok → triggered when used ≥ the threshold; triggered → ok when used <
// threshold × (1 − hysteresis), or when a percent threshold has no limit
// in force any more.
func decide(r Rule, th Threshold, s state, u quota.SubjectUsage, now time.Time) (transition, bool) {
	at, ok := th.At(u.Limit)
	switch {
	case s.state == Triggered && !ok:
		return resolve(r, s, u.Used, u.Limit, &u, now, ReasonNoLimit), true
	case !ok:
		return transition{}, false // no rule in force: no evaluation
	case s.state != Triggered && u.Used.GreaterThanOrEqual(at):
		s.state, s.transitions, s.used, s.limit = Triggered, s.transitions+1, u.Used, u.Limit
		return transition{s: s, event: newEvent(r, th, s, u.Used, u.Limit, &u, now, TypeTriggered, ""), value: at}, true
	case s.state == Triggered:
		keep := decimal.NewFromInt(1).Sub(r.HysteresisPercent.Shift(-2)) // exact, as Threshold.At
		if !u.Used.LessThan(at.Mul(keep)) {
			return transition{}, false
		}
		reason := ReasonBelow
		switch {
		case th.Percent != nil && s.limit != nil && u.Limit != nil && u.Limit.GreaterThan(*s.limit):
			reason = ReasonLimitRaised
		case u.Used.LessThan(s.used):
			reason = ReasonCredited
		}
		return resolve(r, s, u.Used, u.Limit, &u, now, reason), true
	}
	return transition{}, false
}

func resolve(r Rule, s state, used decimal.Decimal, limit *decimal.Decimal, u *quota.SubjectUsage, now time.Time, reason string) transition {
	crossedAt := s.limit // the limit a percent threshold was crossed under
	s.state, s.transitions, s.used, s.limit = "ok", s.transitions+1, used, limit
	var th Threshold
	for _, t := range r.Thresholds {
		if t.Key() == s.threshold {
			th = t
		}
	}
	if th.Key() == "" { // the threshold is gone from the rule: rebuild it from its key
		kind, v, _ := strings.Cut(s.threshold, ":")
		d, _ := decimal.NewFromString(v)
		if kind == "percent" {
			th.Percent = &d
		} else {
			th.Value = &d
		}
	}
	t := transition{s: s, value: crossedValue(th, crossedAt, limit)}
	if r.Notifies(Resolved) {
		// The threshold's value is the one it stood for when it was
		// crossed, whatever the limit now (raised, lowered, none): the
		// trigger's, which the receiver matches the resolution to.
		es := s
		es.limit = crossedAt
		t.event = newEvent(r, th, es, used, limit, u, now, TypeResolved, reason)
	}
	return t
}

// crossedValue is the usage th stood for when it was crossed, under the
// limit crossedUnder (else, a percent threshold crossed without one on
// record, under limit).
func crossedValue(th Threshold, crossedUnder, limit *decimal.Decimal) decimal.Decimal {
	at, ok := th.At(crossedUnder)
	if !ok {
		at, _ = th.At(limit)
	}
	return at
}

func newEvent(r Rule, th Threshold, s state, used decimal.Decimal, limit *decimal.Decimal, u *quota.SubjectUsage, now time.Time, typ, reason string) *Event {
	if typ == TypeTriggered && !r.Notifies(Triggered) {
		return nil
	}
	ev := &Event{ID: EventID(s.rule, s.subject, s.threshold, s.period, s.transitions), Type: typ, Alert: s.rule,
		RuleVersion: r.Version, Subject: s.subject, Meter: s.meter, Period: s.period, Used: used, Limit: limit,
		Reason: reason, OccurredAt: now}
	if c, ok := strings.CutPrefix(s.subject, "customer:"); ok {
		ev.Customer = c
	}
	// s.limit is the limit the threshold was crossed under (for a
	// trigger, the one in force: limit).
	ev.Threshold = EventThreshold{Value: crossedValue(th, s.limit, limit), Percent: th.Percent}
	if u != nil && u.AsOf != nil {
		a := *u.AsOf
		lag := quota.Seconds(now.Sub(a).Milliseconds())
		ev.AsOf, ev.LagSeconds = &a, &lag
	}
	return ev
}
