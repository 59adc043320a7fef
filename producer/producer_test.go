package producer_test

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/segmentio/kafka-go"
	"github.com/shopspring/decimal"
	"go.uber.org/goleak"

	"github.com/tally-ledger/tally/ingest/wire"
	"github.com/tally-ledger/tally/internal/kafkatest"
	"github.com/tally-ledger/tally/producer"
)

func TestMain(m *testing.M) {
	if os.Getenv(childEnv) != "" {
		os.Exit(childMain())
	}
	goleak.VerifyTestMain(m)
}

const topic = "tally.meter-batches"

func d(s string) decimal.Decimal { return decimal.RequireFromString(s) }

func newCluster(t *testing.T, partitions int32) *kafkatest.Cluster {
	return kafkatest.New(t, kafkatest.Options{Topics: []kafkatest.Topic{{Name: topic, Partitions: partitions}}})
}

func kafkatestCluster(b *testing.B) *kafkatest.Cluster {
	return kafkatest.New(b, kafkatest.Options{Topics: []kafkatest.Topic{{Name: topic, Partitions: 4}}})
}

func newProducer(t *testing.T, cfg producer.Config) *producer.Producer {
	t.Helper()
	if cfg.Topic == "" {
		cfg.Topic = topic
	}
	if cfg.Producer == "" {
		cfg.Producer = "gw-1"
	}
	if cfg.Linger == 0 {
		cfg.Linger = 10 * time.Millisecond
	}
	if cfg.RetryMin == 0 {
		cfg.RetryMin, cfg.RetryMax = 10*time.Millisecond, 200*time.Millisecond
	}
	p, err := producer.New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithCancel(context.Background())
		cancel()
		_ = p.Stop(ctx)
	})
	return p
}

// readBatches reads every message of topic and decodes it.
func readBatches(t *testing.T, c *kafkatest.Cluster, partitions int) []wire.Batch {
	t.Helper()
	var out []wire.Batch
	for part := range partitions {
		hw := c.HighWatermark(t, topic, part)
		if hw == 0 {
			continue
		}
		r := kafka.NewReader(kafka.ReaderConfig{Brokers: c.Addrs, Topic: topic, Partition: part, MaxWait: 500 * time.Millisecond})
		// Generous: a backlog test reads 100,000 records under -race on a
		// loaded machine.
		ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
		for {
			m, err := r.FetchMessage(ctx)
			if err != nil {
				t.Fatal(err)
			}
			b, _, rejected, err := wire.Decode(m.Key, m.Value)
			if err != nil || len(rejected) > 0 {
				t.Fatalf("message at %d/%d does not decode: %v %v", part, m.Offset, err, rejected)
			}
			out = append(out, b)
			if m.Offset+1 >= hw {
				break
			}
		}
		cancel()
		r.Close()
	}
	return out
}

func TestRecordsReachKafkaWithSeqTotalsAndFinals(t *testing.T) {
	c := newCluster(t, 2)
	dir := t.TempDir()
	p := newProducer(t, producer.Config{Brokers: c.Addrs, Dir: dir})
	ctx := context.Background()
	at := time.Date(2026, 12, 2, 9, 0, 0, 0, time.UTC)
	for _, u := range []struct{ c, m, q string }{
		{"acme", "api_calls", "3"}, {"acme", "api_calls", "1.5"}, {"globex", "gb", "0.000000001"}, {"acme", "api_calls", "2"},
	} {
		if err := p.Record(ctx, u.c, u.m, d(u.q), at); err != nil {
			t.Fatal(err)
		}
	}
	epoch := p.Epoch()
	if err := p.Close(ctx); err != nil {
		t.Fatal(err)
	}
	type rec struct {
		seq          int64
		total, q     string
		final        bool
		epoch        int64
		customerKeys string
	}
	got := map[string][]rec{}
	for _, b := range readBatches(t, c, 2) {
		if b.Producer != "gw-1" {
			t.Errorf("producer %q", b.Producer)
		}
		for _, r := range b.Records {
			got[r.Customer+"/"+r.Meter] = append(got[r.Customer+"/"+r.Meter], rec{seq: r.Seq, total: r.Total.String(), q: r.Quantity.Decimal.String(), final: r.Final, epoch: b.Epoch})
		}
	}
	want := map[string][]rec{
		"acme/api_calls": {{1, "3", "3", false, epoch, ""}, {2, "4.5", "1.5", false, epoch, ""}, {3, "6.5", "2", false, epoch, ""}, {4, "6.5", "0", true, epoch, ""}},
		"globex/gb":      {{1, "0.000000001", "0.000000001", false, epoch, ""}, {2, "0.000000001", "0", true, epoch, ""}},
	}
	for k, w := range want {
		g := got[k]
		if len(g) != len(w) {
			t.Fatalf("%s: got %+v, want %+v", k, g, w)
		}
		for i := range w {
			if g[i] != w[i] {
				t.Errorf("%s[%d]: got %+v, want %+v", k, i, g[i], w[i])
			}
		}
	}

	// Close ended the epoch: the next producer on Dir starts a new one.
	p2 := newProducer(t, producer.Config{Brokers: c.Addrs, Dir: dir})
	if p2.Epoch() <= epoch {
		t.Errorf("epoch after Close: %d, want > %d", p2.Epoch(), epoch)
	}
}

func TestRestartContinuesTheEpochAndSendsWhatWasBuffered(t *testing.T) {
	dir := t.TempDir()
	ctx := context.Background()
	// No broker listens: everything stays on disk.
	down := []string{"127.0.0.1:1"}
	p := newProducer(t, producer.Config{Brokers: down, Dir: dir, WriteTimeout: 200 * time.Millisecond})
	at := time.Now().Add(-time.Minute)
	for range 5 {
		if err := p.Record(ctx, "acme", "api_calls", d("2"), at); err != nil {
			t.Fatal(err)
		}
	}
	epoch := p.Epoch()
	stopNow, cancel := context.WithCancel(ctx)
	cancel()
	if err := p.Stop(stopNow); err != nil {
		t.Fatal(err)
	}

	c := newCluster(t, 1)
	p2 := newProducer(t, producer.Config{Brokers: c.Addrs, Dir: dir})
	if p2.Epoch() != epoch {
		t.Fatalf("epoch after restart %d, want %d (the state survived)", p2.Epoch(), epoch)
	}
	if p2.Buffered() != 5 {
		t.Errorf("buffered after restart %d, want 5", p2.Buffered())
	}
	if err := p2.Record(ctx, "acme", "api_calls", d("1"), at); err != nil {
		t.Fatal(err)
	}
	fctx, fcancel := context.WithTimeout(ctx, 20*time.Second)
	defer fcancel()
	if err := p2.Flush(fctx); err != nil {
		t.Fatal(err)
	}
	var seqs []int64
	var last decimal.Decimal
	for _, b := range readBatches(t, c, 1) {
		for _, r := range b.Records {
			seqs = append(seqs, r.Seq)
			last = r.Total
		}
	}
	if len(seqs) != 6 || seqs[5] != 6 || last.String() != "11" {
		t.Errorf("after restart got seqs %v, last total %s; want 1..6 and 11", seqs, last)
	}
}

// TestStopWithATimeoutEndsDuringAnOutage checks what docs/producers.md
// says of a Stop bounded by a timeout while Kafka is down: it returns when
// its context ends, with an error that wraps context.DeadlineExceeded, and
// the records stay on disk for the next producer on Dir.
func TestStopWithATimeoutEndsDuringAnOutage(t *testing.T) {
	dir := t.TempDir()
	ctx := context.Background()
	down := []string{"127.0.0.1:1"}
	p := newProducer(t, producer.Config{Brokers: down, Dir: dir, WriteTimeout: 200 * time.Millisecond})
	for range 3 {
		if err := p.Record(ctx, "acme", "api_calls", d("1"), time.Now()); err != nil {
			t.Fatal(err)
		}
	}
	stopCtx, cancel := context.WithTimeout(ctx, 500*time.Millisecond)
	defer cancel()
	start := time.Now()
	err := p.Stop(stopCtx)
	if took := time.Since(start); took > 5*time.Second {
		t.Errorf("Stop took %s with a 500ms context", took)
	}
	if !errors.Is(err, context.DeadlineExceeded) || !strings.Contains(err.Error(), "3 records still buffered on disk") {
		t.Errorf("Stop during an outage: %v, want context.DeadlineExceeded and the records still buffered", err)
	}
	p2 := newProducer(t, producer.Config{Brokers: down, Dir: dir, WriteTimeout: 200 * time.Millisecond})
	if p2.Buffered() != 3 {
		t.Errorf("buffered after restart %d, want 3", p2.Buffered())
	}
}

func TestUnreadableStateStartsANewEpoch(t *testing.T) {
	c := newCluster(t, 1)
	dir := t.TempDir()
	ctx := context.Background()
	p := newProducer(t, producer.Config{Brokers: c.Addrs, Dir: dir})
	if err := p.Record(ctx, "acme", "m", d("1"), time.Now()); err != nil {
		t.Fatal(err)
	}
	epoch := p.Epoch()
	if err := p.Stop(ctx); err != nil {
		t.Fatal(err)
	}
	path := filepath.Join(dir, "producer.db")
	if err := os.WriteFile(path, []byte(strings.Repeat("garbage!", 4096)), 0o600); err != nil {
		t.Fatal(err)
	}
	p2 := newProducer(t, producer.Config{Brokers: c.Addrs, Dir: dir})
	if p2.Epoch() <= epoch {
		t.Fatalf("epoch %d after losing the state, want > %d", p2.Epoch(), epoch)
	}
	moved, _ := filepath.Glob(path + ".unreadable-*")
	if len(moved) != 1 {
		t.Errorf("unreadable state not kept aside: %v", moved)
	}

	// A wiped directory also never reuses an epoch.
	stopNow, cancel := context.WithCancel(ctx)
	cancel()
	_ = p2.Stop(stopNow)
	if err := os.RemoveAll(dir); err != nil {
		t.Fatal(err)
	}
	p3 := newProducer(t, producer.Config{Brokers: c.Addrs, Dir: dir})
	if p3.Epoch() <= p2.Epoch() {
		t.Fatalf("epoch %d after wiping the state, want > %d", p3.Epoch(), p2.Epoch())
	}
}

func TestFullBufferErrorsOrBlocksNeverDrops(t *testing.T) {
	ctx := context.Background()
	down := []string{"127.0.0.1:1"}
	reg := prometheus.NewRegistry()
	p := newProducer(t, producer.Config{Brokers: down, Dir: t.TempDir(), MaxBuffered: 3, WriteTimeout: 100 * time.Millisecond, Registerer: reg})
	for range 3 {
		if err := p.Record(ctx, "acme", "m", d("1"), time.Now()); err != nil {
			t.Fatal(err)
		}
	}
	if err := p.Record(ctx, "acme", "m", d("1"), time.Now()); !errors.Is(err, producer.ErrBufferFull) {
		t.Fatalf("4th record into a buffer of 3: %v, want ErrBufferFull", err)
	}
	if got := gauge(t, reg, "tally_producer_buffered_records"); got != 3 {
		t.Errorf("buffered gauge %v, want 3", got)
	}

	pb := newProducer(t, producer.Config{Brokers: down, Producer: "gw-2", Dir: t.TempDir(), MaxBuffered: 1, BlockWhenFull: true, WriteTimeout: 100 * time.Millisecond})
	if err := pb.Record(ctx, "acme", "m", d("1"), time.Now()); err != nil {
		t.Fatal(err)
	}
	tctx, cancel := context.WithTimeout(ctx, 300*time.Millisecond)
	defer cancel()
	start := time.Now()
	if err := pb.Record(tctx, "acme", "m", d("1"), time.Now()); !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("blocked record: %v, want context.DeadlineExceeded", err)
	}
	if time.Since(start) < 250*time.Millisecond {
		t.Errorf("record returned after %v; it should have blocked", time.Since(start))
	}
	if pb.Buffered() != 1 {
		t.Errorf("buffered %d, want 1: the refused record must not be stored", pb.Buffered())
	}

	// Close while a Record waits for room: the Record gets ErrClosed, and
	// Close gives up when its ctx ends (Kafka is still down).
	blocked := make(chan error, 1)
	go func() { blocked <- pb.Record(ctx, "acme", "m", d("1"), time.Now()) }()
	time.Sleep(50 * time.Millisecond)
	cctx, ccancel := context.WithTimeout(ctx, 300*time.Millisecond)
	defer ccancel()
	if err := pb.Close(cctx); !errors.Is(err, context.DeadlineExceeded) {
		t.Errorf("Close with Kafka down: %v, want context.DeadlineExceeded", err)
	}
	if err := <-blocked; !errors.Is(err, producer.ErrClosed) {
		t.Errorf("Record blocked during Close: %v, want ErrClosed", err)
	}
}

// gauge reads one gauge of reg (the sum over its label values).
func gauge(t *testing.T, reg *prometheus.Registry, name string) float64 {
	t.Helper()
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	var v float64
	for _, mf := range mfs {
		if mf.GetName() == name {
			for _, m := range mf.GetMetric() {
				v += m.GetGauge().GetValue()
			}
		}
	}
	return v
}

func TestRecordRefusesBadUsage(t *testing.T) {
	p := newProducer(t, producer.Config{Brokers: []string{"127.0.0.1:1"}, Dir: t.TempDir()})
	ctx := context.Background()
	now := time.Now()
	for _, tc := range []struct {
		name, customer, meter, q string
		at                       time.Time
		want                     string
	}{
		{"negative", "acme", "m", "-1", now, "negative"},
		{"too precise", "acme", "m", "0.0000000001", now, "quantity"},
		{"bad customer", "ac me", "m", "1", now, "customer"},
		{"empty meter", "acme", "", "1", now, "meter"},
		{"future", "acme", "m", "1", now.Add(time.Hour), "future"},
		{"zero time", "acme", "m", "1", time.Time{}, "zero time"},
	} {
		err := p.Record(ctx, tc.customer, tc.meter, d(tc.q), tc.at)
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%s: got %v, want an error mentioning %q", tc.name, err, tc.want)
		}
	}
	if p.Buffered() != 0 {
		t.Errorf("refused usage was stored: buffered %d", p.Buffered())
	}
}

func TestConfigValidateReportsEverything(t *testing.T) {
	err := producer.Config{MaxBatchBytes: 2 << 20, MaxBatchRecords: 20000, Linger: -1}.Validate()
	if err == nil {
		t.Fatal("no error")
	}
	for _, want := range []string{"Brokers", "Producer", "Dir", "MaxBatchBytes", "MaxBatchRecords", "Linger"} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("error does not mention %s: %v", want, err)
		}
	}
}

func TestOneDirOneProducer(t *testing.T) {
	dir := t.TempDir()
	newProducer(t, producer.Config{Brokers: []string{"127.0.0.1:1"}, Dir: dir})
	_, err := producer.New(producer.Config{Brokers: []string{"127.0.0.1:1"}, Producer: "gw-1", Dir: dir})
	if err == nil || !strings.Contains(err.Error(), "in use") {
		t.Fatalf("second producer on one dir: %v, want an error saying it is in use", err)
	}
}

func TestConfigRefusesAControlCharacterInTheProducerID(t *testing.T) {
	err := producer.Config{Brokers: []string{"k:9092"}, Producer: "gw\x01", Dir: "x"}.Validate()
	if err == nil || !strings.Contains(err.Error(), "control character") {
		t.Fatalf("got %v, want an error about the control character", err)
	}
}

// tally_producer_records_total counts the Record calls made durable (not
// a repeated key's, nor Close's final records), and
// tally_producer_batches_sent_total the messages Kafka acknowledged, as
// docs/producers.md says.
func TestRecordAndBatchCounters(t *testing.T) {
	c := newCluster(t, 2)
	reg := prometheus.NewRegistry()
	p := newProducer(t, producer.Config{Brokers: c.Addrs, Dir: t.TempDir(), Registerer: reg})
	ctx := context.Background()
	at := time.Now().Add(-time.Minute)
	for _, u := range []struct{ customer, key string }{{"acme", "a"}, {"acme", "b"}, {"globex", "c"}, {"acme", "a"}} {
		if err := p.Record(ctx, u.customer, "api_calls", d("1"), at, producer.Key(u.key)); err != nil {
			t.Fatal(err)
		}
	}
	if err := p.Flush(ctx); err != nil {
		t.Fatal(err)
	}
	if n := counter(t, reg, "tally_producer_records_total"); n != 3 {
		t.Errorf("tally_producer_records_total = %v, want 3 (the repeated key records nothing)", n)
	}
	got := len(readBatches(t, c, 2))
	// Counted just after the batches leave the disk, which Flush waits
	// for: the count may follow Flush's return by an instant.
	sent := counter(t, reg, "tally_producer_batches_sent_total")
	for deadline := time.Now().Add(10 * time.Second); sent != float64(got) && time.Now().Before(deadline); time.Sleep(10 * time.Millisecond) {
		sent = counter(t, reg, "tally_producer_batches_sent_total")
	}
	if sent != float64(got) || got < 2 {
		t.Errorf("tally_producer_batches_sent_total = %v, Kafka holds %d messages (one per customer at least)", sent, got)
	}
}
