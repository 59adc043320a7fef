// Package chaosbench runs ingest members under a seeded schedule of faults and
// checks that exactness and availability held: every member reads Postgres
// and Kafka through a fault proxy of its own (internal/faultproxy), and each
// step blackholes, resets or slows one member's link, or restarts a member,
// for a while, or freezes it (both links at once), then heals. As Config
// enables them, one more member runs as a real subprocess (tally serve
// --ingest) that a step stops with SIGSTOP past its lease; gateways race for
// exact grants through the REST API of an API process (tally serve --api)
// whose Postgres link steps reset or blackhole; and a private Postgres is
// restarted with pg_ctl restart -m immediate. At the end every record
// produced is in the ledger exactly once (totals exact to the last digit),
// no stored offset ever moved backwards, no gateway admitted past the limit
// and every grant answered is stored, and every member and the API process
// are ready again (NotReady empty, /readyz 200).
//
// The short schedule runs in the package's tests; `tally bench chaos --seed
// N` runs a long one and prints the schedule it ran, so a failure can be
// replayed.
package chaosbench

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"math/rand/v2"
	"net"
	"net/url"
	"os/exec"
	"slices"
	"sort"
	"strings"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/segmentio/kafka-go"
	"github.com/shopspring/decimal"

	"github.com/tally-ledger/tally/ingest"
	"github.com/tally-ledger/tally/ingest/wire"
	"github.com/tally-ledger/tally/internal/faultproxy"
	"github.com/tally-ledger/tally/ledger"
)

// Config is one chaos run. DatabaseURL (a migrated database of the run's
// own) and Broker (one Kafka broker whose Topic exists) are required.
type Config struct {
	DatabaseURL string
	Broker      string
	Topic       string // default ingest.DefaultTopic
	Members     int    // default 3
	Seed        uint64
	Steps       int           // faults in the schedule; default 6
	MaxFault    time.Duration // longest fault; default 3s (past the lease)
	Customers   int           // streams produced; default 8
	// HeartbeatInterval and SessionTimeout are the members' lease timings;
	// defaults 100ms and 1.5s (a fault of a few seconds outlasts a lease).
	HeartbeatInterval, SessionTimeout time.Duration
	// Gateways, when positive, race for exact grants of one budget of
	// GrantLimit units (default 400 per step) through the grant path: the
	// REST API of an API process (tally serve --api) when Process is set,
	// else admission.Store in process; its Postgres link is its own, and
	// faults api-reset and api-blackhole cut it (see gateways.go).
	Gateways   int
	GrantLimit decimal.Decimal
	// Process, when set, starts one more member as a real subprocess (`tally
	// serve --ingest` with ServeArgs) that fault sigstop stops with SIGSTOP
	// past its lease, then continues, and the API process the gateways call
	// (`tally serve --api`); their /readyz is probed. Their output goes to
	// ProcessLog (default: discarded).
	Process    func(ProcessSpec) *exec.Cmd
	ProcessLog io.Writer
	// RestartPostgres, when set, is the fault postgres-restart: the whole
	// server restarted at once (pg_ctl restart -m immediate), every
	// member's and the grant path's sessions cut.
	RestartPostgres func(context.Context) error
	// PostgresTarget is what the proxies forward Postgres traffic to:
	// host:port, or unix:/path of a private cluster's socket. Default
	// DatabaseURL's host.
	PostgresTarget string
	// Out receives the schedule as it runs, one line per step.
	Out io.Writer
	// Logger receives the members' logs. Default: discard.
	Logger *slog.Logger
}

func (c Config) withDefaults() Config {
	if c.Topic == "" {
		c.Topic = ingest.DefaultTopic
	}
	if c.Members == 0 {
		c.Members = 3
	}
	if c.Steps == 0 {
		c.Steps = 6
	}
	if c.MaxFault == 0 {
		c.MaxFault = 3 * time.Second
	}
	if c.Customers == 0 {
		c.Customers = 8
	}
	if c.HeartbeatInterval == 0 {
		c.HeartbeatInterval = 100 * time.Millisecond
	}
	if c.SessionTimeout == 0 {
		c.SessionTimeout = 1500 * time.Millisecond
	}
	if c.Out == nil {
		c.Out = io.Discard
	}
	if c.ProcessLog == nil {
		c.ProcessLog = io.Discard
	}
	if c.Gateways > 0 && c.GrantLimit.IsZero() {
		// About what the gateways consume over the schedule: they race
		// near the limit for much of the run.
		c.GrantLimit = decimal.NewFromInt(int64(400 * c.Steps))
	}
	if c.PostgresTarget == "" {
		if u, err := url.Parse(c.DatabaseURL); err == nil {
			c.PostgresTarget = u.Host
		}
	}
	if c.Logger == nil {
		c.Logger = slog.New(slog.DiscardHandler)
	}
	return c
}

// Validate reports every configuration problem at once.
func (c Config) Validate() error {
	var errs []error
	if c.DatabaseURL == "" {
		errs = append(errs, errors.New("chaos: DatabaseURL is empty"))
	}
	if c.Broker == "" {
		errs = append(errs, errors.New("chaos: Broker is empty"))
	}
	if c.Members < 0 || c.Steps < 0 || c.Customers < 0 || c.Gateways < 0 || c.GrantLimit.IsNegative() {
		errs = append(errs, fmt.Errorf("chaos: Members %d, Steps %d, Customers %d, Gateways %d and GrantLimit %s must not be negative",
			c.Members, c.Steps, c.Customers, c.Gateways, c.GrantLimit))
	}
	return errors.Join(errs...)
}

// Step is one fault of the schedule.
type Step struct {
	Member int // -1: not a member's (the grant path's, the server's)
	// Fault is one of Faults: postgres-blackhole, postgres-reset,
	// postgres-latency, kafka-blackhole, kafka-reset, restart (a clean stop,
	// then a new consumer), freeze (both links blackholed at once: to the
	// rest of the system, a stalled process); or, as Config enables them,
	// one of GrantFaults (the grant path's Postgres link), sigstop (the
	// member process stopped past its lease) or postgres-restart.
	Fault string
	For   time.Duration
}

func (s Step) String() string {
	switch {
	case s.Fault == "postgres-restart":
		return "Postgres server: pg_ctl restart -m immediate"
	case s.Member < 0:
		return fmt.Sprintf("grant path: %s for %s", s.Fault, s.For)
	}
	return fmt.Sprintf("member %d: %s for %s", s.Member, s.Fault, s.For)
}

// Faults are the faults a schedule draws from.
var Faults = []string{"postgres-blackhole", "postgres-reset", "postgres-latency", "kafka-blackhole", "kafka-reset", "restart", "freeze"}

// GrantFaults are the grant path's faults (Config.Gateways).
var GrantFaults = []string{"api-reset", "api-blackhole"}

// faults are the faults cfg's schedule draws from.
func (c Config) faults() []string {
	out := slices.Clone(Faults)
	if c.Gateways > 0 {
		out = append(out, GrantFaults...)
	}
	if c.Process != nil {
		out = append(out, "sigstop")
	}
	if c.RestartPostgres != nil {
		out = append(out, "postgres-restart")
	}
	return out
}

// GrantLimitOf is the limit cfg's gateways race for.
func GrantLimitOf(cfg Config) decimal.Decimal { return cfg.withDefaults().GrantLimit }

// FaultsOf are the faults cfg's schedule draws from.
func FaultsOf(cfg Config) []string { return cfg.withDefaults().faults() }

// Schedule returns the seeded schedule of cfg: every fault once per round
// of len(FaultsOf(cfg)) steps, each on a random member (the member process,
// if any, is the last) for a random time; sigstop lasts past the lease.
func Schedule(cfg Config) []Step {
	cfg = cfg.withDefaults()
	faults := cfg.faults()
	members := cfg.Members
	if cfg.Process != nil {
		members++
	}
	rng := rand.New(rand.NewPCG(cfg.Seed, cfg.Seed^0x9e3779b97f4a7c15))
	out := make([]Step, cfg.Steps)
	var order []int // every fault once per round, in a random order
	for i := range out {
		if len(order) == 0 {
			order = rng.Perm(len(faults))
		}
		f := order[0]
		order = order[1:]
		s := Step{Member: rng.IntN(members), Fault: faults[f],
			For: time.Duration(200+rng.Int64N(cfg.MaxFault.Milliseconds()-199)) * time.Millisecond}
		switch s.Fault {
		case "sigstop":
			s.Member = members - 1
			s.For = max(s.For, cfg.SessionTimeout+500*time.Millisecond)
		case "api-reset", "api-blackhole":
			s.Member = -1
		case "postgres-restart":
			s.Member, s.For = -1, 0
		}
		out[i] = s
	}
	return out
}

// Report is what a run did.
type Report struct {
	Schedule []Step
	Grants   GrantReport   // with Config.Gateways
	Records  int64         // records produced (each applied exactly once)
	Messages int64         // Kafka messages produced
	Healed   time.Duration // from the last heal until every member was ready and caught up
}

// member is one consumer with its two proxies.
type member struct {
	pg, kafka *faultproxy.Proxy
	pool      *pgxpool.Pool
	consumer  *ingest.Consumer
	cancel    context.CancelFunc
	done      chan error
	proc      *process // a member process (Config.Process) instead of consumer
}

// Run runs cfg's schedule and checks the outcome; the error says what did
// not hold.
func Run(ctx context.Context, cfg Config) (Report, error) {
	if err := cfg.Validate(); err != nil {
		return Report{}, err
	}
	cfg = cfg.withDefaults()
	l, err := ledger.New(ledger.Config{Logger: cfg.Logger})
	if err != nil {
		return Report{}, err
	}
	r := &run{cfg: cfg, ledger: l}
	check, err := pgxpool.New(ctx, cfg.DatabaseURL)
	if err != nil {
		return Report{}, err
	}
	defer check.Close()
	r.check = check
	defer r.stopAll()
	for range cfg.Members {
		m, err := r.newMember(ctx, false)
		if err != nil {
			return Report{}, err
		}
		r.members = append(r.members, m)
	}
	if cfg.Process != nil {
		m, err := r.newMember(ctx, true)
		if err != nil {
			return Report{}, err
		}
		r.members = append(r.members, m)
		if err := r.waitProcessReady(ctx, m, 30*time.Second); err != nil {
			return Report{}, err
		}
	}
	if cfg.Gateways > 0 {
		g, err := r.startGateways(ctx, check, cfg.Gateways)
		if err != nil {
			return Report{}, err
		}
		defer g.close()
		r.gw = g
	}
	mon := ingest.WatchOffsets(check, 20*time.Millisecond)
	defer mon.Stop()
	prod := newProducer(cfg, cfg.Seed)
	defer func() {
		_ = prod.w.Close()
		prod.tr.CloseIdleConnections()
	}()
	pctx, stopProducing := context.WithCancel(ctx)
	pdone := make(chan error, 1)
	go func() { pdone <- prod.run(pctx) }()

	rep := Report{Schedule: Schedule(cfg)}
	rng := rand.New(rand.NewPCG(cfg.Seed+1, cfg.Seed+2))
	for i, s := range rep.Schedule {
		fmt.Fprintf(cfg.Out, "  step %d/%d: %s\n", i+1, len(rep.Schedule), s)
		if err := r.apply(ctx, s); err != nil {
			stopProducing()
			<-pdone
			return rep, err
		}
		gap := time.Duration(200+rng.IntN(800)) * time.Millisecond
		select {
		case <-ctx.Done():
		case <-time.After(gap):
		}
	}
	stopProducing()
	if err := <-pdone; err != nil {
		return rep, err
	}
	rep.Records, rep.Messages = prod.records, prod.messages
	healed := time.Now()
	if err := r.waitHealed(ctx, prod, 2*time.Minute); err != nil {
		return rep, err
	}
	rep.Healed = time.Since(healed)
	mon.Sample()
	problems := mon.Regressions()
	ledgerProblems, err := checkLedger(ctx, check, prod.streams)
	if err != nil {
		return rep, err
	}
	problems = append(problems, ledgerProblems...)
	if r.gw != nil {
		g, gp, err := r.gw.check(ctx, check)
		if err != nil {
			return rep, err
		}
		rep.Grants = g
		problems = append(problems, gp...)
	}
	if len(problems) > 0 {
		return rep, fmt.Errorf("chaos (seed %d): %s", cfg.Seed, strings.Join(problems, "; "))
	}
	return rep, nil
}

type run struct {
	cfg     Config
	ledger  *ledger.Ledger
	check   *pgxpool.Pool
	members []*member
	gw      *gateways
}

// newMember starts a consumer whose Postgres and Kafka links go through
// proxies of its own.
func (r *run) newMember(ctx context.Context, asProcess bool) (*member, error) {
	pg, err := faultproxy.Start(r.cfg.PostgresTarget)
	if err != nil {
		return nil, err
	}
	kp, err := faultproxy.Start(r.cfg.Broker)
	if err != nil {
		pg.Close()
		return nil, err
	}
	m := &member{pg: pg, kafka: kp}
	start := r.startConsumer
	if asProcess {
		start = func(context.Context, *member) error { return r.startProcess(m) }
	}
	if err := start(ctx, m); err != nil {
		pg.Close()
		kp.Close()
		return nil, err
	}
	return m, nil
}

func (r *run) startConsumer(ctx context.Context, m *member) error {
	pool, err := pgxpool.New(ctx, proxiedURL(r.cfg.DatabaseURL, m.pg.Addr()))
	if err != nil {
		return err
	}
	kafkaAddr := m.kafka.Addr()
	d := &kafka.Dialer{Timeout: 5 * time.Second, DualStack: true}
	// One broker: every connection, bootstrap or not, goes through the
	// member's proxy.
	d.DialFunc = func(ctx context.Context, network, _ string) (net.Conn, error) {
		var nd net.Dialer
		return nd.DialContext(ctx, network, kafkaAddr)
	}
	c, err := ingest.NewConsumer(ingest.Config{
		Brokers: []string{kafkaAddr}, Topic: r.cfg.Topic, Pool: pool, Ledger: r.ledger,
		Logger: r.cfg.Logger, Registry: prometheus.NewRegistry(), Dialer: d,
		MaxBatchRecords: 500, MaxBatchWait: 50 * time.Millisecond,
		RetryMin: 10 * time.Millisecond, RetryMax: 300 * time.Millisecond,
		TxTimeout: 5 * time.Second, PositionInterval: 200 * time.Millisecond,
		HeartbeatInterval: r.cfg.HeartbeatInterval, SessionTimeout: r.cfg.SessionTimeout,
		FetchMaxWait: 500 * time.Millisecond, KafkaCommitEvery: -1,
	})
	if err != nil {
		pool.Close()
		return err
	}
	cctx, cancel := context.WithCancel(context.WithoutCancel(ctx))
	m.pool, m.consumer, m.cancel, m.done = pool, c, cancel, make(chan error, 1)
	go func() { m.done <- c.Run(cctx) }()
	return nil
}

func (r *run) stopConsumer(m *member) error {
	if m.proc != nil {
		return r.stopProcess(m)
	}
	if m.cancel == nil {
		return nil
	}
	m.cancel()
	m.cancel = nil
	var err error
	select {
	case err = <-m.done:
	case <-time.After(30 * time.Second):
		err = errors.New("a member did not stop within 30s")
	}
	m.pool.Close()
	return err
}

func (r *run) stopAll() {
	for _, m := range r.members {
		m.pg.Pass()
		m.kafka.Pass()
		_ = r.stopConsumer(m)
		m.pg.Close()
		m.kafka.Close()
	}
}

// apply runs one step: the fault for its duration, then the heal.
func (r *run) apply(ctx context.Context, s Step) error {
	wait := func() {
		select {
		case <-ctx.Done():
		case <-time.After(s.For):
		}
	}
	switch s.Fault {
	case "api-reset":
		r.gw.proxy.Reset()
		wait()
		r.gw.proxy.Pass()
		return nil
	case "api-blackhole":
		r.gw.proxy.Blackhole()
		wait()
		r.gw.proxy.Pass()
		return nil
	case "postgres-restart":
		if err := r.cfg.RestartPostgres(ctx); err != nil {
			return fmt.Errorf("postgres-restart: %w", err)
		}
		return nil
	}
	m := r.members[s.Member]
	switch s.Fault {
	case "sigstop":
		if m.proc == nil {
			return fmt.Errorf("sigstop: member %d is not a process", s.Member)
		}
		if err := pauseProcess(ctx, m, s.For); err != nil {
			return fmt.Errorf("sigstop member %d: %w", s.Member, err)
		}
	case "postgres-blackhole":
		m.pg.Blackhole()
		wait()
		m.pg.Pass()
	case "postgres-reset":
		m.pg.Reset()
		wait()
		m.pg.Pass()
	case "postgres-latency":
		m.pg.Latency(s.For / 20)
		wait()
		m.pg.Latency(0)
	case "kafka-blackhole":
		m.kafka.Blackhole()
		wait()
		m.kafka.Pass()
	case "kafka-reset":
		m.kafka.Reset()
		wait()
		m.kafka.Pass()
	case "freeze":
		m.pg.Blackhole()
		m.kafka.Blackhole()
		wait()
		m.pg.Pass()
		m.kafka.Pass()
	case "restart":
		if err := r.stopConsumer(m); err != nil {
			return fmt.Errorf("restart member %d: %w", s.Member, err)
		}
		wait()
		start := r.startConsumer
		if r.cfg.Process != nil && s.Member == len(r.members)-1 {
			start = func(ctx context.Context, m *member) error {
				if err := r.startProcess(m); err != nil {
					return err
				}
				return r.waitProcessReady(ctx, m, 30*time.Second)
			}
		}
		if err := start(ctx, m); err != nil {
			return fmt.Errorf("restart member %d: %w", s.Member, err)
		}
	default:
		return fmt.Errorf("unknown fault %q", s.Fault)
	}
	return nil
}

// waitHealed waits until every member is ready and every partition's
// stored offset is its high watermark.
func (r *run) waitHealed(ctx context.Context, prod *producer, timeout time.Duration) error {
	deadline := time.Now().Add(timeout)
	var last string
	for time.Now().Before(deadline) {
		last = ""
		for i, m := range r.members {
			if m.proc != nil {
				if nr := m.proc.notReady(ctx); nr != "" {
					last = fmt.Sprintf("member process %d not ready: %s", i, nr)
					break
				}
				continue
			}
			if nr := m.consumer.NotReady(); len(nr) > 0 {
				last = fmt.Sprintf("member %d not ready: %s", i, strings.Join(nr, "; "))
				break
			}
		}
		if last == "" && r.gw != nil {
			if nr := r.gw.notReady(ctx); nr != "" {
				last = "API process not ready: " + nr
			}
		}
		if last == "" {
			lag, err := prod.lag(ctx, r.check)
			switch {
			case err != nil:
				last = err.Error()
			case lag != "":
				last = lag
			default:
				return nil
			}
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(100 * time.Millisecond):
		}
	}
	return fmt.Errorf("chaos (seed %d): not healed %s after the last fault: %s", r.cfg.Seed, timeout, last)
}

// stream is one (producer, epoch, customer, meter) stream and its total.
type stream struct {
	customer string
	seq      int64
	total    decimal.Decimal
}

// producer sends batches of its streams until stopped; a send that fails
// is sent again (the ledger bills a retransmit once).
type producer struct {
	cfg      Config
	tr       *kafka.Transport // the producer's and lag's: closed by run
	rng      *rand.Rand
	streams  []*stream
	w        *kafka.Writer
	records  int64
	messages int64
}

func newProducer(cfg Config, seed uint64) *producer {
	p := &producer{cfg: cfg, rng: rand.New(rand.NewPCG(seed, seed+7)), tr: &kafka.Transport{}}
	for i := range cfg.Customers {
		p.streams = append(p.streams, &stream{customer: fmt.Sprintf("chaos-%02d", i)})
	}
	p.w = &kafka.Writer{Addr: kafka.TCP(cfg.Broker), Topic: cfg.Topic, Balancer: &kafka.Murmur2Balancer{}, Transport: p.tr,
		RequiredAcks: kafka.RequireAll, BatchTimeout: 5 * time.Millisecond, MaxAttempts: 10}
	return p
}

func (p *producer) run(ctx context.Context) error {
	for ctx.Err() == nil {
		s := p.streams[p.rng.IntN(len(p.streams))]
		b := wire.Batch{Schema: wire.Schema, BatchID: uuid.Must(uuid.NewV7()), Producer: "chaos", Epoch: 1, SentAt: time.Now().UTC()}
		for range 1 + p.rng.IntN(20) {
			s.seq++
			q := decimal.New(p.rng.Int64N(100000), -3)
			s.total = s.total.Add(q)
			b.Records = append(b.Records, wire.Record{OperationID: uuid.Must(uuid.NewV7()), Customer: s.customer, Meter: "api_calls",
				Seq: s.seq, Total: s.total, Quantity: decimal.NewNullDecimal(q),
				OccurredAt: time.Now().UTC().Add(-time.Minute).Truncate(time.Microsecond)})
		}
		v, err := wire.Encode(b)
		if err != nil {
			return err
		}
		msg := kafka.Message{Key: []byte(s.customer), Value: v}
		for {
			// Sent whole even when the run stops meanwhile: the model
			// already counts these records.
			wctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 10*time.Second)
			err := p.w.WriteMessages(wctx, msg)
			cancel()
			if err == nil {
				break
			}
			time.Sleep(100 * time.Millisecond)
		}
		p.records += int64(len(b.Records))
		p.messages++
		select {
		case <-ctx.Done():
		case <-time.After(10 * time.Millisecond):
		}
	}
	return nil
}

// lag describes the partitions not caught up ("" when all are).
func (p *producer) lag(ctx context.Context, pool *pgxpool.Pool) (string, error) {
	c := &kafka.Client{Addr: kafka.TCP(p.cfg.Broker), Timeout: 5 * time.Second, Transport: p.tr}
	md, err := c.Metadata(ctx, &kafka.MetadataRequest{Topics: []string{p.cfg.Topic}})
	if err != nil || len(md.Topics) != 1 {
		return "", fmt.Errorf("topic metadata: %v", err)
	}
	var reqs []kafka.OffsetRequest
	for _, pt := range md.Topics[0].Partitions {
		reqs = append(reqs, kafka.LastOffsetOf(pt.ID))
	}
	res, err := c.ListOffsets(ctx, &kafka.ListOffsetsRequest{Topics: map[string][]kafka.OffsetRequest{p.cfg.Topic: reqs}})
	if err != nil {
		return "", err
	}
	st, err := ingest.Status(ctx, pool, p.cfg.Topic)
	if err != nil {
		return "", err
	}
	stored := map[int]int64{}
	for _, s := range st {
		stored[s.Partition] = s.NextOffset
	}
	var behind []string
	for _, po := range res.Topics[p.cfg.Topic] {
		if stored[po.Partition] != po.LastOffset {
			behind = append(behind, fmt.Sprintf("partition %d at %d of %d", po.Partition, stored[po.Partition], po.LastOffset))
		}
	}
	sort.Strings(behind)
	if len(behind) > 0 {
		return "not caught up: " + strings.Join(behind, ", "), nil
	}
	return "", nil
}

// checkLedger compares the ledger with the streams, exactly.
func checkLedger(ctx context.Context, pool *pgxpool.Pool, streams []*stream) ([]string, error) {
	rows, err := pool.Query(ctx, `SELECT customer, sum(billed)::text, count(*) FROM records WHERE meter = 'api_calls' GROUP BY customer`)
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	type got struct {
		sum string
		n   int64
	}
	have := map[string]got{}
	for rows.Next() {
		var c string
		var g got
		if err := rows.Scan(&c, &g.sum, &g.n); err != nil {
			return nil, err
		}
		have[c] = g
	}
	if err := rows.Err(); err != nil {
		return nil, err
	}
	var problems []string
	for _, s := range streams {
		g := have[s.customer]
		if s.seq == 0 {
			continue
		}
		sum, err := decimal.NewFromString(g.sum)
		if err != nil || !sum.Equal(s.total) || g.n != s.seq {
			problems = append(problems, fmt.Sprintf("%s: billed %q in %d records, want exactly %s in %d", s.customer, g.sum, g.n, s.total, s.seq))
		}
	}
	return problems, nil
}
