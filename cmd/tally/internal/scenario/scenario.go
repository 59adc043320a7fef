package scenario

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"math"
	"math/rand/v2"
	"os"
	"path/filepath"
	"sort"
	"sync"
	"sync/atomic"
	"time"

	"github.com/google/uuid"
	"github.com/segmentio/kafka-go"
	"github.com/shopspring/decimal"

	"github.com/tally-ledger/tally/producer"
)

// Faults choose which faults a run injects. Each fault with a
// probability above zero happens at its first chance and then at that
// rate, so even a short run shows every fault it asks for.
type Faults struct {
	// Duplicates is the probability that a message is written twice.
	Duplicates float64
	// Retransmits is the probability that a write is reported failed after
	// it succeeded, so the producer resends the same batches. A write that
	// lost a message is acknowledged, never reported failed.
	Retransmits float64
	// Lost is the probability that a message is acknowledged but never
	// written (only middle batches end up lost; see the package doc). A
	// loss that a resend undoes (after a producer crash) is no loss, and
	// until one stands, every chance loses a message.
	Lost float64
	// Reorder is the probability that a message is written after later
	// ones.
	Reorder float64
	// Crashes is how many producer crashes happen during the run.
	Crashes int
	// BadMessages is how many raw bad messages are sent.
	BadMessages int
}

// AllFaults is every fault at a rate that shows in a short run.
func AllFaults() Faults {
	return Faults{Duplicates: 0.05, Retransmits: 0.05, Lost: 0.05, Reorder: 0.05, Crashes: 2, BadMessages: 3}
}

// Config configures a run. Zero values take the documented defaults.
type Config struct {
	// Brokers are the Kafka bootstrap addresses. Required.
	Brokers []string
	// Topic is the meter-batch topic. Default "tally.meter-batches".
	Topic string
	// Run prefixes every producer and customer id, so runs never mix.
	// Default: 8 random hex digits.
	Run string
	// Producers, Customers and Meters: each producer reports usage of
	// every meter of every customer. Defaults 2, 3, 2.
	Producers, Customers, Meters int
	// Gauges and Uniques add that many gauge meters (g1, g2, …: levels of
	// 0 to 50 in thousandths, changing by random steps, through
	// RecordLevel) and unique meters (u1, u2, …: members user-0 to
	// user-49, through RecordMember) per customer, beside the Meters
	// counters. They must be declared (DeclareMeters) before the run.
	Gauges, Uniques int
	// Workers is how many goroutines call Record on each producer.
	// Default 4.
	Workers int
	// Rate bounds acknowledged records per second over all producers;
	// 0 is as fast as the producers go.
	Rate float64
	// Duration is how long usage is recorded. Default 10s unless Records
	// is set.
	Duration time.Duration
	// Records stops the run after this many records (0: by Duration).
	Records int64
	// Spread spreads occurred_at uniformly over [now-Spread, now], to
	// cover several accounting periods (e.g. 45 days). Default 0.
	Spread time.Duration
	// Dir holds the producers' state directories. Default: a temporary
	// directory removed when the run ends.
	Dir string
	// Seed makes quantities and faults repeatable. Default random.
	Seed uint64
	// Faults to inject.
	Faults Faults
	// Linger is the producers' Linger. Default 50ms.
	Linger time.Duration
	// Logger receives the producers' logs. Default: discard.
	Logger *slog.Logger
	// Progress, when set, is called about twice a second with the
	// counts so far.
	Progress func(Stats)
}

// Validate reports every configuration problem at once.
func (c Config) Validate() error {
	var errs []error
	if len(c.Brokers) == 0 {
		errs = append(errs, errors.New("scenario: no Kafka brokers"))
	}
	for _, n := range []struct {
		name string
		v    int
	}{{"producers", c.Producers}, {"customers", c.Customers}, {"meters", c.Meters}, {"gauges", c.Gauges}, {"uniques", c.Uniques}, {"workers", c.Workers}, {"crashes", c.Faults.Crashes}, {"bad messages", c.Faults.BadMessages}} {
		if n.v < 0 {
			errs = append(errs, fmt.Errorf("scenario: %s %d is negative", n.name, n.v))
		}
	}
	for _, p := range []struct {
		name string
		v    float64
	}{{"duplicates", c.Faults.Duplicates}, {"retransmits", c.Faults.Retransmits}, {"lost", c.Faults.Lost}, {"reorder", c.Faults.Reorder}} {
		if !(p.v >= 0 && p.v <= 0.5) { // NaN too
			errs = append(errs, fmt.Errorf("scenario: %s probability %v is outside 0..0.5", p.name, p.v))
		}
	}
	if c.Faults.Lost+c.Faults.Reorder > 0.5 {
		errs = append(errs, errors.New("scenario: lost + reorder probabilities exceed 0.5"))
	}
	if !(c.Rate >= 0) || math.IsInf(c.Rate, 1) || c.Duration < 0 || c.Records < 0 || c.Spread < 0 {
		errs = append(errs, errors.New("scenario: rate, duration, records and spread must not be negative (nor the rate NaN or infinite)"))
	}
	return errors.Join(errs...)
}

func (c Config) withDefaults() Config {
	if c.Topic == "" {
		c.Topic = producer.DefaultTopic
	}
	if c.Run == "" {
		c.Run = uuid.NewString()[:8]
	}
	if c.Producers == 0 {
		c.Producers = 2
	}
	if c.Customers == 0 {
		c.Customers = 3
	}
	if c.Meters == 0 {
		c.Meters = 2
	}
	if c.Workers == 0 {
		c.Workers = 4
	}
	if c.Duration == 0 && c.Records == 0 {
		c.Duration = 10 * time.Second
	}
	if c.Seed == 0 {
		c.Seed = rand.Uint64()
	}
	if c.Linger == 0 {
		c.Linger = 50 * time.Millisecond
	}
	if c.Logger == nil {
		c.Logger = slog.New(slog.DiscardHandler)
	}
	return c
}

// gen is one producer of a run, replaced on a crash.
type gen struct {
	mu  sync.RWMutex // Record holds it shared; a crash holds it exclusively
	id  string
	dir string
	p   *producer.Producer
}

// Run records usage, injects faults, closes the producers and returns the
// ground truth. It fails if a producer refused usage, or lost or invented
// any.
//
// It reads as its steps: start the producers → load (workers, crashes,
// progress) → close them → deliver (drain, bad messages) → read Kafka back
// into the truth → cross-check it with what the producers acknowledged.
func Run(ctx context.Context, cfg Config) (*Expect, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	cfg = cfg.withDefaults()
	if cfg.Dir == "" {
		d, err := os.MkdirTemp("", "tally-produce-")
		if err != nil {
			return nil, err
		}
		defer os.RemoveAll(d)
		cfg.Dir = d
	}
	tr := &kafka.Transport{}
	defer tr.CloseIdleConnections()
	kw := &kafka.Writer{Addr: kafka.TCP(cfg.Brokers...), Topic: cfg.Topic, Transport: tr,
		Balancer: &kafka.Murmur2Balancer{}, RequiredAcks: kafka.RequireAll,
		BatchTimeout: 2 * time.Millisecond, BatchSize: 1 << 20, BatchBytes: 64 << 20, MaxAttempts: 3}
	defer kw.Close()
	t := newTracker(kw, cfg.Faults, cfg.Seed)
	startOffsets, err := endOffsets(ctx, cfg.Brokers, cfg.Topic)
	if err != nil {
		return nil, err
	}
	s, err := startRun(cfg, t)
	if err != nil {
		return nil, err
	}
	loadTime := s.load(ctx)
	if s.firstErr == nil {
		s.lastLevels(ctx)
	}

	closeCtx, closeCancel := context.WithTimeout(context.WithoutCancel(ctx), 2*time.Minute)
	defer closeCancel()
	if err := s.closeProducers(closeCtx); err != nil {
		return nil, err
	}
	if err := t.drain(closeCtx); err != nil {
		return nil, err
	}
	e := &Expect{Run: cfg.Run, Topic: cfg.Topic, GeneratedAt: time.Now().UTC(), Customers: s.customers,
		DeadLetters: map[string]int{}}
	if err := sendBad(closeCtx, kw, t, cfg, e); err != nil {
		return nil, err
	}
	delivered, err := readBack(closeCtx, cfg.Brokers, cfg.Topic, cfg.Run, startOffsets)
	if err != nil {
		return nil, err
	}
	unbilled, err := t.truth(e, delivered)
	if err != nil {
		return nil, err
	}
	if err := errors.Join(s.crossCheck(e, unbilled), s.crossCheckReadings()); err != nil {
		return e, err
	}
	s.stats(e, loadTime)
	return e, nil
}

// scenarioRun is a run's producers and what its goroutines share.
type scenarioRun struct {
	cfg       Config
	t         *tracker
	customers []string
	meters    []string
	gauges    []string
	uniques   []string
	gens      []*gen
	levels    map[levelKey]*levelStream // every producer's level of every customer's gauge

	epochsMu sync.Mutex
	epochs   map[[2]any]bool // producer, epoch: every epoch the run used

	start                  time.Time
	issued, acked, crashes atomic.Int64
	ackedMu                sync.Mutex
	ackedSum               map[[2]string]decimal.Decimal // customer, meter
	cancel                 context.CancelFunc            // ends the load
	errOnce                sync.Once
	firstErr               error
	firstErrSet            atomic.Bool

	readingsMu sync.Mutex
	readings   map[string]int // acknowledged gauge and unique readings (readingKey)
}

// startRun names the customers and meters and opens the producers.
func startRun(cfg Config, t *tracker) (*scenarioRun, error) {
	s := &scenarioRun{cfg: cfg, t: t, epochs: map[[2]any]bool{}, ackedSum: map[[2]string]decimal.Decimal{},
		levels: map[levelKey]*levelStream{}, readings: map[string]int{}}
	s.customers = make([]string, cfg.Customers)
	for i := range s.customers {
		s.customers[i] = fmt.Sprintf("%s-c%d", cfg.Run, i+1)
	}
	s.meters = make([]string, cfg.Meters)
	for i := range s.meters {
		s.meters[i] = fmt.Sprintf("m%d", i+1)
	}
	s.gauges, s.uniques = GaugeMeters(cfg.Gauges), UniqueMeters(cfg.Uniques)
	s.gens = make([]*gen, cfg.Producers)
	for i := range s.gens {
		g := &gen{id: fmt.Sprintf("%s-p%d", cfg.Run, i+1)}
		for _, c := range s.customers {
			for _, m := range s.gauges {
				s.levels[levelKey{g.id, c, m}] = &levelStream{}
			}
		}
		g.dir = filepath.Join(cfg.Dir, g.id)
		if err := s.open(g); err != nil {
			return nil, err
		}
		s.epochs[[2]any{g.id, g.p.Epoch()}] = true
		s.gens[i] = g
	}
	return s, nil
}

// open starts g's producer on its state directory.
func (s *scenarioRun) open(g *gen) error {
	p, err := producer.New(producer.Config{Producer: g.id, Dir: g.dir, Writer: s.t, Linger: s.cfg.Linger,
		RetryMin: 20 * time.Millisecond, RetryMax: 500 * time.Millisecond, Logger: s.cfg.Logger})
	g.p = p
	return err
}

// fail records the run's first error and ends the load.
func (s *scenarioRun) fail(err error) {
	s.errOnce.Do(func() { s.firstErr = err; s.firstErrSet.Store(true); s.cancel() })
}

// load records usage with cfg.Workers workers per producer while the
// crashes happen and progress is reported, until the records or the
// duration are done (or a worker failed), and returns how long it took.
func (s *scenarioRun) load(ctx context.Context) time.Duration {
	runCtx, cancel := context.WithCancel(ctx)
	defer cancel()
	s.cancel = cancel
	if s.cfg.Duration > 0 {
		var cancelTimeout context.CancelFunc
		runCtx, cancelTimeout = context.WithTimeout(runCtx, s.cfg.Duration)
		defer cancelTimeout()
	}
	s.start = time.Now()
	var wg sync.WaitGroup
	for gi, g := range s.gens {
		for w := range s.cfg.Workers {
			rng := rand.New(rand.NewPCG(s.cfg.Seed, uint64(gi*1000+w+1)))
			wg.Go(func() { s.work(runCtx, g, rng) })
		}
	}
	crashDone := make(chan struct{})
	go func() {
		defer close(crashDone)
		s.crashProducers(ctx, runCtx)
	}()
	progressDone := make(chan struct{})
	stopProgress := make(chan struct{})
	go func() {
		defer close(progressDone)
		s.progress(stopProgress)
	}()

	wg.Wait()
	loadTime := time.Since(s.start)
	cancel()
	<-crashDone
	close(stopProgress)
	<-progressDone
	return loadTime
}

// work is one worker: it records random usage through g (at cfg.Rate
// overall, when set) and adds what was acknowledged to the run's sum.
func (s *scenarioRun) work(runCtx context.Context, g *gen, rng *rand.Rand) {
	cfg := s.cfg
	local := map[[2]string]decimal.Decimal{}
	defer func() {
		s.ackedMu.Lock()
		for k, q := range local {
			s.ackedSum[k] = s.ackedSum[k].Add(q)
		}
		s.ackedMu.Unlock()
	}()
	for runCtx.Err() == nil {
		n := s.issued.Add(1)
		if cfg.Records > 0 && n > cfg.Records {
			return
		}
		if cfg.Rate > 0 {
			due := s.start.Add(time.Duration(float64(n-1) / cfg.Rate * float64(time.Second)))
			if d := time.Until(due); d > 0 {
				select {
				case <-time.After(d):
				case <-runCtx.Done():
					return
				}
			}
		}
		c := s.customers[rng.IntN(len(s.customers))]
		i := rng.IntN(len(s.meters) + len(s.gauges) + len(s.uniques))
		if i >= len(s.meters) {
			var err error
			if i -= len(s.meters); i < len(s.gauges) {
				err = s.recordLevel(runCtx, g, c, s.gauges[i], rng)
			} else {
				err = s.recordMember(runCtx, g, c, s.uniques[i-len(s.gauges)], rng)
			}
			if err != nil {
				s.fail(fmt.Errorf("scenario: producer %s: %w", g.id, err))
				return
			}
			s.acked.Add(1)
			continue
		}
		m := s.meters[i]
		q := decimal.New(rng.Int64N(10_000_000), -int32(rng.IntN(4)))
		at := time.Now().UTC()
		if cfg.Spread > 0 {
			at = at.Add(-time.Duration(rng.Int64N(int64(cfg.Spread))))
		}
		g.mu.RLock()
		err := g.p.Record(context.WithoutCancel(runCtx), c, m, q, at)
		g.mu.RUnlock()
		if err != nil {
			s.fail(fmt.Errorf("scenario: producer %s: %w", g.id, err))
			return
		}
		local[[2]string{c, m}] = local[[2]string{c, m}].Add(q)
		s.acked.Add(1)
	}
}

// crashProducers crashes the producers in turn, evenly spread over the run (those
// still due when it ends happen then); alternately the state survives or
// is wiped (a new epoch).
func (s *scenarioRun) crashProducers(ctx, runCtx context.Context) {
	cfg := s.cfg
	for i := range cfg.Faults.Crashes {
		frac := float64(i+1) / float64(cfg.Faults.Crashes+1)
		for runCtx.Err() == nil {
			var reached bool
			if cfg.Duration > 0 {
				reached = time.Since(s.start) >= time.Duration(frac*float64(cfg.Duration))
			} else {
				reached = float64(s.acked.Load()) >= frac*float64(cfg.Records)
			}
			if reached {
				break
			}
			time.Sleep(5 * time.Millisecond)
		}
		if ctx.Err() != nil || s.firstErrSet.Load() {
			return
		}
		g := s.gens[i%len(s.gens)]
		if err := crash(ctx, g, i%2 == 1, s.open); err != nil {
			s.fail(err)
			return
		}
		s.crashes.Add(1)
		s.epochsMu.Lock()
		s.epochs[[2]any{g.id, g.p.Epoch()}] = true
		s.epochsMu.Unlock()
		cfg.Logger.Info("producer crashed and restarted", "producer", g.id, "state_wiped", i%2 == 1, "epoch", g.p.Epoch())
	}
}

// progress reports the run's figures to cfg.Progress every 500 ms until stop.
func (s *scenarioRun) progress(stop <-chan struct{}) {
	if s.cfg.Progress == nil {
		return
	}
	tick := time.NewTicker(500 * time.Millisecond)
	defer tick.Stop()
	for {
		select {
		case <-tick.C:
			st := s.t.snapshot()
			st.Records = s.acked.Load()
			st.Seconds = time.Since(s.start).Seconds()
			st.RecordsPerSecond = float64(st.Records) / st.Seconds
			st.Crashes = int(s.crashes.Load())
			s.cfg.Progress(st)
		case <-stop:
			return
		}
	}
}

// closeProducers closes every producer (flushing what it holds); a
// worker's failure comes first, then every close that failed.
func (s *scenarioRun) closeProducers(ctx context.Context) error {
	var closeErrs []error
	for _, g := range s.gens {
		if err := g.p.Close(ctx); err != nil {
			closeErrs = append(closeErrs, fmt.Errorf("scenario: close %s: %w", g.id, err))
		}
	}
	if s.firstErr != nil {
		return s.firstErr
	}
	return errors.Join(closeErrs...)
}

// crossCheck compares the ledger's truth (from what reached Kafka) with
// the usage the producers acknowledged, and records the acknowledged
// totals in e.
func (s *scenarioRun) crossCheck(e *Expect, unbilled map[[2]string]decimal.Decimal) error {
	fromKafka := map[[2]string]decimal.Decimal{}
	for _, tot := range e.Totals {
		k := [2]string{tot.Customer, tot.Meter}
		fromKafka[k] = fromKafka[k].Add(tot.Quantity)
	}
	var problems []error
	for k, q := range unbilled {
		if !q.IsZero() {
			problems = append(problems, fmt.Errorf("scenario: %s/%s: %s acknowledged but never delivered to Kafka", k[0], k[1], q))
		}
	}
	for _, c := range s.customers {
		for _, m := range s.meters {
			k := [2]string{c, m}
			if q := s.ackedSum[k]; !q.IsZero() || !fromKafka[k].IsZero() {
				e.Acknowledged = append(e.Acknowledged, Total{Customer: c, Meter: m, Quantity: q})
			}
			if !s.ackedSum[k].Equal(fromKafka[k]) {
				problems = append(problems, fmt.Errorf("scenario: %s/%s: producers acknowledged %s but sent records totalling %s", c, m, s.ackedSum[k], fromKafka[k]))
			}
		}
	}
	return errors.Join(problems...)
}

// stats fills in the run's figures.
func (s *scenarioRun) stats(e *Expect, loadTime time.Duration) {
	e.Stats = s.t.snapshot()
	e.Stats.Producers = s.cfg.Producers
	e.Stats.Records = s.acked.Load()
	e.Stats.Seconds = loadTime.Seconds()
	e.Stats.RecordsPerSecond = float64(e.Stats.Records) / loadTime.Seconds()
	e.Stats.Crashes = int(s.crashes.Load())
	e.Stats.Epochs = len(s.epochs)
	e.Stats.BadMessages = s.cfg.Faults.BadMessages
	sort.Strings(e.Customers)
}

// crash stops g abruptly and restarts it. With wipe, its state is lost
// after a flush (everything acknowledged reached the writer), so the
// restart is a new epoch; without, the restart continues the epoch and
// sends what was left on disk.
func crash(ctx context.Context, g *gen, wipe bool, open func(*gen) error) error {
	g.mu.Lock()
	defer g.mu.Unlock()
	if wipe {
		fctx, cancel := context.WithTimeout(ctx, time.Minute)
		err := g.p.Flush(fctx)
		cancel()
		if err != nil {
			return fmt.Errorf("scenario: flush %s before wiping its state: %w", g.id, err)
		}
	}
	now, cancel := context.WithCancel(ctx)
	cancel()
	_ = g.p.Stop(now) // abrupt: no flush, no final records
	if wipe {
		if err := os.RemoveAll(g.dir); err != nil {
			return err
		}
	}
	return open(g)
}

func (t *tracker) snapshot() Stats {
	t.mu.Lock()
	defer t.mu.Unlock()
	return t.stats
}
