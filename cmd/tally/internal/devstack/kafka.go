// Package devstack starts what `tally dev` needs on one machine: an
// in-process Kafka-protocol broker (franz-go's kfake) persisted under
// ./.tally-dev/kafka, and a Postgres database (the configured one, the local
// server, or a private cluster started from the installed initdb/pg_ctl).
//
// Its fixed defaults (docs/design.md §8) let scripts rely on them: Kafka at
// 127.0.0.1:9092 with topics of 4 partitions, the database `tally`.
package devstack

import (
	"errors"
	"fmt"
	"log/slog"
	"net"
	"os"
	"path/filepath"
	"strconv"
	"syscall"

	"github.com/twmb/franz-go/pkg/kfake"
)

// Defaults of `tally dev`.
const (
	DefaultDir        = ".tally-dev"
	DefaultKafkaAddr  = "127.0.0.1:9092"
	DefaultPartitions = 4
)

// DefaultTopics are created on the dev broker.
var DefaultTopics = []string{"tally.meter-batches", "tally.quota-decisions", "tally.alerts"}

// Kafka is the dev broker.
type Kafka struct {
	cluster *kfake.Cluster
	Addr    string
	Dir     string
}

// KafkaConfig configures StartKafka.
type KafkaConfig struct {
	// Addr is host:port to listen on; the host must be 127.0.0.1 (kfake
	// listens on loopback only). Default 127.0.0.1:9092.
	Addr string
	// Dir is the data directory; its log survives restarts. Empty: in memory.
	Dir string
	// Topics to create (if missing) with Partitions partitions each.
	Topics     []string
	Partitions int32
	Logger     *slog.Logger
}

// KafkaPort returns the port of addr, an address the embedded broker can
// listen on (127.0.0.1 or localhost, and a port; 0 picks one), or says
// what is wrong with it: tally dev checks it before it starts anything.
func KafkaPort(addr string) (int, error) {
	host, portStr, err := net.SplitHostPort(addr)
	if err != nil {
		return 0, fmt.Errorf("kafka address %q: %w", addr, err)
	}
	if host != "127.0.0.1" && host != "localhost" {
		return 0, fmt.Errorf("kafka address %q: the embedded broker listens on 127.0.0.1 only", addr)
	}
	port, err := strconv.Atoi(portStr)
	if err != nil {
		return 0, fmt.Errorf("kafka address %q: bad port", addr)
	}
	return port, nil
}

// StartKafka starts the broker, reloading its data directory, and creates
// missing topics.
func StartKafka(cfg KafkaConfig) (*Kafka, error) {
	if cfg.Addr == "" {
		cfg.Addr = DefaultKafkaAddr
	}
	if cfg.Partitions == 0 {
		cfg.Partitions = DefaultPartitions
	}
	port, err := KafkaPort(cfg.Addr)
	if err != nil {
		return nil, err
	}
	opts := []kfake.Opt{
		kfake.NumBrokers(1),
		kfake.Ports(port),
		kfake.DefaultNumPartitions(int(cfg.Partitions)),
		// Above the wire format's 1 MiB message limit (docs/design.md §2), so an oversized message reaches
		// the dead-letter table instead of being refused by the broker.
		kfake.BrokerConfigs(map[string]string{"message.max.bytes": "4194304"}),
	}
	if cfg.Dir != "" {
		if err := os.MkdirAll(cfg.Dir, 0o755); err != nil {
			return nil, err
		}
		// SyncWrites: a killed `tally dev` must not lose messages whose
		// offsets Postgres already stored.
		opts = append(opts, kfake.DataDir(cfg.Dir), kfake.SyncWrites())
	}
	c, err := kfake.NewCluster(opts...)
	if errors.Is(err, syscall.EADDRINUSE) {
		return nil, fmt.Errorf("start embedded kafka: %s is in use (another tally dev, or a Kafka): stop it, pick another address with --kafka-addr (port 0 picks one), or use that Kafka with TALLY_KAFKA_BROKERS: %w", cfg.Addr, err)
	}
	if err != nil {
		if cfg.Dir != "" {
			return nil, fmt.Errorf("start embedded kafka on %s (data %s; delete it to start empty): %w", cfg.Addr, cfg.Dir, err)
		}
		return nil, fmt.Errorf("start embedded kafka on %s: %w", cfg.Addr, err)
	}
	// Seeded topics are ignored when state is reloaded from disk, so create
	// what is missing either way.
	for _, t := range cfg.Topics {
		if c.TopicInfo(t) != nil {
			continue
		}
		if err := c.CreateTopic(t, cfg.Partitions, nil); err != nil {
			c.Close()
			return nil, fmt.Errorf("create topic %s: %w", t, err)
		}
	}
	dir, _ := filepath.Abs(cfg.Dir)
	return &Kafka{cluster: c, Addr: c.ListenAddrs()[0], Dir: dir}, nil
}

// Close stops the broker, saving its state to the data directory.
func (k *Kafka) Close() { k.cluster.Close() }
