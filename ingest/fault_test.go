package ingest_test

import (
	"bufio"
	"bytes"
	"context"
	"fmt"
	"io"
	"log/slog"
	"math/rand/v2"
	"net"
	"os"
	"os/exec"
	"os/signal"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/segmentio/kafka-go"

	"github.com/tally-ledger/tally/ingest"
	"github.com/tally-ledger/tally/ingest/wire"
	"github.com/tally-ledger/tally/internal/kafkatest"
	"github.com/tally-ledger/tally/internal/testrun"
)

// producer sends batches of the given streams in the background until
// stopped, and can be asked to resend old messages (producer retries).
type producer struct {
	t       *testing.T
	w       *kafkatest.Writer
	streams []*streamModel
	rng     *rand.Rand
	sent    []sentMsg
	stop    chan struct{}
	done    chan struct{}
	limit   int
	records atomic.Int64 // records sent, retransmits included
}

func startProducer(t *testing.T, brokers []string, streams []*streamModel, seed uint64, limit int, every time.Duration) *producer {
	p := &producer{t: t, w: kafkatest.NewWriter(brokers, topic), streams: streams,
		rng: rand.New(rand.NewPCG(seed, seed)), stop: make(chan struct{}), done: make(chan struct{}), limit: limit}
	go func() {
		defer close(p.done)
		defer p.w.Close()
		for i := 0; i < limit; i++ {
			select {
			case <-p.stop:
				return
			case <-time.After(every):
			}
			s := p.streams[p.rng.IntN(len(p.streams))]
			n := 1 + p.rng.IntN(30)
			msg := encodeNoT(s.next(p.rng, n))
			batch := []kafka.Message{msg}
			records := n
			if len(p.sent) > 0 && p.rng.IntN(4) == 0 { // a retransmit of an old batch
				old := p.sent[p.rng.IntN(len(p.sent))]
				batch = append(batch, old.msg)
				records += old.records
			}
			p.sent = append(p.sent, sentMsg{msg, n})
			ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
			err := p.w.WriteMessages(ctx, batch...)
			cancel()
			if err == nil {
				p.records.Add(int64(records))
			}
			if err != nil {
				// The model already advanced: a lost batch would make the
				// totals check fail, which is what we want to notice.
				t.Errorf("produce: %v", err)
				return
			}
		}
	}()
	return p
}

type sentMsg struct {
	msg     kafka.Message
	records int
}

// wait waits for the producer to send everything.
func (p *producer) wait() { <-p.done }

// encodeNoT is encode for goroutines other than the test's.
func encodeNoT(b wire.Batch) kafka.Message {
	v, err := wire.Encode(b)
	if err != nil {
		panic(err)
	}
	return kafka.Message{Key: []byte(b.Records[0].Customer), Value: v}
}

func portOf(t *testing.T, addr string) int {
	_, p, err := net.SplitHostPort(addr)
	if err != nil {
		t.Fatal(err)
	}
	n, err := strconv.Atoi(p)
	if err != nil {
		t.Fatal(err)
	}
	return n
}

// Two members share the group; a third joins and one leaves mid-stream.
// Totals stay exact and each partition's offset only moves forward.
func TestRebalanceMidStream(t *testing.T) {
	t.Parallel()
	e := newEnv(t, 4)
	streams := models(12)
	p := startProducer(t, e.kafka.Addrs, streams, 7, 150, 5*time.Millisecond)
	a := e.start()
	time.Sleep(300 * time.Millisecond)
	b := e.start()
	time.Sleep(700 * time.Millisecond)
	c := e.start()
	time.Sleep(500 * time.Millisecond)
	a.Stop(t)
	p.wait()
	e.waitCaughtUp(60 * time.Second)
	b.Stop(t)
	c.Stop(t)
	e.checkLedger(streams)
	e.checkOffsets()
	e.checkCounters()
	var owners int
	if err := e.pool.QueryRow(context.Background(), "SELECT count(DISTINCT owner) FROM ingest_partitions").Scan(&owners); err != nil {
		t.Fatal(err)
	}
	if owners < 2 {
		t.Errorf("only %d member(s) ever committed; the rebalance did not share partitions", owners)
	}
	// A member releases a partition only once its work there stopped, and
	// another claims it only once released (or its holder's lease ran out):
	// ownership never overlapped, so nobody was fenced.
	for i, m := range []*member{a, b, c} {
		if f := m.Metric("tally_ingest_fenced_total", nil); f != 0 {
			t.Errorf("member %d was fenced %v times: two members owned a partition at once", i, f)
		}
	}
	if got, want := e.checkCounters().RecordsIn, p.records.Load(); got != want {
		t.Errorf("records in %d, want exactly the %d sent", got, want)
	}
}

// Two consumers that both believe they own every partition (two groups on
// one database: the worst case of a member that lost its partition without
// noticing) race on every micro-batch. The compare-and-set on the stored
// offset lets exactly one commit each range: totals are exact and every
// record is counted once.
func TestFencingConcurrentOwners(t *testing.T) {
	t.Parallel()
	e := newEnv(t, 2)
	streams := models(6)
	p := startProducer(t, e.kafka.Addrs, streams, 23, 150, 5*time.Millisecond)
	a := e.start(func(c *ingest.Config) { c.Group = "group-a" })
	b := e.start(func(c *ingest.Config) { c.Group = "group-b" })
	p.wait()
	e.waitCaughtUp(60 * time.Second)
	a.Stop(t)
	b.Stop(t)
	e.checkLedger(streams)
	e.checkOffsets()
	if got, want := e.checkCounters().RecordsIn, p.records.Load(); got != want {
		t.Errorf("records in %d, want exactly the %d sent (each counted once)", got, want)
	}
	fenced := a.Metric("tally_ingest_fenced_total", nil) + b.Metric("tally_ingest_fenced_total", nil)
	t.Logf("fenced %v times", fenced)
	if fenced == 0 {
		t.Errorf("the two owners were never fenced; the test raced nothing")
	}
}

// Postgres connections are killed (pg_terminate_backend) again and again
// while ingest runs: transactions roll back and are retried, nothing is lost
// or doubled. A kill lands mid-batch only by chance (a backend may be
// killed between batches, or ingest's listener), so production goes on in
// rounds until ingest has retried at least one interrupted batch.
func TestPostgresConnectionsTerminated(t *testing.T) {
	t.Parallel()
	e := newEnv(t, 2)
	streams := models(6)
	m := e.start()

	killer, err := pgxpool.New(context.Background(), e.dbURL)
	if err != nil {
		t.Fatal(err)
	}
	defer killer.Close()
	var killed int
	const rounds = 5
	for round := range rounds {
		p := startProducer(t, e.kafka.Addrs, streams, 11+uint64(round), 120, 5*time.Millisecond)
		stop := make(chan struct{})
		var wg sync.WaitGroup
		wg.Go(func() {
			for {
				select {
				case <-stop:
					return
				case <-time.After(time.Duration(20+rand.IntN(60)) * time.Millisecond):
				}
				var n int
				// Prefer backends inside a transaction: that is mid-batch.
				_ = killer.QueryRow(context.Background(), `
					SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity
					WHERE datname = current_database() AND pid <> pg_backend_pid()
					  AND backend_type = 'client backend' AND state IN ('active', 'idle in transaction')`).Scan(&n)
				killed += n
			}
		})
		p.wait()
		time.Sleep(time.Second)
		close(stop)
		wg.Wait()
		if m.Metric("tally_ingest_retries_total", nil) > 0 {
			break
		}
	}
	e.waitCaughtUp(60 * time.Second)
	m.Stop(t)
	t.Logf("terminated %d backends; %v retries", killed, m.Metric("tally_ingest_retries_total", nil))
	if killed == 0 || m.Metric("tally_ingest_retries_total", nil) == 0 {
		t.Errorf("no transaction was interrupted in %d rounds (killed %d); the test proved nothing", rounds, killed)
	}
	e.checkLedger(streams)
	e.checkOffsets()
	e.checkCounters()
}

// The broker stops and starts again on the same data directory and port;
// ingest waits it out and continues where it was.
func TestBrokerRestart(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	start := func(port int) *kafkatest.Cluster {
		c, err := kafkatest.Start(kafkatest.Options{Topics: []kafkatest.Topic{{Name: topic, Partitions: 2}}, DataDir: dir, Port: port})
		if err != nil {
			t.Fatal(err)
		}
		return c
	}
	k := start(0)
	port := portOf(t, k.Addrs[0])
	e := newEnvWith(t, k, 2)
	streams := models(4)
	rng := rand.New(rand.NewPCG(5, 6))
	var first []kafka.Message
	for range 20 {
		first = append(first, encode(t, streams[rng.IntN(len(streams))].next(rng, 5)))
	}
	k.Produce(t, topic, first...)
	m := e.start()
	e.waitCaughtUp(30 * time.Second)

	k.Close()
	time.Sleep(500 * time.Millisecond)
	k = start(port)
	defer k.Close()
	e.kafka = k
	for p := range 2 {
		if hw := k.HighWatermark(t, topic, p); hw == 0 {
			t.Fatalf("partition %d is empty after the restart: the data directory was not reloaded", p)
		}
	}
	var more []kafka.Message
	for range 20 {
		more = append(more, encode(t, streams[rng.IntN(len(streams))].next(rng, 5)))
	}
	k.Produce(t, topic, more...)
	e.waitCaughtUp(60 * time.Second)
	m.Stop(t)
	e.checkLedger(streams)
	e.checkOffsets()
	e.checkCounters()
}

// A consumer process is killed with SIGKILL at random instants, several
// times, while a producer keeps sending (with retransmits); a last process
// finishes the work. Totals are exact and offsets never went back.
func TestConsumerKilledAndRestarted(t *testing.T) {
	t.Parallel()
	e := newEnv(t, 2)
	streams := models(6)
	p := startProducer(t, e.kafka.Addrs, streams, 13, 100000, 10*time.Millisecond)
	rng := rand.New(rand.NewPCG(17, 19))
	for round := range 5 {
		before := e.storedTotal()
		cmd := e.child(t)
		// Kill it at a random instant once it is consuming: after its first
		// commit, somewhere in the next 0-400ms (mid-batch, mid-transaction
		// or between batches).
		if err := eventually(20*time.Second, func() error {
			if e.storedTotal() > before {
				return nil
			}
			return fmt.Errorf("stored offsets still %d", before)
		}); err != nil {
			t.Fatalf("round %d: consumer process made no progress: %v", round, err)
		}
		time.Sleep(time.Duration(rng.IntN(400)) * time.Millisecond)
		if err := cmd.Process.Signal(syscall.SIGKILL); err != nil {
			t.Fatal(err)
		}
		_ = cmd.Wait()
		t.Logf("round %d: killed consumer process %d; stored offsets %d -> %d", round, cmd.Process.Pid, before, e.storedTotal())
	}
	close(p.stop)
	p.wait()
	cmd := e.child(t)
	e.waitCaughtUp(60 * time.Second)
	if err := cmd.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	if err := cmd.Wait(); err != nil {
		t.Errorf("last consumer process after SIGTERM: %v", err)
	}
	e.checkLedger(streams)
	e.checkOffsets()
	e.checkCounters()
}

// storedTotal is the sum of stored next offsets.
func (e *env) storedTotal() int64 {
	var n int64
	if err := e.pool.QueryRow(context.Background(), "SELECT coalesce(sum(next_offset), 0) FROM ingest_partitions").Scan(&n); err != nil {
		e.t.Fatal(err)
	}
	return n
}

const childEnv = "TALLY_INGEST_TEST_CHILD"

// child starts this test binary as a consumer process and returns once it
// handles SIGTERM.
func (e *env) child(t *testing.T, env ...string) *exec.Cmd {
	t.Helper()
	cmd := exec.Command(os.Args[0], "-test.run=^$")
	// env comes last: it may override (os/exec keeps the last value).
	cmd.Env = append(append(os.Environ(), childEnv+"=1",
		"TALLY_TEST_CHILD_DB="+e.dbURL, "TALLY_TEST_CHILD_BROKERS="+strings.Join(e.kafka.Addrs, ",")), env...)
	cmd.Stderr = tWriter{t}
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	line, err := bufio.NewReader(out).ReadString('\n')
	if err != nil || line != "ready\n" {
		t.Fatalf("consumer process: %q, %v", line, err)
	}
	return cmd
}

// childMain is a consumer process: it runs until SIGTERM.
func childMain() int {
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, syscall.SIGINT)
	defer stop()
	log := slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelWarn}))
	fmt.Println("ready")
	pool, err := pgxpool.New(ctx, os.Getenv("TALLY_TEST_CHILD_DB"))
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	defer pool.Close()
	cfg := testConfig(strings.Split(os.Getenv("TALLY_TEST_CHILD_BROKERS"), ","), pool, log)
	if os.Getenv(childDefaultTimingsEnv) != "" {
		cfg.HeartbeatInterval, cfg.SessionTimeout = 0, 0
	}
	if v := os.Getenv(childSessionTimeoutEnv); v != "" {
		if cfg.SessionTimeout, err = time.ParseDuration(v); err != nil {
			fmt.Fprintln(os.Stderr, err)
			return 1
		}
		cfg.HeartbeatInterval = 0
	}
	c, err := ingest.NewConsumer(cfg)
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	if err := c.Run(ctx); err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	return 0
}

// A micro-batch's COMMIT reaches Postgres and commits, and its answer is
// lost with the connection: ingest cannot tell from the error whether it
// committed. It must read the stored offset, find the batch committed and
// go on: nothing applied twice, no counter counted twice, nothing
// dead-lettered as refused.
func TestCommitWhoseAnswerIsLostCountsOnce(t *testing.T) {
	t.Parallel()
	e := newEnv(t, 2)
	streams := models(6)

	cfg, err := pgxpool.ParseConfig(e.dbURL)
	if err != nil {
		t.Fatal(err)
	}
	var lose, lost atomic.Int64 // commit answers still to lose; lost so far
	cfg.ConnConfig.DialFunc = func(ctx context.Context, network, addr string) (net.Conn, error) {
		c, err := (&net.Dialer{}).DialContext(ctx, network, addr)
		if err != nil {
			return nil, err
		}
		return &commitLoser{Conn: c, lose: &lose, lost: &lost}, nil
	}
	pool, err := pgxpool.NewWithConfig(context.Background(), cfg)
	if err != nil {
		t.Fatal(err)
	}
	defer pool.Close()

	logs := testrun.Logs(t)
	log := slog.New(slog.NewTextHandler(logs, &slog.HandlerOptions{Level: slog.LevelInfo}))
	m := e.start(func(c *ingest.Config) { c.Pool, c.Logger = pool, log })
	p := startProducer(t, e.kafka.Addrs, streams, 3, 120, 5*time.Millisecond)
	time.Sleep(300 * time.Millisecond)
	lose.Store(5)
	p.wait()
	e.waitCaughtUp(60 * time.Second)
	m.Stop(t)

	if lost.Load() == 0 {
		t.Fatal("no commit answer was lost; the test proved nothing")
	}
	if n := strings.Count(logs.String(), "the failed commit had committed"); n == 0 {
		t.Errorf("lost %d commit answers, and ingest never found a batch committed by one", lost.Load())
	}
	e.checkLedger(streams)
	e.checkOffsets()
	if got, want := e.checkCounters().RecordsIn, p.records.Load(); got != want {
		t.Errorf("records in %d, want exactly the %d sent", got, want)
	}
	var dead int
	if err := e.pool.QueryRow(context.Background(), "SELECT count(*) FROM dead_letters").Scan(&dead); err != nil {
		t.Fatal(err)
	}
	if dead != 0 {
		t.Errorf("%d dead letters: a lost commit answer was taken for a refusal", dead)
	}
	t.Logf("lost %d commit answers", lost.Load())
}

// commitLoser is a connection to Postgres that, while lose > 0, drops the
// connection instead of delivering a COMMIT's CommandComplete: the server
// has committed, the client sees the connection fail.
type commitLoser struct {
	net.Conn
	lose, lost *atomic.Int64
}

// commitComplete is the CommandComplete message of a COMMIT.
var commitComplete = []byte("C\x00\x00\x00\x0bCOMMIT\x00")

func (c *commitLoser) Read(b []byte) (int, error) {
	n, err := c.Conn.Read(b)
	if n > 0 && bytes.Contains(b[:n], commitComplete) && c.lose.Add(-1) >= 0 {
		c.lost.Add(1)
		_ = c.Conn.Close()
		return 0, io.ErrUnexpectedEOF
	}
	return n, err
}
