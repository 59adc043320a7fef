package producer_test

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/shopspring/decimal"

	"github.com/tally-ledger/tally/internal/pgtest"
	"github.com/tally-ledger/tally/internal/testrun"
	"github.com/tally-ledger/tally/producer"
)

// A repeated key returns the first answer and records nothing new: in one
// group commit, after a Stop and restart on the same Dir, and after a
// Close (a new epoch). Other usage under a used key is refused with the
// first usage named. Kafka ends up with each key's record once.
func TestARepeatedKeyRecordsNothingNew(t *testing.T) {
	ctx := context.Background()
	dir := t.TempDir()
	c := newCluster(t, 1)
	at := time.Now().Add(-time.Minute)
	reg := prometheus.NewRegistry()
	p := newProducer(t, producer.Config{Brokers: c.Addrs, Dir: dir, Registerer: reg})

	// Eight concurrent calls with one key: one record.
	var wg sync.WaitGroup
	errs := make([]error, 8)
	for i := range errs {
		wg.Go(func() { errs[i] = p.Record(ctx, "acme", "api_calls", d("5"), at, producer.Key("job-1")) })
	}
	wg.Wait()
	for i, err := range errs {
		if err != nil {
			t.Fatalf("call %d with job-1: %v", i, err)
		}
	}
	if err := p.Record(ctx, "acme", "api_calls", d("5"), at, producer.Key("job-1")); err != nil {
		t.Fatalf("job-1 again: %v", err)
	}
	var reused *producer.KeyReusedError
	err := p.Record(ctx, "acme", "api_calls", d("6"), at, producer.Key("job-1"))
	if !errors.As(err, &reused) || !reused.Quantity.Equal(d("5")) || reused.Customer != "acme" || reused.Key != "job-1" {
		t.Fatalf("job-1 with other usage: %v", err)
	}
	if n := counter(t, reg, "tally_producer_key_repeats_total"); n != 9 {
		t.Errorf("tally_producer_key_repeats_total = %v, want 9 (7 in the group, 2 after)", n)
	}
	if err := p.Record(ctx, "acme", "api_calls", d("2"), at, producer.Key("job-2")); err != nil {
		t.Fatal(err)
	}
	if err := p.Record(ctx, "acme", "api_calls", d("1"), at); err != nil { // no key: always recorded
		t.Fatal(err)
	}
	stopNow, cancel := context.WithCancel(ctx)
	cancel()
	if err := p.Stop(stopNow); err != nil {
		t.Fatal(err)
	}

	// Restarted on the same Dir: the keys are still known.
	p = newProducer(t, producer.Config{Brokers: c.Addrs, Dir: dir})
	for _, k := range []struct {
		key string
		q   string
	}{{"job-1", "5"}, {"job-2", "2"}} {
		if err := p.Record(ctx, "acme", "api_calls", d(k.q), at, producer.Key(k.key)); err != nil {
			t.Fatalf("%s after a restart: %v", k.key, err)
		}
	}
	cctx, ccancel := context.WithTimeout(ctx, 30*time.Second)
	defer ccancel()
	if err := p.Close(cctx); err != nil {
		t.Fatal(err)
	}

	// A new epoch (after Close) keeps them too.
	p = newProducer(t, producer.Config{Brokers: c.Addrs, Dir: dir})
	if err := p.Record(ctx, "acme", "api_calls", d("5"), at, producer.Key("job-1")); err != nil {
		t.Fatalf("job-1 in a new epoch: %v", err)
	}
	if err := p.Record(ctx, "acme", "api_calls", d("3"), at, producer.Key("job-3")); err != nil {
		t.Fatal(err)
	}
	if err := p.Flush(cctx); err != nil {
		t.Fatal(err)
	}
	var sum decimal.Decimal
	var n int
	for _, b := range readBatches(t, c, 1) {
		for _, r := range b.Records {
			if !r.Final {
				sum, n = sum.Add(r.Quantity.Decimal), n+1
			}
		}
	}
	if n != 4 || !sum.Equal(d("11")) {
		t.Fatalf("Kafka holds %d records summing %s; want 4 (job-1, job-2, the unkeyed one, job-3) summing 11", n, sum)
	}
}

// A key is remembered for KeyRetention, then records again; a key too long
// is refused before anything is stored.
func TestKeyRetentionAndBounds(t *testing.T) {
	ctx := context.Background()
	c := newCluster(t, 1)
	p := newProducer(t, producer.Config{Brokers: c.Addrs, Dir: t.TempDir(), KeyRetention: 50 * time.Millisecond})
	at := time.Now().Add(-time.Minute)
	for range 2 {
		if err := p.Record(ctx, "acme", "api_calls", d("1"), at, producer.Key("k")); err != nil {
			t.Fatal(err)
		}
	}
	time.Sleep(100 * time.Millisecond)
	// This commit prunes k, then k records again.
	if err := p.Record(ctx, "acme", "api_calls", d("1"), at, producer.Key("other")); err != nil {
		t.Fatal(err)
	}
	if err := p.Record(ctx, "acme", "api_calls", d("1"), at, producer.Key("k")); err != nil {
		t.Fatal(err)
	}
	long := fmt.Sprintf("%0*d", producer.MaxKeyLen+1, 0)
	if err := p.Record(ctx, "acme", "api_calls", d("1"), at, producer.Key(long)); err == nil {
		t.Fatal("a key of MaxKeyLen+1 bytes was accepted")
	}
	fctx, cancel := context.WithTimeout(ctx, 20*time.Second)
	defer cancel()
	if err := p.Flush(fctx); err != nil {
		t.Fatal(err)
	}
	n := 0
	for _, b := range readBatches(t, c, 1) {
		n += len(b.Records)
	}
	if n != 3 {
		t.Fatalf("%d records; want 3 (k, other, k after its retention)", n)
	}
}

// TestKeysMakeRetriesAfterSIGKILLExact: a caller that, after each kill,
// records all its jobs again from the first with the same keys is billed
// exactly once per job: the jobs the killed runs made durable (including
// the Record in flight at the kill, if it was) record nothing the second
// time.
func TestKeysMakeRetriesAfterSIGKILLExact(t *testing.T) {
	c := newCluster(t, 4)
	dir := t.TempDir()
	for i, kill := range []time.Duration{200 * time.Millisecond, 500 * time.Millisecond, 0} {
		r := runKeyedChild(t, dir, c.Addrs, kill)
		t.Logf("run %d: killed after %v: jobs acknowledged up to %d", i, kill, r)
	}
	runChild(t, "close", dir, c.Addrs, 0)

	pool := pgtest.New(t)
	stop := runIngest(t, c.Addrs, pool)
	defer stop()
	waitCaughtUp(t, c, pool, 4, 60*time.Second)
	var billed decimal.Decimal
	var records int
	if err := pool.QueryRow(context.Background(), `SELECT coalesce(sum(quantity), 0), count(*) FILTER (WHERE quantity > 0)
		FROM records WHERE customer = 'keyed' AND meter = 'jobs'`).Scan(&billed, &records); err != nil {
		t.Fatal(err)
	}
	if !billed.Equal(decimal.NewFromInt(keyedJobs)) || records != keyedJobs {
		t.Fatalf("billed %s in %d records; want exactly %d jobs once each", billed, records, keyedJobs)
	}
}

// runKeyedChild runs a "keyed" child, killing it after kill (0: let it
// finish), and returns the last job it saw acknowledged (-1: none).
func runKeyedChild(t *testing.T, dir string, brokers []string, kill time.Duration) int {
	t.Helper()
	cmd := exec.Command(os.Args[0], "-test.run=^$")
	cmd.Env = append(os.Environ(), childEnv+"=keyed", childDir+"="+dir, childBrokers+"="+strings.Join(brokers, ","))
	var stderr strings.Builder
	cmd.Stderr = &stderr
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	last, done := -1, false
	lines := make(chan struct{})
	go func() {
		defer close(lines)
		sc := bufio.NewScanner(out)
		for sc.Scan() {
			f := strings.Fields(sc.Text())
			switch {
			case len(f) == 2 && f[0] == "K":
				last, _ = strconv.Atoi(f[1])
			case len(f) == 1 && f[0] == "DONE":
				done = true
			}
		}
	}()
	if kill > 0 {
		time.Sleep(kill)
		_ = cmd.Process.Kill()
	}
	<-lines
	err = cmd.Wait()
	if strings.Contains(stderr.String(), "record:") {
		t.Fatalf("a Record call failed in the child:\n%s", stderr.String())
	}
	if kill == 0 && (err != nil || !done) {
		t.Fatalf("keyed child: %v (done %v)\n%s", err, done, stderr.String())
	}
	return last
}

// Close logs "producer stopped" once, and Stop after Close adds nothing.
func TestCloseLogsStoppedOnce(t *testing.T) {
	c := newCluster(t, 1)
	var logs testrun.Buffer
	p := newProducer(t, producer.Config{Brokers: c.Addrs, Dir: t.TempDir(),
		Logger: slog.New(slog.NewTextHandler(&logs, nil))})
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	if err := p.Record(ctx, "acme", "api_calls", d("1"), time.Now()); err != nil {
		t.Fatal(err)
	}
	if err := p.Close(ctx); err != nil {
		t.Fatal(err)
	}
	_ = p.Close(ctx)
	_ = p.Stop(ctx)
	if n := strings.Count(logs.String(), `msg="producer stopped"`); n != 1 {
		t.Fatalf(`"producer stopped" logged %d times:\n%s`, n, logs.String())
	}
}
