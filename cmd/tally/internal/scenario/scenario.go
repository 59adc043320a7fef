package scenario

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
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
	}{{"producers", c.Producers}, {"customers", c.Customers}, {"meters", c.Meters}, {"workers", c.Workers}, {"crashes", c.Faults.Crashes}, {"bad messages", c.Faults.BadMessages}} {
		if n.v < 0 {
			errs = append(errs, fmt.Errorf("scenario: %s %d is negative", n.name, n.v))
		}
	}
	for _, p := range []struct {
		name string
		v    float64
	}{{"duplicates", c.Faults.Duplicates}, {"retransmits", c.Faults.Retransmits}, {"lost", c.Faults.Lost}, {"reorder", c.Faults.Reorder}} {
		if p.v < 0 || p.v > 0.5 {
			errs = append(errs, fmt.Errorf("scenario: %s probability %v is outside 0..0.5", p.name, p.v))
		}
	}
	if c.Faults.Lost+c.Faults.Reorder > 0.5 {
		errs = append(errs, errors.New("scenario: lost + reorder probabilities exceed 0.5"))
	}
	if c.Rate < 0 || c.Duration < 0 || c.Records < 0 || c.Spread < 0 {
		errs = append(errs, errors.New("scenario: rate, duration, records and spread must not be negative"))
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

	customers := make([]string, cfg.Customers)
	for i := range customers {
		customers[i] = fmt.Sprintf("%s-c%d", cfg.Run, i+1)
	}
	meters := make([]string, cfg.Meters)
	for i := range meters {
		meters[i] = fmt.Sprintf("m%d", i+1)
	}
	open := func(g *gen) error {
		p, err := producer.New(producer.Config{Producer: g.id, Dir: g.dir, Writer: t, Linger: cfg.Linger,
			RetryMin: 20 * time.Millisecond, RetryMax: 500 * time.Millisecond, Logger: cfg.Logger})
		g.p = p
		return err
	}
	gens := make([]*gen, cfg.Producers)
	epochs := map[[2]any]bool{}
	for i := range gens {
		g := &gen{id: fmt.Sprintf("%s-p%d", cfg.Run, i+1)}
		g.dir = filepath.Join(cfg.Dir, g.id)
		if err := open(g); err != nil {
			return nil, err
		}
		epochs[[2]any{g.id, g.p.Epoch()}] = true
		gens[i] = g
	}
	var epochsMu sync.Mutex

	runCtx, cancel := context.WithCancel(ctx)
	defer cancel()
	if cfg.Duration > 0 {
		runCtx, cancel = context.WithTimeout(runCtx, cfg.Duration)
		defer cancel()
	}
	start := time.Now()
	var issued, acked atomic.Int64
	var ackedMu sync.Mutex
	ackedSum := map[[2]string]decimal.Decimal{}
	var firstErr error
	var errOnce sync.Once
	var firstErrSet atomic.Bool
	fail := func(err error) {
		errOnce.Do(func() { firstErr = err; firstErrSet.Store(true); cancel() })
	}

	var wg sync.WaitGroup
	for gi, g := range gens {
		for w := range cfg.Workers {
			rng := rand.New(rand.NewPCG(cfg.Seed, uint64(gi*1000+w+1)))
			wg.Go(func() {
				local := map[[2]string]decimal.Decimal{}
				defer func() {
					ackedMu.Lock()
					for k, q := range local {
						ackedSum[k] = ackedSum[k].Add(q)
					}
					ackedMu.Unlock()
				}()
				for runCtx.Err() == nil {
					n := issued.Add(1)
					if cfg.Records > 0 && n > cfg.Records {
						return
					}
					if cfg.Rate > 0 {
						due := start.Add(time.Duration(float64(n-1) / cfg.Rate * float64(time.Second)))
						if d := time.Until(due); d > 0 {
							select {
							case <-time.After(d):
							case <-runCtx.Done():
								return
							}
						}
					}
					c, m := customers[rng.IntN(len(customers))], meters[rng.IntN(len(meters))]
					q := decimal.New(rng.Int64N(10_000_000), -int32(rng.IntN(4)))
					at := time.Now().UTC()
					if cfg.Spread > 0 {
						at = at.Add(-time.Duration(rng.Int64N(int64(cfg.Spread))))
					}
					g.mu.RLock()
					err := g.p.Record(context.WithoutCancel(runCtx), c, m, q, at)
					g.mu.RUnlock()
					if err != nil {
						fail(fmt.Errorf("scenario: producer %s: %w", g.id, err))
						return
					}
					local[[2]string{c, m}] = local[[2]string{c, m}].Add(q)
					acked.Add(1)
				}
			})
		}
	}

	// Crashes, evenly spread over the run (those still due when it ends
	// happen then); alternately the state survives or is wiped (a new
	// epoch).
	var crashes atomic.Int64
	crashDone := make(chan struct{})
	go func() {
		defer close(crashDone)
		for i := range cfg.Faults.Crashes {
			frac := float64(i+1) / float64(cfg.Faults.Crashes+1)
			for runCtx.Err() == nil {
				var reached bool
				if cfg.Duration > 0 {
					reached = time.Since(start) >= time.Duration(frac*float64(cfg.Duration))
				} else {
					reached = float64(acked.Load()) >= frac*float64(cfg.Records)
				}
				if reached {
					break
				}
				time.Sleep(5 * time.Millisecond)
			}
			if ctx.Err() != nil || firstErrSet.Load() {
				return
			}
			g := gens[i%len(gens)]
			if err := crash(ctx, g, i%2 == 1, open); err != nil {
				fail(err)
				return
			}
			crashes.Add(1)
			epochsMu.Lock()
			epochs[[2]any{g.id, g.p.Epoch()}] = true
			epochsMu.Unlock()
			cfg.Logger.Info("producer crashed and restarted", "producer", g.id, "state_wiped", i%2 == 1, "epoch", g.p.Epoch())
		}
	}()

	progressDone := make(chan struct{})
	stopProgress := make(chan struct{})
	go func() {
		defer close(progressDone)
		if cfg.Progress == nil {
			return
		}
		tick := time.NewTicker(500 * time.Millisecond)
		defer tick.Stop()
		for {
			select {
			case <-tick.C:
				s := t.snapshot()
				s.Records = acked.Load()
				s.Seconds = time.Since(start).Seconds()
				s.RecordsPerSecond = float64(s.Records) / s.Seconds
				s.Crashes = int(crashes.Load())
				cfg.Progress(s)
			case <-stopProgress:
				return
			}
		}
	}()

	wg.Wait()
	loadTime := time.Since(start)
	cancel()
	<-crashDone
	close(stopProgress)
	<-progressDone

	closeCtx, closeCancel := context.WithTimeout(context.WithoutCancel(ctx), 2*time.Minute)
	defer closeCancel()
	var closeErrs []error
	for _, g := range gens {
		if err := g.p.Close(closeCtx); err != nil {
			closeErrs = append(closeErrs, fmt.Errorf("scenario: close %s: %w", g.id, err))
		}
	}
	if firstErr != nil {
		return nil, firstErr
	}
	if err := errors.Join(closeErrs...); err != nil {
		return nil, err
	}
	if err := t.drain(closeCtx); err != nil {
		return nil, err
	}
	e := &Expect{Run: cfg.Run, Topic: cfg.Topic, GeneratedAt: time.Now().UTC(), Customers: customers,
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

	// Cross-check: the ledger's truth (from what reached Kafka) against the
	// usage the producers acknowledged.
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
	for _, c := range customers {
		for _, m := range meters {
			k := [2]string{c, m}
			if q := ackedSum[k]; !q.IsZero() || !fromKafka[k].IsZero() {
				e.Acknowledged = append(e.Acknowledged, Total{Customer: c, Meter: m, Quantity: q})
			}
			if !ackedSum[k].Equal(fromKafka[k]) {
				problems = append(problems, fmt.Errorf("scenario: %s/%s: producers acknowledged %s but sent records totalling %s", c, m, ackedSum[k], fromKafka[k]))
			}
		}
	}
	if err := errors.Join(problems...); err != nil {
		return e, err
	}

	e.Stats = t.snapshot()
	e.Stats.Producers = cfg.Producers
	e.Stats.Records = acked.Load()
	e.Stats.Seconds = loadTime.Seconds()
	e.Stats.RecordsPerSecond = float64(e.Stats.Records) / loadTime.Seconds()
	e.Stats.Crashes = int(crashes.Load())
	e.Stats.Epochs = len(epochs)
	e.Stats.BadMessages = cfg.Faults.BadMessages
	sort.Strings(e.Customers)
	return e, nil
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
