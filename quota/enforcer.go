package quota

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"sync/atomic"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/segmentio/kafka-go"
	"github.com/shopspring/decimal"

	"github.com/tally-ledger/tally/internal/notify"
)

// Defaults of Config.
const (
	DefaultInterval     = time.Second
	DefaultRepublish    = 30 * time.Second
	DefaultLeaseTTL     = 10 * time.Second
	DefaultLeaseName    = "quota-enforcer"
	DefaultWriteTimeout = 5 * time.Second
)

// Config configures an Enforcer. Zero values take the documented defaults.
type Config struct {
	// Pool is the ledger's database. Required.
	Pool *pgxpool.Pool
	// Brokers are the Kafka bootstrap addresses. Required.
	Brokers []string
	// Topic receives decisions. Default "tally.quota-decisions". A compacted
	// topic is best: the latest decision per key is all a gateway needs.
	Topic string
	// IngestTopic is the meter-batch topic whose ingest position gives as_of.
	// Default "tally.meter-batches".
	IngestTopic string
	// Interval is the evaluation loop period (also how often the lease is
	// renewed and a standby tries to take over). Default 1s.
	Interval time.Duration
	// Republish is the longest time between two publications of an
	// unchanged decision. Default 30s.
	Republish time.Duration
	// LeaseTTL is how long the leader lease lasts without renewal: a crashed
	// leader is replaced after at most LeaseTTL + Interval. Default 10s;
	// must exceed 2 × Interval.
	LeaseTTL time.Duration
	// LeaseName names the lease: enforcers sharing it elect one leader.
	// Default "quota-enforcer".
	LeaseName string
	// Holder identifies this process in the lease. Default host/pid/uuid.
	Holder string
	// RateWindow is how far back the recent rate (for projected) looks.
	// Default 5m.
	RateWindow time.Duration
	// Clock gives decided_at; it must agree with the ingest clock that
	// writes applied-through times. Default time.Now.
	Clock func() time.Time
	// Logger receives structured logs. Default: discard.
	Logger *slog.Logger
	// Registerer receives the enforcer's metrics. Default: a private registry.
	Registerer prometheus.Registerer
	// Transport connects to Kafka (TLS, SASL). Default: a Transport of the
	// enforcer's own, closed with it.
	Transport *kafka.Transport
	// WriteTimeout bounds one publication. Default 5s.
	WriteTimeout time.Duration
}

func (c Config) withDefaults() Config {
	def := func(d *time.Duration, v time.Duration) {
		if *d == 0 {
			*d = v
		}
	}
	if c.Topic == "" {
		c.Topic = DefaultTopic
	}
	if c.IngestTopic == "" {
		c.IngestTopic = DefaultIngestTopic
	}
	def(&c.Interval, DefaultInterval)
	def(&c.Republish, DefaultRepublish)
	def(&c.LeaseTTL, DefaultLeaseTTL)
	def(&c.RateWindow, DefaultRateWindow)
	def(&c.WriteTimeout, DefaultWriteTimeout)
	if c.LeaseName == "" {
		c.LeaseName = DefaultLeaseName
	}
	if c.Holder == "" {
		host, _ := os.Hostname()
		c.Holder = fmt.Sprintf("%s/%d/%s", host, os.Getpid(), uuid.NewString()[:8])
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

// Validate reports every configuration problem at once.
func (c Config) Validate() error {
	var errs []error
	if c.Pool == nil {
		errs = append(errs, errors.New("quota: Pool is nil"))
	}
	if len(c.Brokers) == 0 {
		errs = append(errs, errors.New("quota: Brokers is empty; set at least one Kafka address"))
	}
	for i, b := range c.Brokers {
		if b == "" {
			errs = append(errs, fmt.Errorf("quota: Brokers[%d] is empty", i))
		}
	}
	for _, d := range []struct {
		name string
		v    time.Duration
	}{{"Interval", c.Interval}, {"Republish", c.Republish}, {"LeaseTTL", c.LeaseTTL},
		{"RateWindow", c.RateWindow}, {"WriteTimeout", c.WriteTimeout}} {
		if d.v < 0 {
			errs = append(errs, fmt.Errorf("quota: %s %v is negative", d.name, d.v))
		}
	}
	d := c.withDefaults()
	if d.LeaseTTL <= 2*d.Interval {
		errs = append(errs, fmt.Errorf("quota: LeaseTTL %v must exceed 2 × Interval (%v)", d.LeaseTTL, d.Interval))
	}
	if d.LeaseTTL%time.Millisecond != 0 {
		errs = append(errs, fmt.Errorf("quota: LeaseTTL %v is not a whole number of milliseconds", d.LeaseTTL))
	}
	if d.Republish < d.Interval {
		errs = append(errs, fmt.Errorf("quota: Republish %v is below Interval %v", d.Republish, d.Interval))
	}
	return errors.Join(errs...)
}

// Enforcer evaluates quota rules and publishes decisions while it is the
// leader. Any number of Enforcers may run against one database; one leads.
type Enforcer struct {
	cfg Config
	log *slog.Logger
	m   *metrics

	// Leader state, touched only by Run's goroutine. last, exact and seqs
	// hold a key for each row of quota_decisions (a key that lost its
	// lagged period limit keeps its no_limit decision, republished like any
	// other); samples holds only the keys the last evaluation decided.
	last    map[string]Decision // the latest published decision per key
	exact   map[string]bool     // whether last was decided under an exact rule (its version's admission)
	seqs    map[string]int64    // the highest seq published per key (stored or not)
	samples map[string][]sample // recent (as_of, used) per decided key, for the rate
	byCust  bool                // the ingest_customers table exists
	checked time.Time           // when byCust was last checked

	leading atomic.Pointer[Fence] // set while leading (Leading)
	wake    chan struct{}         // poked by the ledger's usage notifications (Subscriber)
}

type sample struct {
	period string
	asOf   time.Time
	used   decimal.Decimal
}

// NewEnforcer returns an Enforcer; Run starts it.
func NewEnforcer(cfg Config) (*Enforcer, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	cfg = cfg.withDefaults()
	return &Enforcer{cfg: cfg, log: cfg.Logger.With("holder", cfg.Holder), m: newMetrics(cfg.Registerer),
		wake: make(chan struct{}, 1)}, nil
}

// Run campaigns for the lease and, while leading, evaluates every Interval.
// It returns nil when ctx ends, after releasing the lease so a standby takes
// over at its next attempt.
func (e *Enforcer) Run(ctx context.Context) error {
	t := time.NewTicker(e.cfg.Interval)
	defer t.Stop()
	for {
		epoch, ok, err := e.acquire(ctx)
		switch {
		case err != nil && ctx.Err() == nil:
			e.log.Warn("quota enforcer: cannot campaign for the lease", "err", err)
		case ok:
			e.lead(ctx, epoch)
		}
		select {
		case <-ctx.Done():
			return nil
		case <-t.C:
		}
	}
}

// minWakePause is the shortest time between two evaluations woken by
// usage notifications.
const minWakePause = 50 * time.Millisecond

// Subscriber wakes the enforcer on each notification of a listener of the
// ledger's usage channel (tally_api_cache: rollups, gauge_days and
// unique_counts notify it at commit), so a decision follows new usage of
// any meter kind without waiting for the next Interval. Without it the
// enforcer evaluates every Interval.
func (e *Enforcer) Subscriber() notify.Subscriber { return notify.Waker(e.wake) }

// lease is the leader's view of its lease.
type lease struct {
	epoch    int64
	deadline time.Time // local monotonic time after which it must not publish
	// Republication of every current decision (even unchanged): at the
	// first evaluation, and once a previous leader's writes can no longer
	// land (republishAt).
	takenOver   bool
	republishAt time.Time
	republished bool
}

// Bounds of the decision writer: with them, writerMaxTime bounds how long
// after WriteMessages was called one of its messages can still reach Kafka
// (kafka-go keeps sending after the caller's context ended).
const (
	writerAttempts   = 3
	writerBackoffMax = time.Second
)

// writerMaxTime is how long a write of the decision writer can take:
// every attempt up to WriteTimeout, with backoffs between them.
func (e *Enforcer) writerMaxTime() time.Duration {
	return writerAttempts*e.cfg.WriteTimeout + (writerAttempts-1)*min(writerBackoffMax, e.cfg.WriteTimeout)
}

// margin is how long before the lease's expiry (as measured from the start
// of the statement that set it) the leader stops publishing.
func (e *Enforcer) margin() time.Duration { return e.cfg.LeaseTTL / 4 }

func (e *Enforcer) acquire(ctx context.Context) (lease, bool, error) {
	t0 := time.Now()
	var epoch int64
	err := e.cfg.Pool.QueryRow(ctx, qAcquireLease, e.cfg.LeaseName, e.cfg.Holder, e.cfg.LeaseTTL.Seconds()).Scan(&epoch)
	if errors.Is(err, pgx.ErrNoRows) {
		return lease{}, false, nil
	}
	if err != nil {
		return lease{}, false, err
	}
	return lease{epoch: epoch, deadline: t0.Add(e.cfg.LeaseTTL - e.margin())}, true, nil
}

func (e *Enforcer) renew(ctx context.Context, l *lease) error {
	t0 := time.Now()
	ctx, cancel := context.WithDeadline(ctx, l.deadline)
	defer cancel()
	tag, err := e.cfg.Pool.Exec(ctx, qRenewLease, e.cfg.LeaseName, e.cfg.Holder, l.epoch, e.cfg.LeaseTTL.Seconds())
	if err != nil {
		return err
	}
	if tag.RowsAffected() == 0 {
		return ErrNotLeader
	}
	l.deadline = t0.Add(e.cfg.LeaseTTL - e.margin())
	return nil
}

// lead runs the evaluation loop while the lease holds.
func (e *Enforcer) lead(ctx context.Context, l lease) {
	log := e.log.With("epoch", l.epoch)
	e.leading.Store(&Fence{Name: e.cfg.LeaseName, Holder: e.cfg.Holder, Epoch: l.epoch})
	defer func() {
		e.leading.Store(nil)
		e.m.leader.Set(0)
		rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
		defer cancel()
		if _, err := e.cfg.Pool.Exec(rctx, qReleaseLease, e.cfg.LeaseName, e.cfg.Holder, l.epoch); err != nil {
			log.Warn("quota enforcer: cannot release the lease; a standby takes over when it expires", "err", err)
		}
	}()
	// Start from the decisions the previous leader published, never empty:
	// an unchanged state is not republished before it is due.
	last, err := loadDecisions(ctx, e.cfg.Pool, qLoadDecisions)
	var exact []string
	if err == nil {
		exact, err = exactDecisions(ctx, e.cfg.Pool)
	}
	if err != nil {
		if ctx.Err() == nil {
			log.Error("quota enforcer: cannot load the stored decisions; not leading", "err", err)
		}
		return
	}
	e.last = make(map[string]Decision, len(last))
	e.exact = make(map[string]bool, len(last))
	e.seqs = make(map[string]int64, len(last))
	for _, d := range last {
		e.last[d.Key()] = d
		e.seqs[d.Key()] = d.Seq
	}
	for _, k := range exact {
		e.exact[k] = true
	}
	// The lease was free: the previous leader's lease had ended (or it
	// released it after closing its writer). A write it started before
	// then lands within writerMaxTime, unless it was paused: republish
	// everything after that, so the last decision of every key on the
	// topic is this leader's; consumers ignore anything older by epoch.
	l.republishAt = time.Now().Add(e.writerMaxTime())
	e.samples = map[string][]sample{}
	e.checked = time.Time{}
	tr := e.cfg.Transport
	if tr == nil {
		tr = &kafka.Transport{}
		defer tr.CloseIdleConnections()
	}
	w := &kafka.Writer{
		Addr:                   kafka.TCP(e.cfg.Brokers...),
		Topic:                  e.cfg.Topic,
		Balancer:               &kafka.Murmur2Balancer{}, // the Java client's partitioner: one key, one partition
		RequiredAcks:           kafka.RequireAll,
		BatchTimeout:           2 * time.Millisecond,
		BatchSize:              1000,
		MaxAttempts:            writerAttempts,
		WriteBackoffMax:        min(writerBackoffMax, e.cfg.WriteTimeout),
		WriteTimeout:           e.cfg.WriteTimeout, // per attempt, whatever the caller's context
		ReadTimeout:            e.cfg.WriteTimeout,
		AllowAutoTopicCreation: true,
		Transport:              tr,
	}
	defer w.Close()
	e.m.leader.Set(1)
	log.Info("quota enforcer: leading", "decisions_loaded", len(last))

	t := time.NewTicker(e.cfg.Interval)
	defer t.Stop()
	renewed := time.Time{}
	for {
		// The lease is renewed once an Interval: an evaluation woken by new
		// usage between two ticks does not renew it again.
		if time.Since(renewed) >= e.cfg.Interval {
			if err := e.renew(ctx, &l); err != nil {
				if ctx.Err() != nil {
					return
				}
				if errors.Is(err, ErrNotLeader) || time.Now().After(l.deadline) {
					log.Warn("quota enforcer: lost the lease; stepping down", "err", err)
					return
				}
				log.Warn("quota enforcer: cannot renew the lease; still within it", "err", err)
			} else {
				renewed = time.Now()
			}
		}
		began := time.Now()
		if err := e.evaluate(ctx, w, &l); err != nil {
			if errors.Is(err, ErrNotLeader) {
				log.Warn("quota enforcer: fenced while storing decisions; stepping down")
				return
			}
		}
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		case <-e.wake:
			// New usage: evaluate again once a pause as long as the
			// evaluation (at least minWakePause) has passed, so
			// notifications never take more than half of the time.
			select {
			case <-ctx.Done():
				return
			case <-time.After(max(minWakePause, time.Since(began))):
			}
		}
	}
}

// evaluate reads every rule's usage, decides, publishes what changed or is
// due, and stores it. Read failures publish nothing.
func (e *Enforcer) evaluate(ctx context.Context, w *kafka.Writer, l *lease) error {
	start := time.Now()
	defer func() { e.m.evalSeconds.Observe(time.Since(start).Seconds()) }()
	if time.Since(e.checked) > time.Minute {
		var ok bool
		if err := e.cfg.Pool.QueryRow(ctx, qHasIngestCustomers).Scan(&ok); err != nil {
			return e.readFailed(ctx, err)
		}
		e.byCust, e.checked = ok, time.Now()
	}
	now := e.cfg.Clock().UTC().Truncate(time.Microsecond)
	rctx, cancel := context.WithDeadline(ctx, l.deadline)
	snap, err := loadSnapshot(rctx, e.cfg.Pool, snapshotQuery{
		now: now, ingestTopic: e.cfg.IngestTopic, window: e.cfg.RateWindow, byCustomer: e.byCust,
	})
	var gone []undecided
	if err == nil {
		gone, err = loadUndecided(rctx, e.cfg.Pool, e.last, snap, now)
	}
	cancel()
	if err != nil {
		return e.readFailed(ctx, err)
	}
	republish := !l.takenOver || (!l.republished && !time.Now().Before(l.republishAt))
	var pub []Decision
	var starts []time.Time
	var exact []bool // per published decision: whether its rule is exact
	var tails []tail
	counts := map[State]int{}
	maxLag, unknown := Seconds(0), 0
	publish := func(d Decision, start time.Time, isExact bool) {
		key := d.Key()
		e.seqs[key]++
		d.LeaderEpoch, d.Seq = l.epoch, e.seqs[key]
		pub = append(pub, d)
		starts = append(starts, start.UTC())
		exact = append(exact, isExact)
	}
	decided := make(map[string]struct{}, len(snap))
	for _, u := range snap {
		key := u.rule.Customer + "/" + u.rule.Meter
		decided[key] = struct{}{}
		d := decide(u.rule, u.period, u.used, u.asOf, e.rate(key, u), now)
		counts[d.State]++
		if d.LagSeconds == nil {
			unknown++
		} else {
			maxLag = max(maxLag, *d.LagSeconds)
		}
		if prev, ok := e.last[key]; !ok || republish || e.due(prev, d) {
			publish(d, u.period.Start, u.rule.Admission == Exact)
			if ok && prev.State != NoLimit && prev.Period != d.Period && prev.Period == u.prev.Name {
				// The period ended since prev: settle the usage that
				// came into it after prev under prev's state (a
				// NoLimit prev had no limit to settle against).
				tails = append(tails, tail{prev: prev, start: u.prev.Start.UTC(), used: u.prevUsed})
			}
		}
	}
	// Forget the samples of every key snap no longer decides (a
	// customer's rule turned into a rate contract, a pool's rule turned
	// exact): nothing reads them any more, and keeping them until
	// leadership changes would grow the leader's memory with every key
	// that ever had a lagged period limit. A key decided again later
	// starts its samples afresh.
	for k := range e.samples {
		if _, ok := decided[k]; !ok {
			delete(e.samples, k)
		}
	}
	// A key whose rule no longer has a lagged period limit: its last
	// decision (exceeded, perhaps) would stay the last one gateways read.
	// A NoLimit decision replaces it, republished like any decision (it
	// never turns stale, so only every Republish).
	for _, g := range gone {
		d := noLimit(g.prev, g.version, g.period, now)
		counts[d.State]++
		if republish || e.due(g.prev, d) {
			publish(d, g.period.Start, false)
		}
	}
	for _, s := range States {
		e.m.current.WithLabelValues(string(s)).Set(float64(counts[s]))
	}
	e.m.rules.Set(float64(len(snap)))
	e.m.maxLag.Set(maxLag.Duration().Seconds())
	e.m.unknownAsOf.Set(float64(unknown))
	if len(pub) == 0 {
		l.takenOver, l.republished = true, l.republished || republish && l.takenOver
		return nil
	}
	if time.Now().After(l.deadline) || ctx.Err() != nil {
		// The next renewal decides. (kafka-go would send even with an
		// expired context.)
		return nil
	}
	msgs := make([]kafka.Message, len(pub))
	payloads := make([][]byte, len(pub))
	for i, d := range pub {
		b, err := json.Marshal(d)
		if err != nil {
			return fmt.Errorf("quota: encode decision: %w", err)
		}
		payloads[i] = b
		msgs[i] = kafka.Message{Key: []byte(d.Key()), Value: b, Time: d.DecidedAt}
	}
	wdl := time.Now().Add(e.cfg.WriteTimeout)
	if l.deadline.Before(wdl) {
		wdl = l.deadline
	}
	wctx, cancel := context.WithDeadline(ctx, wdl)
	err = w.WriteMessages(wctx, msgs...)
	cancel()
	if err != nil {
		e.m.publishErrors.Inc()
		if ctx.Err() == nil {
			e.log.Error("quota enforcer: cannot publish decisions; retrying at the next evaluation", "err", err, "decisions", len(pub))
		}
		return err
	}
	for _, d := range pub {
		e.m.published.WithLabelValues(string(d.State), string(d.Mode)).Inc()
	}
	if republish {
		if l.takenOver {
			l.republished = true
		}
		l.takenOver = true
	}
	sctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), e.cfg.WriteTimeout)
	defer cancel()
	if err := e.store(sctx, *l, pub, starts, tails, payloads); err != nil {
		if !errors.Is(err, ErrNotLeader) {
			e.m.storeErrors.Inc()
			e.log.Error("quota enforcer: published decisions not stored; they are republished at the next evaluation", "err", err)
		}
		return err
	}
	for i, d := range pub {
		if prev, ok := e.last[d.Key()]; ok && prev.State != d.State {
			e.log.Info("quota decision", "customer", d.Customer, "meter", d.Meter, "state", d.State,
				"previous", prev.State, "used", d.Used, "limit", d.Limit, "mode", d.Mode)
		}
		e.last[d.Key()], e.exact[d.Key()] = d, exact[i]
	}
	return nil
}

func (e *Enforcer) readFailed(ctx context.Context, err error) error {
	if ctx.Err() != nil {
		return err
	}
	e.m.evalFailures.Inc()
	e.log.Error("quota enforcer: cannot read rules or usage; publishing nothing fresh (decisions age, consumers apply on_stale)", "err", err)
	return err
}

// due reports whether d must be published given the last published prev.
func (e *Enforcer) due(prev, d Decision) bool {
	return prev.State != d.State || prev.RuleVersion != d.RuleVersion || prev.Period != d.Period ||
		prev.Mode != d.Mode || d.DecidedAt.Sub(prev.DecidedAt) >= e.cfg.Republish ||
		prev.Stale(prev.DecidedAt) != d.Stale(d.DecidedAt) || e.refreshes(prev, d)
}

// refreshes reports whether d, fresher than prev, must replace it before
// consumers find prev stale: a consumer holding prev applies on_stale from
// prev.AsOf + StaleAfter, which comes before the next republication when
// stale_after is shorter than Republish (plus the lag). d is published
// when that instant is less than two evaluations and a second of delivery
// away, so a caught-up customer's decision never reads stale, while one
// whose as_of stands still (a stalled ingest) is not republished for it.
func (e *Enforcer) refreshes(prev, d Decision) bool {
	if prev.State == NoLimit || prev.AsOf == nil || d.AsOf == nil || !d.AsOf.After(*prev.AsOf) || d.Stale(d.DecidedAt) {
		return false // a NoLimit decision never turns stale: nothing to refresh
	}
	staleAt := prev.AsOf.Add(time.Duration(prev.StaleAfter))
	return !d.DecidedAt.Add(2*e.cfg.Interval + time.Second).Before(staleAt)
}

// rate records u as a sample and returns the recent rate of usage: from the
// oldest sample of the same period within RateWindow of u's as_of (usage
// over as_of time, so a stalled ingest neither adds samples nor lowers the
// rate), or the coarse rollup rate while there is less than a second of
// samples.
func (e *Enforcer) rate(key string, u ruleUsage) *rate {
	if u.asOf == nil {
		return u.fallback
	}
	ss := e.samples[key]
	if n := len(ss); n > 0 && ss[n-1].period != u.period.Name {
		ss = nil
	}
	if n := len(ss); n == 0 || u.asOf.After(ss[n-1].asOf) {
		ss = append(ss, sample{period: u.period.Name, asOf: *u.asOf, used: u.used})
	}
	cut := u.asOf.Add(-e.cfg.RateWindow)
	i := 0
	for i < len(ss)-1 && ss[i].asOf.Before(cut) {
		i++
	}
	ss = ss[i:]
	e.samples[key] = ss
	first, last := ss[0], ss[len(ss)-1]
	if ms := last.asOf.Sub(first.asOf).Milliseconds(); ms >= 1000 {
		return &rate{Quantity: last.used.Sub(first.used), Millis: ms}
	}
	return u.fallback
}

// store writes published decisions and their overage in one transaction
// fenced by the lease: a deposed leader's write fails with ErrNotLeader.
// The overage is attributed against e.last and e.exact, which still hold
// the decisions before pub (evaluate updates them once pub is stored).
func (e *Enforcer) store(ctx context.Context, l lease, pub []Decision, starts []time.Time, tails []tail, payloads [][]byte) error {
	n := len(pub)
	cs, ms, states, used := make([]string, n), make([]string, n), make([]string, n), make([]string, n)
	versions, decided, stale := make([]int64, n), make([]time.Time, n), make([]bool, n)
	docs := make([]string, n)
	var ov overage
	for i, d := range pub {
		cs[i], ms[i], states[i], used[i] = d.Customer, d.Meter, string(d.State), d.Used.String()
		versions[i], decided[i], stale[i], docs[i] = d.RuleVersion, d.DecidedAt, d.Stale(d.DecidedAt), string(payloads[i])
		start := starts[i]
		var prev *Decision
		if p, ok := e.last[d.Key()]; ok && p.Period == d.Period {
			prev = &p
		}
		ov.add(d.Customer, d.Meter, start, d.Period, prev, e.exact[d.Key()], d.Used, d.Limit, d.DecidedAt)
	}
	for _, t := range tails {
		ov.add(t.prev.Customer, t.prev.Meter, t.start, t.prev.Period, &t.prev, e.exact[t.prev.Key()], t.used, t.prev.Limit, decided[0])
	}
	return pgx.BeginFunc(ctx, e.cfg.Pool, func(tx pgx.Tx) error {
		var one int
		err := tx.QueryRow(ctx, qFence, e.cfg.LeaseName, e.cfg.Holder, l.epoch).Scan(&one)
		if errors.Is(err, pgx.ErrNoRows) {
			return ErrNotLeader
		}
		if err != nil {
			return fmt.Errorf("quota: check the lease: %w", err)
		}
		if _, err := tx.Exec(ctx, qStoreDecisions, cs, ms, versions, starts, states, used, decided, stale, docs, l.epoch); err != nil {
			return fmt.Errorf("quota: store decisions: %w", err)
		}
		if len(ov.customers) > 0 {
			if _, err := tx.Exec(ctx, qAddOverage, ov.customers, ov.meters, ov.starts, ov.names, ov.exceeded, ov.stale, ov.overLimit, decided[0]); err != nil {
				return fmt.Errorf("quota: store overage: %w", err)
			}
		}
		return nil
	})
}

// tail is the end of a period that closed between two decisions.
type tail struct {
	prev  Decision // the last decision of the period
	start time.Time
	used  decimal.Decimal // the period's usage now
}

// overage collects overage rows for one statement.
type overage struct {
	customers, meters, names, exceeded, stale, overLimit []string
	starts                                               []time.Time
}

// add attributes the usage that became visible since prev (the decision in
// force, of the same period; nil when there is none) to the state prev
// showed: exceeded in enforce mode, else stale if prev had gone stale by
// now. The two never count the same usage. Under an exact rule
// (prevExact) gateways admit from grants, not from the decision: nothing
// is attributed to its state.
func (o *overage) add(customer, meter string, start time.Time, period string, prev *Decision, prevExact bool,
	used, limit decimal.Decimal, now time.Time) {
	ex, st := decimal.Zero, decimal.Zero
	// Under a NoLimit decision there was no limit to admit usage past.
	if prev != nil && !prevExact && prev.State != NoLimit {
		if delta := used.Sub(prev.Used); delta.IsPositive() {
			switch {
			case prev.Mode == Enforce && prev.State == Exceeded:
				ex = delta
			case prev.Stale(now):
				st = delta
			}
		}
	}
	ol := decimal.Max(used.Sub(limit), decimal.Zero)
	if ex.IsPositive() || st.IsPositive() || ol.IsPositive() {
		o.customers, o.meters, o.starts, o.names = append(o.customers, customer), append(o.meters, meter), append(o.starts, start), append(o.names, period)
		o.exceeded, o.stale, o.overLimit = append(o.exceeded, ex.String()), append(o.stale, st.String()), append(o.overLimit, ol.String())
	}
}
