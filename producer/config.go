package producer

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"time"
	"unicode/utf8"

	"github.com/google/uuid"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/segmentio/kafka-go"

	"github.com/tally-ledger/tally/ingest/wire"
)

// Defaults of Config.
const (
	DefaultTopic             = "tally.meter-batches"
	DefaultMaxBatchRecords   = 1000
	DefaultMaxBatchBytes     = 512 << 10
	DefaultMaxPartitionBytes = 1_000_000
	DefaultLinger            = 200 * time.Millisecond
	DefaultMaxBuffered       = 1_000_000
	DefaultStreamCache       = 100_000
	DefaultRetryMin          = 100 * time.Millisecond
	DefaultRetryMax          = 10 * time.Second
	DefaultWriteTimeout      = 30 * time.Second
	DefaultKeyRetention      = 7 * 24 * time.Hour
)

// MessageWriter writes messages to Kafka. *kafka.Writer satisfies it. It
// must return nil only once every message was acknowledged by the cluster;
// an error means some or all of them may not have been (they are retried).
// A kafka.WriteErrors result tells which ones failed.
type MessageWriter interface {
	WriteMessages(ctx context.Context, msgs ...kafka.Message) error
}

// Config configures a Producer. Zero values take the documented defaults.
type Config struct {
	// Brokers are the Kafka bootstrap addresses (host:port). Required
	// unless Writer is set.
	Brokers []string
	// Topic is the meter-batch topic. Default "tally.meter-batches".
	Topic string
	// Producer is this producer's stable identity (host or service
	// instance), 1–128 characters. Required. It must stay the same across
	// restarts on the same Dir.
	Producer string
	// Dir holds the producer's state: epoch, stream counters and unsent
	// records. Required. One Producer per Dir at a time (it is locked).
	// Never copy it to a second producer, nor restore it from a backup or
	// snapshot: a copy gives seqs that another process or the ledger
	// already used, and that usage goes unbilled (docs/producers.md).
	Dir string

	// MaxBatchRecords bounds the records of one message. Default 1000,
	// at most 10000.
	MaxBatchRecords int
	// MaxBatchBytes bounds the size of one message. Default 512 KiB; must
	// be below 1 MiB (the wire limit).
	MaxBatchBytes int
	// MaxPartitionBytes bounds the bytes of the record batch one produce
	// request carries for one partition: a broker refuses a larger one
	// ("[10] Message Size Too Large"). Default 1,000,000, below Kafka's
	// default message.max.bytes (1 MiB + 12 bytes); set it below the
	// topic's max.message.bytes when that is lower. It must be at least
	// MaxBatchBytes + 1024. (A refusal is survived anyway: the producer
	// then sends less at once and splits a batch refused on its own, but
	// each refusal costs a round trip.)
	MaxPartitionBytes int
	// Linger is how long a record may wait for more records to share its
	// message. Default 200ms.
	Linger time.Duration
	// MaxBuffered bounds the records on disk waiting for Kafka. When it is
	// reached Record blocks (BlockWhenFull) or returns ErrBufferFull.
	// Default 1,000,000.
	MaxBuffered int
	// StreamCache bounds the stream states (seq and running total per
	// customer and meter) kept in memory; the others are read back from
	// Dir when their stream records again. Default 100,000.
	StreamCache int
	// BlockWhenFull makes Record wait for room instead of failing with
	// ErrBufferFull.
	BlockWhenFull bool
	// KeyRetention is how long an idempotency key (Record's Key option) is
	// remembered after its record was stored: a key repeated later than
	// that records again. Default 7 days. Each key costs about 200 bytes of
	// Dir for that long.
	KeyRetention time.Duration

	// RetryMin and RetryMax bound the exponential backoff between attempts
	// to send a batch. Defaults 100ms and 10s.
	RetryMin, RetryMax time.Duration
	// WriteTimeout bounds one attempt to send. Default 30s.
	WriteTimeout time.Duration

	// Logger receives structured logs. Default: discard.
	Logger *slog.Logger
	// Registerer receives the producer's metrics (labelled with the
	// producer id). Default: a private registry nobody scrapes.
	Registerer prometheus.Registerer
	// Writer, when set, replaces the kafka-go Writer built from Brokers and
	// Topic (for TLS/SASL, or to observe what is sent). Messages carry only
	// Key and Value; the Writer picks the topic and must wait for acks=all.
	Writer MessageWriter
}

func (c Config) withDefaults() Config {
	if c.Topic == "" {
		c.Topic = DefaultTopic
	}
	if c.MaxBatchRecords == 0 {
		c.MaxBatchRecords = DefaultMaxBatchRecords
	}
	if c.MaxBatchBytes == 0 {
		c.MaxBatchBytes = DefaultMaxBatchBytes
	}
	if c.MaxPartitionBytes == 0 {
		c.MaxPartitionBytes = DefaultMaxPartitionBytes
	}
	if c.Linger == 0 {
		c.Linger = DefaultLinger
	}
	if c.MaxBuffered == 0 {
		c.MaxBuffered = DefaultMaxBuffered
	}
	if c.StreamCache == 0 {
		c.StreamCache = DefaultStreamCache
	}
	if c.RetryMin == 0 {
		c.RetryMin = DefaultRetryMin
	}
	if c.RetryMax == 0 {
		c.RetryMax = DefaultRetryMax
	}
	if c.WriteTimeout == 0 {
		c.WriteTimeout = DefaultWriteTimeout
	}
	if c.KeyRetention == 0 {
		c.KeyRetention = DefaultKeyRetention
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
	add := func(format string, a ...any) { errs = append(errs, fmt.Errorf("producer: "+format, a...)) }
	if c.Writer == nil {
		if len(c.Brokers) == 0 {
			add("Brokers is empty; set at least one Kafka address (or a Writer)")
		}
		for i, b := range c.Brokers {
			if b == "" {
				add("Brokers[%d] is empty", i)
			}
		}
	}
	switch n := utf8.RuneCountInString(c.Producer); {
	case c.Producer == "":
		add("Producer is empty; set a stable id of 1 to %d characters", wire.MaxIDLen)
	case n > wire.MaxIDLen:
		add("Producer %q is %d characters long; at most %d", c.Producer, n, wire.MaxIDLen)
	default:
		// The wire format's own rules (valid UTF-8, no control characters).
		now := time.Now()
		id := uuid.MustParse("00000000-0000-7000-8000-000000000001")
		if _, err := wire.Encode(wire.Batch{Schema: wire.Schema, BatchID: id, Producer: c.Producer, Epoch: 1, SentAt: now,
			Records: []wire.Record{{OperationID: id, Customer: "c", Meter: "m", Seq: 1, OccurredAt: now}}}); err != nil {
			add("Producer: %v", err)
		}
	}
	if c.Dir == "" {
		add("Dir is empty; set a directory for the producer's durable state")
	}
	if c.MaxBatchRecords < 0 || c.MaxBatchRecords > wire.MaxRecords {
		add("MaxBatchRecords %d is outside 0..%d", c.MaxBatchRecords, wire.MaxRecords)
	}
	if c.MaxBatchBytes < 0 || c.MaxBatchBytes >= wire.MaxMessageBytes {
		add("MaxBatchBytes %d must be below %d (1 MiB)", c.MaxBatchBytes, wire.MaxMessageBytes)
	} else if c.MaxBatchBytes > 0 && c.MaxBatchBytes < 4096 {
		add("MaxBatchBytes %d is below 4096; one record with long ids may not fit", c.MaxBatchBytes)
	}
	if mb, mp := cmp.Or(c.MaxBatchBytes, DefaultMaxBatchBytes), cmp.Or(c.MaxPartitionBytes, DefaultMaxPartitionBytes); mp < mb+1024 {
		add("MaxPartitionBytes %d is below MaxBatchBytes %d + 1024 (one message, its key and the record batch overhead)", mp, mb)
	}
	if c.MaxBuffered < 0 {
		add("MaxBuffered %d is negative", c.MaxBuffered)
	}
	if c.StreamCache < 0 {
		add("StreamCache %d is negative", c.StreamCache)
	}
	for _, d := range []struct {
		name string
		v    time.Duration
	}{{"Linger", c.Linger}, {"RetryMin", c.RetryMin}, {"RetryMax", c.RetryMax}, {"WriteTimeout", c.WriteTimeout}, {"KeyRetention", c.KeyRetention}} {
		if d.v < 0 {
			add("%s %v is negative", d.name, d.v)
		}
	}
	if c.RetryMin > 0 && c.RetryMax > 0 && c.RetryMax < c.RetryMin {
		add("RetryMax %v is below RetryMin %v", c.RetryMax, c.RetryMin)
	}
	return errors.Join(errs...)
}
