package producer_test

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/segmentio/kafka-go"
	"github.com/shopspring/decimal"

	"github.com/tally-ledger/tally/internal/kafkatest"
	"github.com/tally-ledger/tally/producer"
)

// slowWriter is a Kafka that acknowledges slowly.
type slowWriter struct {
	*kafkatest.Writer
	delay time.Duration
}

func (w slowWriter) WriteMessages(ctx context.Context, msgs ...kafka.Message) error {
	time.Sleep(w.delay)
	return w.Writer.WriteMessages(ctx, msgs...)
}

// Close's final records count against MaxBuffered like any other: with
// more streams than MaxBuffered, Close writes them as room frees up, and
// every stream still gets its final record.
func TestCloseKeepsFinalRecordsWithinMaxBuffered(t *testing.T) {
	c := newCluster(t, 1)
	kw := c.Writer(topic)
	defer kw.Close()
	const maxBuffered, streams = 10, 60
	p := newProducer(t, producer.Config{Writer: slowWriter{kw, 20 * time.Millisecond}, Dir: t.TempDir(),
		MaxBuffered: maxBuffered, BlockWhenFull: true})
	ctx := context.Background()
	for i := range streams {
		if err := p.Record(ctx, fmt.Sprintf("c%03d", i), "m", d("1"), time.Now()); err != nil {
			t.Fatal(err)
		}
	}
	var peak atomic.Int64
	done := make(chan struct{})
	go func() {
		for {
			peak.Store(max(peak.Load(), int64(p.Buffered())))
			select {
			case <-done:
				return
			case <-time.After(time.Millisecond):
			}
		}
	}()
	cctx, cancel := context.WithTimeout(ctx, 2*time.Minute)
	defer cancel()
	err := p.Close(cctx)
	close(done)
	if err != nil {
		t.Fatal(err)
	}
	if peak.Load() > maxBuffered {
		t.Errorf("%d records buffered during Close, above MaxBuffered %d", peak.Load(), maxBuffered)
	}
	finals := 0
	for _, b := range readBatches(t, c, 1) {
		for _, r := range b.Records {
			if r.Final {
				finals++
			}
		}
	}
	if finals != streams {
		t.Errorf("%d final records in Kafka, want %d", finals, streams)
	}
}

// The producer keeps at most StreamCache stream states in memory (the rest
// are on disk, read back when a stream records again), and a stream read
// back continues its seq and total.
func TestStreamStatesInMemoryAreBounded(t *testing.T) {
	c := newCluster(t, 1)
	reg := prometheus.NewRegistry()
	dir := t.TempDir()
	p := newProducer(t, producer.Config{Brokers: c.Addrs, Dir: dir, StreamCache: 100, Registerer: reg})
	ctx := context.Background()
	for round := range 2 {
		for i := range 1000 {
			if err := p.Record(ctx, fmt.Sprintf("c%04d", i), "m", d(fmt.Sprint(round+1)), time.Now()); err != nil {
				t.Fatal(err)
			}
			if n := gauge(t, reg, "tally_producer_streams_in_memory"); n > 100 {
				t.Fatalf("%v stream states in memory, above StreamCache 100", n)
			}
		}
	}
	if n := gauge(t, reg, "tally_producer_streams_in_memory"); n < 1 {
		t.Errorf("tally_producer_streams_in_memory is %v", n)
	}
	if err := p.Close(ctx); err != nil {
		t.Fatal(err)
	}
	for _, b := range readBatches(t, c, 1) {
		for _, r := range b.Records {
			if want := map[int64]string{1: "1", 2: "3", 3: "3"}[r.Seq]; r.Total.String() != want || (r.Seq == 3) != r.Final {
				t.Fatalf("%s seq %d total %s final %v; want seqs 1, 2, 3 (final) with totals 1, 3, 3", r.Customer, r.Seq, r.Total, r.Final)
			}
		}
	}
}

// A commit that fails (here: the file may not grow, as on a full disk)
// fails the Record calls it carried; the producer reloads its state from
// the file, so no seq is ever given to two operations, and what Record
// acknowledged is billed exactly.
func TestAFailedCommitNeverReusesASeq(t *testing.T) {
	c := newCluster(t, 1)
	dir := t.TempDir()
	p := newProducer(t, producer.Config{Writer: refuseAll{}, Dir: dir})
	ctx := context.Background()
	acked := 0
	rec := func() error {
		err := p.Record(ctx, "acme", "m", d("1"), time.Now())
		if err == nil {
			acked++
		}
		return err
	}
	if err := rec(); err != nil {
		t.Fatal(err)
	}
	fi, err := os.Stat(filepath.Join(dir, "producer.db"))
	if err != nil {
		t.Fatal(err)
	}
	var lim syscall.Rlimit
	if err := syscall.Getrlimit(syscall.RLIMIT_FSIZE, &lim); err != nil {
		t.Fatal(err)
	}
	low := lim
	low.Cur = uint64(fi.Size())
	if err := syscall.Setrlimit(syscall.RLIMIT_FSIZE, &low); err != nil {
		t.Fatal(err)
	}
	failed := 0
	for range 5000 {
		if err := rec(); err != nil {
			failed++
			if failed == 3 {
				break
			}
		}
	}
	if err := syscall.Setrlimit(syscall.RLIMIT_FSIZE, &lim); err != nil {
		t.Fatal(err)
	}
	if failed == 0 {
		t.Fatal("no commit failed with the file size limited")
	}
	for range 100 {
		if err := rec(); err != nil {
			t.Fatal(err)
		}
	}
	stopNow, cancel := context.WithCancel(ctx)
	cancel()
	_ = p.Stop(stopNow)

	p2 := newProducer(t, producer.Config{Brokers: c.Addrs, Dir: dir})
	fctx, cancelF := context.WithTimeout(ctx, time.Minute)
	defer cancelF()
	if err := p2.Flush(fctx); err != nil {
		t.Fatal(err)
	}
	ops := map[int64]string{}
	var last int64
	var total string
	for _, b := range readBatches(t, c, 1) {
		for _, r := range b.Records {
			if op, seen := ops[r.Seq]; seen && op != r.OperationID.String() {
				t.Fatalf("seq %d was given to operations %s and %s", r.Seq, op, r.OperationID)
			}
			ops[r.Seq] = r.OperationID.String()
			if r.Seq > last {
				last, total = r.Seq, r.Total.String()
			}
		}
	}
	if total != fmt.Sprint(acked) || int(last) != acked || len(ops) != acked {
		t.Errorf("Kafka has %d seqs, last %d with total %s; want exactly the %d acknowledged records (%d failed)", len(ops), last, total, acked, failed)
	}
}

// downUntil is a Kafka that is down until up is set, then w.
type downUntil struct {
	up atomic.Bool
	w  producer.MessageWriter
}

func (k *downUntil) WriteMessages(ctx context.Context, msgs ...kafka.Message) error {
	if !k.up.Load() {
		return refuseAll{}.WriteMessages(ctx, msgs...)
	}
	return k.w.WriteMessages(ctx, msgs...)
}

// A disk filled by the state file itself (Record goes on until its commits
// fail; here the file may not grow) keeps no acknowledged record from
// Kafka once Kafka answers: forming all the waiting records into batches
// in one commit needs more pages than the full file has free, and while
// that commit failed nothing was sent, so nothing was ever deleted and
// the producer stayed stuck for good, Kafka up, until space came from
// elsewhere.
func TestAStateFileThatFilledTheDiskStillDrains(t *testing.T) {
	c := newCluster(t, 1)
	kw := c.Writer(topic)
	t.Cleanup(func() { kw.Close() })
	k := &downUntil{w: kw}
	dir := t.TempDir()
	// A long Linger keeps the records waiting, unformed, as records do
	// while Kafka is down and a backlog is below MaxBatchRecords.
	p := newProducer(t, producer.Config{Writer: k, Dir: dir, Linger: time.Hour})
	ctx := context.Background()
	acked := 0
	if err := p.Record(ctx, "acme", "m", d("1"), time.Now()); err != nil {
		t.Fatal(err)
	}
	acked++
	fi, err := os.Stat(filepath.Join(dir, "producer.db"))
	if err != nil {
		t.Fatal(err)
	}
	var lim syscall.Rlimit
	if err := syscall.Getrlimit(syscall.RLIMIT_FSIZE, &lim); err != nil {
		t.Fatal(err)
	}
	low := lim
	low.Cur = uint64(fi.Size())
	if err := syscall.Setrlimit(syscall.RLIMIT_FSIZE, &low); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := syscall.Setrlimit(syscall.RLIMIT_FSIZE, &lim); err != nil {
			t.Error(err)
		}
	})
	failed := 0
	for range 100_000 {
		if err := p.Record(ctx, "acme", "m", d("1"), time.Now()); err != nil {
			if failed++; failed == 20 {
				break
			}
			continue
		}
		acked++
	}
	if failed == 0 {
		t.Fatal("no commit failed with the file size limited")
	}
	k.up.Store(true) // the disk stays full
	fctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	if err := p.Flush(fctx); err != nil {
		t.Errorf("Kafka up, the disk full: %v", err)
	}
	var total decimal.Decimal
	var last int64
	for _, b := range readBatches(t, c, 1) {
		for _, r := range b.Records {
			if r.Seq > last {
				last, total = r.Seq, r.Total
			}
		}
	}
	if int(last) != acked || !total.Equal(decimal.NewFromInt(int64(acked))) {
		t.Errorf("Kafka has seqs up to %d with total %s; want the %d acknowledged records", last, total, acked)
	}
}
