package ingest

import (
	"errors"
	"fmt"
	"log/slog"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/segmentio/kafka-go"

	"github.com/tally-ledger/tally/ledger"
)

// Defaults of Config.
const (
	DefaultTopic             = "tally.meter-batches"
	DefaultGroup             = "tally-ingest"
	DefaultMaxBatchRecords   = 5000
	DefaultMaxBatchWait      = 200 * time.Millisecond
	DefaultRetryMin          = 100 * time.Millisecond
	DefaultRetryMax          = 5 * time.Second
	DefaultTxTimeout         = 30 * time.Second
	DefaultPositionInterval  = time.Second
	DefaultHeartbeatInterval = 500 * time.Millisecond
	DefaultSessionTimeout    = 2 * time.Second
	DefaultFetchMaxWait      = 500 * time.Millisecond
	DefaultQueueCapacity     = 32
	DefaultKafkaCommitEvery  = time.Second
)

// Config configures a Consumer. Zero values take the documented defaults.
type Config struct {
	// Brokers are the Kafka bootstrap addresses (host:port). Required.
	Brokers []string
	// Topic is the meter-batch topic. Default "tally.meter-batches".
	Topic string
	// Group names the members that share the topic's partitions (through
	// leases in Postgres; also the Kafka group the stored offsets are
	// committed to for lag dashboards). Default "tally-ingest".
	Group string

	// Pool is the ledger's database. Required.
	Pool *pgxpool.Pool
	// Ledger applies records. Required.
	Ledger *ledger.Ledger
	// Logger receives structured logs. Default: discard.
	Logger *slog.Logger
	// Registry receives the consumer's Prometheus metrics. Default: a
	// private registry nobody scrapes. Never the global one.
	Registry prometheus.Registerer
	// Clock is used for applied-through times, dead-letter timestamps and
	// the times in the stall's log lines (a partition's retrying_since is
	// Postgres's clock, which its state is judged by). Default time.Now.
	Clock func() time.Time

	// MaxBatchRecords bounds a micro-batch by records (a message is never
	// split, so a batch may exceed it by one message). Default 5000.
	MaxBatchRecords int
	// MaxBatchWait bounds how long a micro-batch waits for more messages
	// after its first one. Default 200ms.
	MaxBatchWait time.Duration
	// RetryMin and RetryMax bound the exponential backoff between attempts
	// of a micro-batch whose transaction failed. Defaults 100ms and 5s.
	RetryMin, RetryMax time.Duration
	// TxTimeout bounds one attempt of a micro-batch transaction. Default 30s.
	TxTimeout time.Duration
	// StallAfter is how long a partition retries a failing micro-batch
	// before this member reports it stalled (the
	// tally_ingest_partition_stalled gauge and an ERROR line). Default
	// StallAfter (1m), which is also what /v1/ingest/status and /readyz use.
	StallAfter time.Duration
	// PositionInterval is how often an idle partition checks that it is
	// caught up and advances its applied-through time. Default 1s.
	PositionInterval time.Duration

	// HeartbeatInterval and SessionTimeout are the membership timings, in
	// Postgres (the Kafka group coordinator plays no part); together they
	// bound how long a crashed member's partitions wait for another member.
	//
	// SessionTimeout: how long a member's lease lasts without renewal. A
	// member whose process died is not live from the moment its Postgres
	// session ends (the kernel closes its connections); one stopped or cut
	// off without its connection closing is live until its lease runs out.
	// Either way the others claim its partitions at their next balancing
	// round (every HeartbeatInterval/2, and just after a lease runs out),
	// then the new owner starts; a clean shutdown releases at once. A member whose
	// process stalls as a whole (stopped, starved) for this long is evicted
	// and commits nothing more (every write checks the lease), then joins
	// again as a new member. It is also how long a micro-batch transaction
	// may sit idle (a stalled member's transaction is ended so that it does
	// not keep the partition's row locked from the next owner). Default 2s.
	//
	// HeartbeatInterval: how often a member renews its lease; it balances
	// (claims free partitions up to its fair share, releases its surplus)
	// twice as often. Default 500ms.
	HeartbeatInterval, SessionTimeout time.Duration
	// FetchMaxWait is how long one Kafka fetch may wait for data; it also
	// bounds how long closing a partition reader takes, and how long the
	// broker may take to begin its answer (kafka-go's read deadline): a
	// broker slower than that to answer a large fetch fails it every time
	// and the partition makes no progress, so keep it well above the
	// broker's worst answer time. Default 500ms.
	FetchMaxWait time.Duration
	// QueueCapacity is how many fetched messages a partition reader buffers
	// (memory: at most this many messages of up to 1 MiB each). Default 32.
	QueueCapacity int
	// KafkaCommitEvery is how often the stored offsets are also committed to
	// Kafka for lag dashboards; negative disables it. Default 1s.
	KafkaCommitEvery time.Duration
	// Dialer connects to Kafka (TLS, SASL). Default kafka.DefaultDialer.
	Dialer *kafka.Dialer
}

// withDefaults returns c with zero fields set to their defaults.
func (c Config) withDefaults() Config {
	def := func(d *time.Duration, v time.Duration) {
		if *d == 0 {
			*d = v
		}
	}
	if c.Topic == "" {
		c.Topic = DefaultTopic
	}
	if c.Group == "" {
		c.Group = DefaultGroup
	}
	if c.Logger == nil {
		c.Logger = slog.New(slog.DiscardHandler)
	}
	if c.Registry == nil {
		c.Registry = prometheus.NewRegistry()
	}
	if c.Clock == nil {
		c.Clock = time.Now
	}
	if c.MaxBatchRecords == 0 {
		c.MaxBatchRecords = DefaultMaxBatchRecords
	}
	if c.QueueCapacity == 0 {
		c.QueueCapacity = DefaultQueueCapacity
	}
	def(&c.MaxBatchWait, DefaultMaxBatchWait)
	def(&c.RetryMin, DefaultRetryMin)
	def(&c.RetryMax, DefaultRetryMax)
	def(&c.TxTimeout, DefaultTxTimeout)
	def(&c.StallAfter, StallAfter)
	def(&c.PositionInterval, DefaultPositionInterval)
	def(&c.HeartbeatInterval, DefaultHeartbeatInterval)
	def(&c.SessionTimeout, DefaultSessionTimeout)
	def(&c.FetchMaxWait, DefaultFetchMaxWait)
	def(&c.KafkaCommitEvery, DefaultKafkaCommitEvery)
	if c.Dialer == nil {
		c.Dialer = kafka.DefaultDialer
	}
	return c
}

// Validate reports every configuration problem at once.
func (c Config) Validate() error {
	var errs []error
	if len(c.Brokers) == 0 {
		errs = append(errs, errors.New("ingest: Brokers is empty; set at least one Kafka address"))
	}
	for i, b := range c.Brokers {
		if b == "" {
			errs = append(errs, fmt.Errorf("ingest: Brokers[%d] is empty", i))
		}
	}
	if c.Pool == nil {
		errs = append(errs, errors.New("ingest: Pool is nil"))
	}
	if c.Ledger == nil {
		errs = append(errs, errors.New("ingest: Ledger is nil"))
	}
	if c.MaxBatchRecords < 0 {
		errs = append(errs, fmt.Errorf("ingest: MaxBatchRecords %d is negative", c.MaxBatchRecords))
	}
	if c.QueueCapacity < 0 {
		errs = append(errs, fmt.Errorf("ingest: QueueCapacity %d is negative", c.QueueCapacity))
	}
	for _, d := range []struct {
		name string
		v    time.Duration
	}{
		{"MaxBatchWait", c.MaxBatchWait}, {"RetryMin", c.RetryMin}, {"RetryMax", c.RetryMax},
		{"TxTimeout", c.TxTimeout}, {"StallAfter", c.StallAfter}, {"PositionInterval", c.PositionInterval},
		{"HeartbeatInterval", c.HeartbeatInterval}, {"SessionTimeout", c.SessionTimeout},
		{"FetchMaxWait", c.FetchMaxWait},
	} {
		if d.v < 0 {
			errs = append(errs, fmt.Errorf("ingest: %s %v is negative", d.name, d.v))
		}
	}
	if c.RetryMin > 0 && c.RetryMax > 0 && c.RetryMax < c.RetryMin {
		errs = append(errs, fmt.Errorf("ingest: RetryMax %v is below RetryMin %v", c.RetryMax, c.RetryMin))
	}
	hb, st := c.HeartbeatInterval, c.SessionTimeout
	if hb == 0 {
		hb = DefaultHeartbeatInterval
	}
	if st == 0 {
		st = DefaultSessionTimeout
	}
	if c.HeartbeatInterval >= 0 && c.SessionTimeout >= 0 && hb*2 > st {
		// A half still survives one lost renewal without an eviction.
		errs = append(errs, fmt.Errorf("ingest: HeartbeatInterval %v must be at most half of SessionTimeout %v", hb, st))
	}
	return errors.Join(errs...)
}
