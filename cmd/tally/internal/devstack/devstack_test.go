package devstack_test

import (
	"context"
	"net"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/segmentio/kafka-go"
	"go.uber.org/goleak"

	"github.com/tally-ledger/tally/cmd/tally/internal/devstack"
	"github.com/tally-ledger/tally/internal/kafkatest"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// The dev broker keeps its messages and topics across a restart on the same
// data directory.
func TestKafkaPersistsAcrossRestart(t *testing.T) {
	dir := t.TempDir()
	start := func() *devstack.Kafka {
		k, err := devstack.StartKafka(devstack.KafkaConfig{Addr: "127.0.0.1:0", Dir: dir, Topics: devstack.DefaultTopics, Partitions: 4})
		if err != nil {
			t.Fatal(err)
		}
		return k
	}
	k := start()
	w := kafkatest.NewWriter([]string{k.Addr}, "tally.meter-batches")
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	if err := w.WriteMessages(ctx, kafka.Message{Key: []byte("acme"), Value: []byte("one")}, kafka.Message{Key: []byte("acme"), Value: []byte("two")}); err != nil {
		t.Fatal(err)
	}
	w.Close()
	k.Close()

	k = start()
	defer k.Close()
	conn, err := kafka.DialContext(ctx, "tcp", k.Addr)
	if err != nil {
		t.Fatal(err)
	}
	parts, err := conn.ReadPartitions()
	conn.Close()
	if err != nil {
		t.Fatal(err)
	}
	n := map[string]int{}
	for _, p := range parts {
		n[p.Topic]++
	}
	for _, topic := range devstack.DefaultTopics {
		if n[topic] != 4 {
			t.Errorf("topic %s has %d partitions after restart, want 4", topic, n[topic])
		}
	}
	var total int64
	for p := range 4 {
		c, err := kafka.DialLeader(ctx, "tcp", k.Addr, "tally.meter-batches", p)
		if err != nil {
			t.Fatal(err)
		}
		_, last, err := c.ReadOffsets()
		c.Close()
		if err != nil {
			t.Fatal(err)
		}
		total += last
	}
	if total != 2 {
		t.Errorf("%d messages after restart, want 2", total)
	}
}

// With no server reachable, dev starts a private cluster from the installed
// initdb/pg_ctl (as a non-root user when run as root) and stops it on Close.
func TestPrivatePostgres(t *testing.T) {
	base := t.TempDir()
	// t.TempDir is 0700; the private server may run as another user.
	for d := base; d != "/" && d != os.TempDir(); d = filepath.Dir(d) {
		if err := os.Chmod(d, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	ctx := context.Background()
	pg, err := devstack.StartPrivate(ctx, devstack.PostgresConfig{Dir: base, PrivatePort: 54391})
	if err != nil {
		t.Fatal(err)
	}
	c, err := pgx.Connect(ctx, pg.URL)
	if err != nil {
		_ = pg.Close()
		t.Fatal(err)
	}
	var db, who string
	err = c.QueryRow(ctx, "SELECT current_database(), (SELECT usename FROM pg_stat_activity WHERE pid = pg_backend_pid())").Scan(&db, &who)
	c.Close(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if db != "tally" {
		t.Errorf("database %q, want tally", db)
	}
	if err := pg.Close(); err != nil {
		t.Fatal(err)
	}
	if _, err := pgx.Connect(ctx, pg.URL); err == nil {
		t.Error("private Postgres still accepts connections after Close")
	}
}

// tally dev killed (SIGKILL, OOM) leaves its private Postgres running: the
// next start reuses it instead of failing in pg_ctl start.
func TestPrivatePostgresIsReusedAfterAKill(t *testing.T) {
	base := t.TempDir()
	for d := base; d != "/" && d != os.TempDir(); d = filepath.Dir(d) {
		if err := os.Chmod(d, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	ctx := context.Background()
	cfg := devstack.PostgresConfig{Dir: base, PrivatePort: 54392}
	first, err := devstack.StartPrivate(ctx, cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = first.Close() }) // a no-op once the second one stopped it
	// The first owner dies without Close; a second one starts.
	second, err := devstack.StartPrivate(ctx, cfg)
	if err != nil {
		t.Fatalf("start again with the cluster still running: %v", err)
	}
	c, err := pgx.Connect(ctx, second.URL)
	if err != nil {
		_ = second.Close()
		t.Fatal(err)
	}
	c.Close(ctx)
	if err := second.Close(); err != nil {
		t.Fatal(err)
	}
}

// The private cluster trusts whoever connects, so only its user may
// connect: it listens on no TCP port, only on a Unix socket in a directory
// only that user (and root) can enter.
func TestPrivatePostgresIsOnlyForItsUser(t *testing.T) {
	base := t.TempDir()
	for d := base; d != "/" && d != os.TempDir(); d = filepath.Dir(d) {
		if err := os.Chmod(d, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	ctx := context.Background()
	pg, err := devstack.StartPrivate(ctx, devstack.PostgresConfig{Dir: base, PrivatePort: 54393})
	if err != nil {
		t.Fatal(err)
	}
	defer pg.Close()
	if c, err := net.DialTimeout("tcp", "127.0.0.1:54393", time.Second); err == nil {
		c.Close()
		t.Error("the private Postgres accepts TCP connections on 127.0.0.1:54393")
	}
	fi, err := os.Stat(filepath.Join(base, "pg", "run"))
	if err != nil {
		t.Fatal(err)
	}
	if fi.Mode().Perm()&0o077 != 0 {
		t.Errorf("socket directory mode %v: other users can reach the socket", fi.Mode().Perm())
	}
	c, err := pgx.Connect(ctx, pg.URL)
	if err != nil {
		t.Fatalf("connect through the socket: %v", err)
	}
	c.Close(ctx)
}

// An address in use is said as such, with what to do: not "delete the
// data to start empty", which would not help.
func TestKafkaAddressInUseSaysSo(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	_, err = devstack.StartKafka(devstack.KafkaConfig{Addr: ln.Addr().String(), Dir: t.TempDir(), Topics: devstack.DefaultTopics, Partitions: 1})
	if err == nil || !strings.Contains(err.Error(), "is in use") || !strings.Contains(err.Error(), "--kafka-addr") || strings.Contains(err.Error(), "delete") {
		t.Fatalf("address in use: %v", err)
	}
}
