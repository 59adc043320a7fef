package producer_test

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/shopspring/decimal"

	"github.com/tally-ledger/tally/ingest"
	"github.com/tally-ledger/tally/internal/kafkatest"
	"github.com/tally-ledger/tally/internal/pgtest"
	"github.com/tally-ledger/tally/ledger"
	"github.com/tally-ledger/tally/producer"
)

// The child process of TestSIGKILLBillsExactlyTheAcknowledgedUsage.
const (
	childEnv     = "TALLY_PRODUCER_CHILD" // "record" or "close"
	childDir     = "TALLY_PRODUCER_CHILD_DIR"
	childBrokers = "TALLY_PRODUCER_CHILD_BROKERS"
)

// keyedJobs is how many jobs a "keyed" child records, one unit each.
const keyedJobs = 1000

var crashStreams = [][2]string{{"acme", "api_calls"}, {"acme", "storage_gb"}, {"globex", "api_calls"}, {"initech", "jobs"}}

// childMain records usage on every stream concurrently until killed
// ("record"), or closes the producer ("close"). For each Record call it
// prints "I customer meter quantity" before and "A customer meter
// quantity" once Record returned nil, each line in one write.
func childMain() int {
	var mu sync.Mutex
	say := func(format string, a ...any) {
		mu.Lock()
		defer mu.Unlock()
		os.Stdout.WriteString(fmt.Sprintf(format, a...) + "\n")
	}
	p, err := producer.New(producer.Config{
		Brokers: strings.Split(os.Getenv(childBrokers), ","), Topic: topic, Producer: "crashy",
		Dir: os.Getenv(childDir), Linger: 5 * time.Millisecond, MaxBatchRecords: 50,
		RetryMin: 10 * time.Millisecond, RetryMax: 200 * time.Millisecond,
		Logger: slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelWarn})),
	})
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 2
	}
	say("E %d", p.Epoch())
	ctx := context.Background()
	if os.Getenv(childEnv) == "close" {
		cctx, cancel := context.WithTimeout(ctx, 60*time.Second)
		defer cancel()
		if err := p.Close(cctx); err != nil {
			fmt.Fprintln(os.Stderr, err)
			return 3
		}
		say("CLOSED")
		return 0
	}
	if os.Getenv(childEnv) == "keyed" {
		// "Send exactly keyedJobs": every job from the first, each with its
		// key; a job a killed run recorded records nothing now.
		for i := range keyedJobs {
			if err := p.Record(ctx, "keyed", "jobs", decimal.NewFromInt(1), time.Now(), producer.Key(fmt.Sprintf("job-%d", i))); err != nil {
				fmt.Fprintln(os.Stderr, "record:", err)
				return 4
			}
			say("K %d", i)
		}
		say("DONE")
		return 0
	}
	var wg sync.WaitGroup
	for _, s := range crashStreams {
		wg.Go(func() {
			for {
				q := decimal.New(rand.Int64N(100000)+1, -3)
				say("I %s %s %s", s[0], s[1], q)
				if err := p.Record(ctx, s[0], s[1], q, time.Now()); err != nil {
					fmt.Fprintln(os.Stderr, "record:", err)
					os.Exit(4)
				}
				say("A %s %s %s", s[0], s[1], q)
			}
		})
	}
	wg.Wait()
	return 0
}

// round is what the parent saw of one child run, per stream.
type round struct {
	acked    map[[2]string]decimal.Decimal
	inFlight map[[2]string]decimal.Decimal // the Record call in flight at the kill, if any
	epoch    int64
	records  int
}

func runChild(t *testing.T, mode, dir string, brokers []string, killAfter time.Duration) round {
	t.Helper()
	cmd := exec.Command(os.Args[0], "-test.run=^$")
	cmd.Env = append(os.Environ(), childEnv+"="+mode, childDir+"="+dir, childBrokers+"="+strings.Join(brokers, ","))
	var stderr strings.Builder
	cmd.Stderr = &stderr
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	r := round{acked: map[[2]string]decimal.Decimal{}, inFlight: map[[2]string]decimal.Decimal{}}
	lines := make(chan struct{})
	go func() {
		defer close(lines)
		sc := bufio.NewScanner(out)
		for sc.Scan() {
			f := strings.Fields(sc.Text())
			switch {
			case len(f) == 2 && f[0] == "E":
				r.epoch, _ = strconv.ParseInt(f[1], 10, 64)
			case len(f) == 4 && (f[0] == "I" || f[0] == "A"):
				k := [2]string{f[1], f[2]}
				q := decimal.RequireFromString(f[3])
				if f[0] == "I" {
					r.inFlight[k] = q
				} else {
					delete(r.inFlight, k)
					r.acked[k] = r.acked[k].Add(q)
					r.records++
				}
			}
		}
	}()
	if killAfter > 0 {
		time.Sleep(killAfter)
		_ = cmd.Process.Kill() // SIGKILL
	}
	<-lines
	err = cmd.Wait()
	if killAfter == 0 && err != nil {
		t.Fatalf("child %s: %v\n%s", mode, err, stderr.String())
	}
	if strings.Contains(stderr.String(), "record:") {
		t.Fatalf("a Record call failed in the child:\n%s", stderr.String())
	}
	return r
}

// TestSIGKILLBillsExactlyTheAcknowledgedUsage kills a producer process
// with SIGKILL at random instants, while it records usage and while it
// closes, restarts it on the same Dir, finally closes it cleanly, ingests
// everything into a real ledger and checks the guarantee of the package
// doc: per customer and meter, billed = acknowledged + some of the Record
// calls in flight at the kills (at most one per stream per kill), to the
// last decimal digit; every stream ends with its final record; no gaps,
// conflicts or dead letters; a new epoch only after a Close, never a
// reused one.
func TestSIGKILLBillsExactlyTheAcknowledgedUsage(t *testing.T) {
	c := newCluster(t, 4)
	dir := t.TempDir()
	seed := uint64(time.Now().UnixNano())
	rng := rand.New(rand.NewPCG(seed, 0))
	t.Logf("seed %d", seed)

	acked := map[[2]string]decimal.Decimal{}
	var inFlight []map[[2]string]decimal.Decimal
	total := 0
	var lastEpoch int64
	// closedSince: a "close" round ran since lastEpoch was seen. A round
	// killed before it printed its epoch (epoch 0) tells nothing, so the
	// new epoch a finished Close allows may first be seen rounds later.
	closedSince := false
	for i, mode := range []string{"record", "record", "close", "record", "record", "close", "record"} {
		kill := time.Duration(100+rng.IntN(600)) * time.Millisecond
		if mode == "close" {
			kill = time.Duration(20+rng.IntN(300)) * time.Millisecond
		}
		r := runChild(t, mode, dir, c.Addrs, kill)
		t.Logf("round %d (%s): killed after %v: %d records acknowledged, %d in flight, epoch %d", i, mode, kill, r.records, len(r.inFlight), r.epoch)
		for k, q := range r.acked {
			acked[k] = acked[k].Add(q)
		}
		inFlight = append(inFlight, r.inFlight)
		total += r.records
		if r.epoch != 0 {
			switch {
			case r.epoch < lastEpoch:
				t.Errorf("round %d: epoch %d after epoch %d: went back", i, r.epoch, lastEpoch)
			case r.epoch > lastEpoch && lastEpoch != 0 && !closedSince:
				t.Errorf("round %d: new epoch %d with no Close since epoch %d was seen; the state survived, so want %d", i, r.epoch, lastEpoch, lastEpoch)
			}
			lastEpoch = r.epoch
			closedSince = false
		}
		if mode == "close" {
			closedSince = true
		}
	}
	runChild(t, "close", dir, c.Addrs, 0)
	if total == 0 {
		t.Fatal("no Record call was acknowledged in any round; kill later")
	}

	pool := pgtest.New(t)
	stop := runIngest(t, c.Addrs, pool)
	defer stop()
	ctx := context.Background()
	waitCaughtUp(t, c, pool, 4, 60*time.Second)

	for _, s := range crashStreams {
		k := [2]string{s[0], s[1]}
		var billed, totals decimal.Decimal
		var streams, unfinished int
		if err := pool.QueryRow(ctx, `SELECT coalesce(sum(quantity), 0) FROM rollups WHERE customer = $1 AND meter = $2`, s[0], s[1]).Scan(&billed); err != nil {
			t.Fatal(err)
		}
		if err := pool.QueryRow(ctx, `SELECT coalesce(sum(last_total), 0), count(*), count(*) FILTER (WHERE final_seq IS DISTINCT FROM last_seq)
			FROM streams WHERE producer = 'crashy' AND customer = $1 AND meter = $2`, s[0], s[1]).Scan(&totals, &streams, &unfinished); err != nil {
			t.Fatal(err)
		}
		if !billed.Equal(totals) {
			t.Errorf("%v: rollups %s but stream totals %s", k, billed, totals)
		}
		if streams == 0 || unfinished != 0 {
			t.Errorf("%v: %d streams, %d of them without a final record at their end", k, streams, unfinished)
		}
		var qs []decimal.Decimal
		for _, f := range inFlight {
			if q, ok := f[k]; ok {
				qs = append(qs, q)
			}
		}
		extra := billed.Sub(acked[k])
		if !subsetSum(qs, extra) {
			t.Errorf("%v: billed %s, acknowledged %s: the difference %s is not a sum of the in-flight Record calls %v",
				k, billed, acked[k], extra, qs)
		} else {
			t.Logf("%v: billed %s = acknowledged %s + in flight %s (of %v), %d epochs", k, billed, acked[k], extra, qs, streams)
		}
	}
	for _, q := range []string{
		`SELECT count(*) FROM gaps`, `SELECT count(*) FROM conflicts`, `SELECT count(*) FROM dead_letters`,
	} {
		var n int
		if err := pool.QueryRow(ctx, q).Scan(&n); err != nil {
			t.Fatal(err)
		}
		if n != 0 {
			t.Errorf("%s = %d, want 0", q, n)
		}
	}
}

// waitCaughtUp waits until ingest consumed every partition to its end.
func waitCaughtUp(t *testing.T, c *kafkatest.Cluster, pool *pgxpool.Pool, partitions int, within time.Duration) {
	t.Helper()
	ends := make([]int64, partitions)
	for p := range partitions {
		ends[p] = c.HighWatermark(t, topic, p)
	}
	deadline := time.Now().Add(within)
	for {
		behind := 0
		for p := range partitions {
			var next int64
			err := pool.QueryRow(context.Background(), `SELECT next_offset FROM ingest_partitions WHERE topic = $1 AND partition = $2`, topic, p).Scan(&next)
			if err != nil && !errors.Is(err, pgx.ErrNoRows) {
				t.Fatal(err)
			}
			if next < ends[p] {
				behind++
			}
		}
		if behind == 0 {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("ingest still behind on %d partitions after %v", behind, within)
		}
		time.Sleep(100 * time.Millisecond)
	}
}

func subsetSum(qs []decimal.Decimal, want decimal.Decimal) bool {
	for mask := 0; mask < 1<<len(qs); mask++ {
		sum := decimal.Zero
		for i, q := range qs {
			if mask&(1<<i) != 0 {
				sum = sum.Add(q)
			}
		}
		if sum.Equal(want) {
			return true
		}
	}
	return false
}

// runIngest runs the real ingest consumer into pool until the returned
// function is called.
func runIngest(t *testing.T, brokers []string, pool *pgxpool.Pool) func() {
	t.Helper()
	log := slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelError}))
	l, err := ledger.New(ledger.Config{Logger: log})
	if err != nil {
		t.Fatal(err)
	}
	cons, err := ingest.NewConsumer(ingest.Config{
		Brokers: brokers, Topic: topic, Group: "tally-ingest", Pool: pool, Ledger: l, Logger: log,
		Registry: prometheus.NewRegistry(), MaxBatchWait: 50 * time.Millisecond,
		RetryMin: 10 * time.Millisecond, RetryMax: 300 * time.Millisecond, PositionInterval: 200 * time.Millisecond,
		HeartbeatInterval: 100 * time.Millisecond, SessionTimeout: 1500 * time.Millisecond,
		FetchMaxWait: 500 * time.Millisecond,
	})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- cons.Run(ctx) }()
	var once sync.Once
	stop := func() {
		once.Do(func() {
			cancel()
			select {
			case err := <-done:
				if err != nil {
					t.Errorf("ingest: %v", err)
				}
			case <-time.After(30 * time.Second):
				t.Errorf("ingest did not stop within 30s")
			}
		})
	}
	t.Cleanup(stop)
	return stop
}
