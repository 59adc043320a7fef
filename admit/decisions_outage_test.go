package admit_test

import (
	"context"
	"encoding/json"
	"log/slog"
	"net"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/segmentio/kafka-go"

	"github.com/tally-ledger/tally/admit"
	"github.com/tally-ledger/tally/internal/kafkatest"
	"github.com/tally-ledger/tally/quota"
)

// logRecords keeps every record logged: its level, message and error.
type logRecords struct {
	mu   sync.Mutex
	recs []slog.Record
}

func (l *logRecords) Enabled(context.Context, slog.Level) bool { return true }
func (l *logRecords) Handle(_ context.Context, r slog.Record) error {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.recs = append(l.recs, r.Clone())
	return nil
}
func (l *logRecords) WithAttrs([]slog.Attr) slog.Handler { return l }
func (l *logRecords) WithGroup(string) slog.Handler      { return l }

// find returns the records logged with msg, and how many were logged at
// level error (whatever their message).
func (l *logRecords) find(msg string) (found []slog.Record, errors int) {
	l.mu.Lock()
	defer l.mu.Unlock()
	for _, r := range l.recs {
		if r.Message == msg {
			found = append(found, r)
		}
		if r.Level >= slog.LevelError {
			errors++
		}
	}
	return found, errors
}

func hasAttr(r slog.Record, key string) bool {
	has := false
	r.Attrs(func(a slog.Attr) bool {
		has = has || a.Key == key
		return !has
	})
	return has
}

const (
	logDecisionsDown = "admit: cannot read decisions from Kafka; lagged rules follow on_stale until it answers"
	logDecisionsUp   = "admit: decisions read from Kafka again"
)

// A Kafka outage is logged by the decisions reader once when it starts
// (a warning, with the error) and once when Kafka answers again, however
// many partitions it reads and however long the outage lasts: not an
// error per partition and retry.
func TestDecisionsOutageIsLoggedOnceEachWay(t *testing.T) {
	dir := t.TempDir()
	start := func(port int) *kafkatest.Cluster {
		k, err := kafkatest.Start(kafkatest.Options{Topics: []kafkatest.Topic{{Name: quota.DefaultTopic, Partitions: 3}},
			DataDir: dir, Port: port})
		if err != nil {
			t.Fatal(err)
		}
		return k
	}
	k := start(0)
	_, p, err := net.SplitHostPort(k.Addrs[0])
	if err != nil {
		t.Fatal(err)
	}
	port, _ := strconv.Atoi(p)
	var c *admit.Client
	seq := int64(0)
	publish := func() {
		seq++
		b, err := json.Marshal(quota.Decision{Customer: "acme", Meter: "tokens", State: quota.OK, Mode: quota.Enforce, LeaderEpoch: 1, Seq: seq})
		if err != nil {
			t.Fatal(err)
		}
		k.Produce(t, quota.DefaultTopic, kafka.Message{Key: []byte("acme/tokens"), Value: b})
	}
	// publishAndRead publishes decisions until one is read: a reader that
	// has not started yet begins at the partition's end, after a decision
	// published before it (the enforcer republishes every key).
	publishAndRead := func(what string) {
		t.Helper()
		for deadline := time.Now().Add(time.Minute); ; {
			publish()
			for until := time.Now().Add(time.Second); time.Now().Before(until); time.Sleep(20 * time.Millisecond) {
				if d, ok := c.Latest("acme", "tokens"); ok && d.Seq == seq {
					return
				}
			}
			if time.Now().After(deadline) {
				t.Fatalf("timed out waiting for %s", what)
			}
		}
	}

	logs := &logRecords{}
	c, err = admit.New(admit.Config{URL: "http://127.0.0.1:1", Token: "tly_x", Holder: "gw1", Dir: t.TempDir(),
		Brokers: k.Addrs, Logger: slog.New(logs)})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close(context.Background())
	publishAndRead("the first decision read")

	k.Close()
	time.Sleep(4 * time.Second) // several retries of every partition's reader
	k = start(port)
	defer k.Close()
	publishAndRead("a decision read after the outage")
	eventually(t, "the recovery logged", func() bool {
		up, _ := logs.find(logDecisionsUp)
		return len(up) > 0
	})

	down, errs := logs.find(logDecisionsDown)
	up, _ := logs.find(logDecisionsUp)
	if len(down) != 1 || down[0].Level != slog.LevelWarn || !hasAttr(down[0], "err") {
		t.Errorf("outage logged %d times (%v), want once, a warning with its error", len(down), down)
	}
	if len(up) != 1 || up[0].Level != slog.LevelInfo || !hasAttr(up[0], "down_for") {
		t.Errorf("recovery logged %d times (%v), want once, at info with how long it lasted", len(up), up)
	}
	if errs > 0 {
		t.Errorf("%d records logged at error during a Kafka outage, want none", errs)
	}
}
