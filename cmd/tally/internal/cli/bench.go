package cli

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"math"
	"math/rand/v2"
	"net"
	neturl "net/url"
	"os"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/segmentio/kafka-go"
	"github.com/shopspring/decimal"
	"github.com/spf13/cobra"

	"github.com/tally-ledger/tally/cmd/tally/internal/devstack"
	"github.com/tally-ledger/tally/ingest"
	"github.com/tally-ledger/tally/ingest/wire"
	"github.com/tally-ledger/tally/internal/faultproxy"
	"github.com/tally-ledger/tally/internal/pgcpu"
	"github.com/tally-ledger/tally/ledger"
	"github.com/tally-ledger/tally/migrations"
)

func newBenchCmd() *cobra.Command {
	cmd := &cobra.Command{
		Use:   "bench",
		Short: "Measure Tally against the targets of docs/design.md §10",
	}
	cmd.AddCommand(newBenchIngestCmd(), newBenchEnforceCmd(), newBenchFloodCmd(), newBenchFailoverCmd(), newBenchAdmissionCmd(), newBenchChaosCmd())
	return cmd
}

type benchIngestOptions struct {
	records, perMessage, partitions int
	members                         int
	dupShare                        float64
	adminURL                        string
	keep                            bool
	rounds                          int
	cpuProfile                      string
	wal, statements                 bool
	// kind: also ingest gauge or unique records in each round, beside the
	// counters (docs/design.md §16: at least 0.8 × counter ingest).
	kind ledger.MeterKind
	// population: distinct members per customer a unique record names,
	// drawn evenly; the share of readings that are a new member day falls
	// as it shrinks.
	population int
	// customers the records are spread over (0: eight per partition).
	customers int
	// cpu collects CPU per record with --statements.
	cpu cpuPerRecord
	// latency: delay each way on every connection to Postgres;
	// latencyNote says it, with the round trip it makes, in the header.
	latency     time.Duration
	latencyNote string
}

func newBenchIngestCmd() *cobra.Command {
	o := benchIngestOptions{}
	cmd := &cobra.Command{
		Use:   "ingest",
		Short: "Kafka → ledger throughput, exactly once, against the physical limit and a plain COPY",
		Long: `Produce --records records (in messages of --per-message records) to an embedded
broker, ingest them end to end into a fresh database and time it; do the same
with a share of retransmitted (duplicate) messages. Then two baselines in the
same database: the physical one, a binary COPY of the same raw records (operation
id, producer, epoch, customer, meter, seq, total, quantity, occurred_at, batch id)
into a table with one unique index, on the operation id, in committed
transactions of 10,000 rows — the least any durable store that refuses a
duplicate must write; and a COPY of the ledger's own rows into a table with the
columns and indexes of records. Prints records/s for each and the ratios
(docs/design.md §10: ingest ≥ 50% of the physical baseline; duplicates no slower).

"Unique records" are counter records none of which repeats another. With
--kind gauge or unique, each round also ingests the same streams carrying
levels or members (a unique meter's drawn from --population per customer)
into a database where the meter is declared, and prints that rate against
counter ingest (docs/design.md §10: ≥ 0.8 ×).

With --wal (a superuser and the pg_walinspect extension), it also prints the WAL
each measurement wrote per record, by table and index: a figure the machine's
load does not change.

Each run uses a database of its own on the server of --database-url,
dropped afterwards (unless --keep). Each measurement starts just after a
CHECKPOINT (when the role may run one) and a garbage collection of this
process, so that none pays for the dirty buffers or the garbage an earlier
step left behind. The process runs with GODEBUG=madvdontneed=0 (it starts
itself again with it, unless GODEBUG already sets madvdontneed): the memory
its runtime frees between measurements stays mapped, as a tally serve under
steady ingest keeps its heap, instead of being faulted in again by the next
measurement.

With --latency, every connection to Postgres (ingest's and the baselines')
goes through a proxy in this process that delays each chunk of bytes by
that much each way, as a link to a database on another host does: what
each round trip costs when it is not local. Go's timers may round a short
delay up (to about a millisecond on some machines), so the first line
prints what a SELECT 1 through the proxy takes.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if err := keepFreedMemory(); err != nil {
				return err
			}
			return benchIngest(cmd.Context(), cmd.OutOrStdout(), o)
		},
	}
	f := cmd.Flags()
	f.IntVar(&o.records, "records", 200_000, "records per run")
	f.IntVar(&o.perMessage, "per-message", 1000, "records per Kafka message")
	f.IntVar(&o.partitions, "partitions", 4, "partitions of the benchmark topics")
	f.IntVar(&o.members, "members", 1, "ingest members (consumers of one group, in this process) sharing the partitions")
	f.Float64Var(&o.dupShare, "duplicates", 0.3, "share of records that are retransmits in the second run")
	f.StringVar(&o.adminURL, "database-url", defaultDatabaseURL, "Postgres server to create the benchmark databases on")
	envDefault(f, "database-url", "TALLY_DATABASE_URL")
	f.BoolVar(&o.keep, "keep", false, "keep the benchmark databases")
	f.IntVar(&o.rounds, "rounds", 3, "rounds of the three measurements; medians are compared")
	f.StringVar(&o.cpuProfile, "cpuprofile", "", "write a CPU profile of the whole run to this file")
	f.BoolVar(&o.wal, "wal", false, "print the WAL written per record, by table and index (needs a superuser and pg_walinspect)")
	f.IntVar(&o.customers, "customers", 0, "customers the records are spread over, one stream each (0: eight per partition); with --kind unique, fewer customers make larger periods, and a period's members go into the member index once it holds 100,000 readings")
	f.IntVar(&o.population, "population", 100_000, "with --kind unique: distinct members per customer, drawn evenly (the default makes nearly every reading a new member; 1000 repeats most members within the day)")
	f.StringVar((*string)(&o.kind), "kind", "counter", "counter, or gauge or unique: also ingest the same records as levels or members in each round and compare with counters")
	f.DurationVar(&o.latency, "latency", 0, "delay every byte to and from Postgres by this much each way, through a proxy in this process (a database on another host; the first line prints the round trip it makes; 0: connect directly)")
	f.BoolVar(&o.statements, "statements", false, "print where ingest's round trips to Postgres spend their time, statement by statement, and the CPU per record of Postgres and of this process; at the end, ingest's CPU per record against the physical baseline's (their ratio is what the ratio of rates follows on a machine bound by CPU, and the load moves it less)")
	return cmd
}

// keepFreedMemory starts this process again with GODEBUG=madvdontneed=0
// added, unless GODEBUG already sets madvdontneed (the runtime reads it
// only at start). The runtime then gives the pages it frees back lazily
// (MADV_FREE): a machine with memory to spare leaves them mapped, and the
// next measurement reuses them. Without it, each measurement of a few
// seconds faulted in again the heap the one before had grown and given
// back: about 2 µs of this process's CPU per record in
// docs/ingest-breakdown.md's runs (seventh change), which a long-running
// ingest process with a steady heap does not pay.
//
// Not in a test binary, where the command runs in the test's process:
// starting it again would run the tests again.
func keepFreedMemory() error {
	godebug := os.Getenv("GODEBUG")
	if strings.Contains(godebug, "madvdontneed=") || testing.Testing() {
		return nil
	}
	exe, err := os.Executable()
	if err != nil {
		return err
	}
	if godebug != "" {
		godebug += ","
	}
	env := slices.DeleteFunc(os.Environ(), func(kv string) bool { return strings.HasPrefix(kv, "GODEBUG=") })
	return syscall.Exec(exe, os.Args, append(env, "GODEBUG="+godebug+"madvdontneed=0"))
}

func benchIngest(ctx context.Context, out io.Writer, o benchIngestOptions) error {
	if o.records < 1 || o.perMessage < 1 || o.perMessage > wire.MaxRecords || o.partitions < 1 || o.members < 1 || !(o.dupShare >= 0 && o.dupShare < 1) || o.rounds < 1 || o.population < 1 || o.customers < 0 {
		return usageError(errors.New("bench ingest: need --records ≥ 1, 1 ≤ --per-message ≤ 10000, --partitions ≥ 1, --members ≥ 1, 0 ≤ --duplicates < 1, --rounds ≥ 1, --population ≥ 1, --customers ≥ 0"))
	}
	if o.kind == "" {
		o.kind = ledger.Counter
	}
	if !o.kind.Valid() {
		return usageError(fmt.Errorf("bench ingest: --kind %q is not one of counter, gauge, unique", o.kind))
	}
	if o.statements {
		o.cpu = cpuPerRecord{}
	}
	if o.latency > 0 {
		url, stop, err := behindLatency(o.adminURL, o.latency)
		if err != nil {
			return err
		}
		defer stop()
		o.adminURL = url
		rtt, err := selectOneRoundTrip(ctx, withDB(url, "postgres"))
		if err != nil {
			return err
		}
		o.latencyNote = fmt.Sprintf(", Postgres through a proxy adding %s each way (a SELECT 1 through it: %s at the median)",
			o.latency, rtt.Round(10*time.Microsecond))
	}
	log := slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelWarn}))
	stop, err := startCPUProfile(o.cpuProfile)
	if err != nil {
		return err
	}
	defer stop()
	k, err := devstack.StartKafka(devstack.KafkaConfig{Addr: "127.0.0.1:0",
		Topics: []string{"bench.unique", "bench.duplicates", "bench.kind"}, Partitions: int32(o.partitions)})
	if err != nil {
		return err
	}
	defer k.Close()
	fmt.Fprintf(out, "tally bench ingest: %d records per run, %d records per message, %d partitions, %d ingest members, embedded broker %s%s\n",
		o.records, o.perMessage, o.partitions, o.members, k.Addr, o.latencyNote)

	customers := o.customers
	if customers == 0 {
		customers = o.partitions * 8
	}
	uniq := benchMessages(o.records, o.perMessage, customers, 0, 1, ledger.Counter, 0)
	dups := benchMessages(o.records, o.perMessage, customers, o.dupShare, 2, ledger.Counter, 0)
	var kindMsgs []benchMessage
	if o.kind != ledger.Counter {
		kindMsgs = benchMessages(o.records, o.perMessage, customers, 0, 1, o.kind, o.population)
	}
	var tk []time.Duration
	// Rounds alternate the three measurements so that drift in the
	// machine's load hits them alike; the medians are compared.
	var tu, td, tc, tp []time.Duration
	var copied int64
	for round := range o.rounds {
		fmt.Fprintf(out, "round %d of %d\n", round+1, o.rounds)
		// Unique records (a fresh database: every record is new to it).
		r1, db1, err := benchRun(ctx, out, log, k.Addr, "bench.unique", o, uniq, round == 0)
		if db1 != "" && !o.keep {
			defer dropBenchDB(o.adminURL, db1)
		}
		if err != nil {
			return err
		}
		// The same number of records, a share of them retransmits.
		r2, db2, err := benchRun(ctx, out, log, k.Addr, "bench.duplicates", o, dups, round == 0)
		if db2 != "" && !o.keep {
			defer dropBenchDB(o.adminURL, db2)
		}
		if err != nil {
			return err
		}
		// Baseline: COPY the unique run's rows into a records-shaped table.
		r3, n, err := benchCopy(ctx, withDB(o.adminURL, db1))
		if err != nil {
			return err
		}
		fmt.Fprintf(out, "  %-34s %8d rows    in %7.2fs = %9.0f rows/s\n", "COPY into a records-shaped table", n, r3.Seconds(), float64(n)/r3.Seconds())
		// The physical baseline: the raw records, one unique index. Its rows
		// are built here and dropped after (see physicalRows).
		physical, err := physicalRows(uniq, o.records)
		if err != nil {
			return err
		}
		r4, err := benchPhysical(ctx, out, withDB(o.adminURL, db1), physical, o.wal, o.cpu)
		if err != nil {
			return err
		}
		fmt.Fprintf(out, "  %-34s %8d rows    in %7.2fs = %9.0f rows/s\n", "physical: raw records, one index", len(physical), r4.Seconds(), float64(len(physical))/r4.Seconds())
		tu, td, tc, tp, copied = append(tu, r1), append(td, r2), append(tc, r3), append(tp, r4), n
		if kindMsgs != nil {
			r5, db5, err := benchRun(ctx, out, log, k.Addr, "bench.kind", o, kindMsgs, round == 0)
			if db5 != "" && !o.keep {
				defer dropBenchDB(o.adminURL, db5)
			}
			if err != nil {
				return err
			}
			tk = append(tk, r5)
		}
	}
	uRate, dRate, cRate := float64(o.records)/median(tu).Seconds(), float64(o.records)/median(td).Seconds(), float64(copied)/median(tc).Seconds()
	pRate := float64(o.records) / median(tp).Seconds() // uniq repeats no record: one row each
	fmt.Fprintf(out, "\nmedians of %d rounds:\n", o.rounds)
	fmt.Fprintf(out, "  ingest, unique records     %9.0f records/s\n", uRate)
	fmt.Fprintf(out, "  ingest, with duplicates    %9.0f records/s\n", dRate)
	fmt.Fprintf(out, "  physical baseline          %9.0f rows/s   (raw records, one unique index, 10,000-row transactions)\n", pRate)
	fmt.Fprintf(out, "  COPY, same rows and table  %9.0f rows/s\n", cRate)
	fmt.Fprintf(out, "  ingest unique / physical   = %.2f   (target ≥ 0.50)\n", uRate/pRate)
	fmt.Fprintf(out, "  ingest unique / COPY       = %.2f   (own table: what the ledger's rows cost)\n", uRate/cRate)
	fmt.Fprintf(out, "  ingest duplicates / unique = %.2f   (target ≥ 1.00)\n", dRate/uRate)
	if u, p := o.cpu["ingest, unique records"], o.cpu["physical baseline"]; len(u) > 0 && len(p) > 0 {
		// On a machine bound by CPU the ratio of the rates follows the
		// ratio of CPU per record, which the machine's load moves less.
		fmt.Fprintf(out, "  CPU per record: ingest %.1f µs, physical baseline %.1f µs = %.2f   (Postgres and this process together)\n",
			median(u), median(p), median(p)/median(u))
	}
	if tk != nil {
		kRate := float64(o.records) / median(tk).Seconds()
		fmt.Fprintf(out, "  ingest, %s-meter readings  %9.0f readings/s\n", o.kind, kRate)
		fmt.Fprintf(out, "  ingest %s-meter / counter  = %.2f   (target ≥ 0.80)\n", o.kind, kRate/uRate)
	}
	return nil
}

func median[T cmp.Ordered](xs []T) T {
	s := slices.Clone(xs)
	slices.Sort(s)
	return s[len(s)/2]
}

// benchMessage is one encoded message and its record count.
type benchMessage struct {
	key, value []byte
	records    int
	kind       ledger.MeterKind // of its records
}

// msgsKind is the kind of a run's records.
func msgsKind(msgs []benchMessage) ledger.MeterKind {
	if len(msgs) == 0 || msgs[0].kind == "" {
		return ledger.Counter
	}
	return msgs[0].kind
}

// benchMessages builds messages with total records: (1-dup) of them new,
// the rest retransmits of earlier messages placed at random later positions.
func benchMessages(total, perMessage, customers int, dup float64, seed uint64, kind ledger.MeterKind, population int) []benchMessage {
	rng := rand.New(rand.NewPCG(seed, 42))
	type stream struct {
		customer string
		seq      int64
		total    decimal.Decimal
	}
	streams := make([]*stream, customers)
	for i := range streams {
		streams[i] = &stream{customer: fmt.Sprintf("bench-%03d", i)}
	}
	now := time.Now().UTC().Add(-time.Minute)
	newMsg := func(n int) benchMessage {
		s := streams[rng.IntN(len(streams))]
		b := wire.Batch{Schema: wire.Schema, BatchID: uuid.Must(uuid.NewV7()), Producer: "bench", Epoch: 1, SentAt: now}
		for range n {
			s.seq++
			q := decimal.New(rng.Int64N(1_000_000), -3)
			s.total = s.total.Add(q)
			r := wire.Record{OperationID: uuid.Must(uuid.NewV7()), Customer: s.customer,
				Meter: "api_calls", Seq: s.seq, Total: s.total, Quantity: decimal.NewNullDecimal(q), OccurredAt: now}
			switch kind { // the same streams, carrying levels or members instead
			case ledger.Gauge:
				r.Total, r.Quantity, r.Level = decimal.Decimal{}, decimal.NullDecimal{}, decimal.NewNullDecimal(q)
			case ledger.Unique:
				r.Total, r.Quantity, r.Member = decimal.Decimal{}, decimal.NullDecimal{}, fmt.Sprintf("user-%d", rng.IntN(population))
			}
			b.Records = append(b.Records, r)
		}
		v, err := wire.Encode(b)
		if err != nil {
			panic(err) // the generator only builds valid batches
		}
		return benchMessage{key: []byte(s.customer), value: v, records: n, kind: kind}
	}
	nMsgs := (total + perMessage - 1) / perMessage
	nDup := int(math.Round(float64(nMsgs) * dup))
	originals := make([]benchMessage, 0, nMsgs-nDup)
	for left := total; len(originals) < nMsgs-nDup; left -= perMessage {
		originals = append(originals, newMsg(min(perMessage, left)))
	}
	// A retransmit comes after its original, at a random later position.
	after := make([][]benchMessage, len(originals))
	for range nDup {
		i := rng.IntN(len(originals))
		j := i + rng.IntN(len(originals)-i)
		after[j] = append(after[j], originals[i])
	}
	msgs := make([]benchMessage, 0, nMsgs)
	for i, m := range originals {
		msgs = append(msgs, m)
		msgs = append(msgs, after[i]...)
	}
	return msgs
}

// benchRun produces msgs to topic, ingests them into a fresh database and
// returns the ingest time (from the consumer owning its partitions to the
// last offset stored) and the database name.
func benchRun(ctx context.Context, out io.Writer, log *slog.Logger, broker, topic string, o benchIngestOptions, msgs []benchMessage, produce bool) (time.Duration, string, error) {
	records, dupRecords := 0, 0
	seen := map[string]bool{}
	kmsgs := make([]kafka.Message, len(msgs))
	for i, m := range msgs {
		records += m.records
		if seen[string(m.value)] {
			dupRecords += m.records
		}
		seen[string(m.value)] = true
		kmsgs[i] = kafka.Message{Key: m.key, Value: m.value}
	}
	// "unique records" are counter records none of which repeats another;
	// a unique meter's readings are named after the meter's kind.
	label := "ingest, unique records"
	if kind := msgsKind(msgs); kind != ledger.Counter {
		label = "ingest, " + string(kind) + "-meter readings"
	}
	if dupRecords > 0 {
		label = fmt.Sprintf("ingest, %.0f%% duplicates", 100*float64(dupRecords)/float64(records))
	}

	var produced time.Duration
	if produce {
		tr := &kafka.Transport{}
		defer tr.CloseIdleConnections()
		w := &kafka.Writer{Addr: kafka.TCP(broker), Topic: topic, Transport: tr, Balancer: &kafka.Murmur2Balancer{},
			RequiredAcks: kafka.RequireAll, BatchTimeout: 5 * time.Millisecond, BatchSize: 100, BatchBytes: 3 << 20}
		t0 := time.Now()
		err := w.WriteMessages(ctx, kmsgs...)
		if cerr := w.Close(); err == nil {
			err = cerr
		}
		if err != nil {
			return 0, "", fmt.Errorf("produce: %w", err)
		}
		produced = time.Since(t0)
	}

	name := "tally_bench_" + strings.ReplaceAll(uuid.NewString(), "-", "")[:12]
	if err := createBenchDB(ctx, o.adminURL, name); err != nil {
		return 0, "", err
	}
	pcfg, err := pgxpool.ParseConfig(withDB(o.adminURL, name))
	if err != nil {
		return 0, name, err
	}
	trace := newStmtTrace()
	pool, err := pgxpool.NewWithConfig(ctx, pcfg)
	if err != nil {
		return 0, name, err
	}
	defer pool.Close()
	if _, err := migrations.Up(ctx, pool, log); err != nil {
		return 0, name, err
	}
	if kind := msgsKind(msgs); kind != ledger.Counter {
		if err := pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
			_, err := ledger.DeclareMeter(ctx, tx, ledger.Meter{Meter: "api_calls", Kind: kind}, time.Now())
			return err
		}); err != nil {
			return 0, name, err
		}
	}
	// Ingest has a pool of its own, named (its backends' CPU is counted)
	// and, with --statements, traced; the benchmark's own queries are not.
	pcfg.ConnConfig.RuntimeParams["application_name"] = benchIngestApp
	if o.statements {
		pcfg.ConnConfig.Tracer = trace
	}
	ingestPool, err := pgxpool.NewWithConfig(ctx, pcfg)
	if err != nil {
		return 0, name, err
	}
	defer ingestPool.Close()
	if err := settle(ctx, pool); err != nil {
		return 0, name, err
	}
	cpu0 := pgcpu.Process()
	var wal *walWatch
	if o.wal {
		if wal, err = startWAL(ctx, withDB(o.adminURL, name)); err != nil {
			return 0, name, err
		}
		defer wal.stop()
	}
	l, err := ledger.New(ledger.Config{Logger: log})
	if err != nil {
		return 0, name, err
	}
	// --members consumers share one group, as separate tally serve
	// processes would; each has its own registry (their metrics would
	// collide in one).
	cctx, cancel := context.WithCancel(ctx)
	done := make(chan error, o.members)
	for range o.members {
		c, err := ingest.NewConsumer(ingest.Config{Brokers: []string{broker}, Topic: topic, Group: "bench-" + name,
			Pool: ingestPool, Ledger: l, Logger: log, Registry: prometheus.NewRegistry()})
		if err != nil {
			cancel()
			return 0, name, err
		}
		go func() { done <- c.Run(cctx) }()
	}
	stop := func() error {
		cancel()
		var err error
		for range o.members {
			err = errors.Join(err, <-done)
		}
		return err
	}

	// The clock starts once every partition has committed a micro-batch
	// and the group has settled on as many members as can own a partition
	// (joins rebalance the group); what was ingested before that is left
	// out of the rate.
	want := min(o.members, o.partitions)
	var start time.Time
	var nextAtStart int64
	for {
		var parts, owners int
		var next int64
		if err := pool.QueryRow(ctx, `SELECT (SELECT count(*) FROM ingest_partitions WHERE topic = $1),
			(SELECT coalesce(sum(next_offset), 0) FROM ingest_partitions WHERE topic = $1),
			(SELECT count(DISTINCT o.member) `+liveOwners+`)`,
			topic).Scan(&parts, &next, &owners); err != nil {
			_ = stop()
			return 0, name, err
		}
		if start.IsZero() && parts == o.partitions && owners >= want {
			start, nextAtStart = time.Now(), next
		}
		if next == int64(len(msgs)) {
			cpu := pgcpu.Process() - cpu0
			pg, nb, ok := pgcpu.Database(ctx, pool, benchIngestApp)
			defer func() {
				if o.statements {
					printCPU(out, label, len(msgs)*o.perMessage, cpu, pg, nb, ok, o.cpu)
				}
			}()
			break
		}
		select {
		case <-ctx.Done():
			_ = stop()
			return 0, name, ctx.Err()
		case <-time.After(5 * time.Millisecond):
		}
	}
	took := time.Since(start)
	if start.IsZero() || nextAtStart >= int64(len(msgs)) {
		return 0, name, fmt.Errorf("%s: everything was ingested before the group settled; use more --records", label)
	}
	// Scale to the whole run at the rate measured after the start.
	took = time.Duration(float64(took) * float64(len(msgs)) / float64(int64(len(msgs))-nextAtStart))
	if err := stop(); err != nil {
		return 0, name, err
	}
	st, err := ingest.Status(ctx, pool, topic)
	if err != nil {
		return 0, name, err
	}
	var applied, dup int64
	for _, p := range st {
		applied += p.Counters.Applied
		dup += p.Counters.Duplicate
	}
	if applied != int64(records-dupRecords) || dup != int64(dupRecords) {
		return 0, name, fmt.Errorf("%s: applied %d duplicate %d, want %d and %d", label, applied, dup, records-dupRecords, dupRecords)
	}
	fmt.Fprintf(out, "  %-34s %8d records in %7.2fs = %9.0f records/s   (%d messages; applied %d, duplicate %d%s)\n",
		label, records, took.Seconds(), float64(records)/took.Seconds(), len(msgs), applied, dup, producedNote(produced))
	if o.wal {
		if err := wal.report(ctx, out, label, records); err != nil {
			return 0, name, err
		}
	}
	if o.statements {
		trace.report(out, label, records, took)
	}
	return took, name, nil
}

// benchCopy copies the records of the database at url into a table with the
// same columns and indexes and returns how long the COPY took. The rows go
// as Postgres itself wrote them out (binary COPY into a file before the
// clock starts): the baseline spends nothing on encoding them, and holds
// none of them in this process's heap.
func benchCopy(ctx context.Context, url string) (time.Duration, int64, error) {
	conn, err := pgx.Connect(ctx, url)
	if err != nil {
		return 0, 0, err
	}
	defer conn.Close(context.WithoutCancel(ctx))
	if _, err := conn.Exec(ctx, "CREATE TABLE bench_records_copy (LIKE records INCLUDING ALL)"); err != nil {
		return 0, 0, err
	}
	rows, err := os.CreateTemp("", "tally-bench-records-")
	if err != nil {
		return 0, 0, err
	}
	defer os.Remove(rows.Name())
	defer rows.Close()
	if _, err := conn.PgConn().CopyTo(ctx, rows, "COPY records TO STDOUT (FORMAT binary)"); err != nil {
		return 0, 0, err
	}
	if _, err := rows.Seek(0, io.SeekStart); err != nil {
		return 0, 0, err
	}
	if err := settle(ctx, conn); err != nil {
		return 0, 0, err
	}
	t0 := time.Now()
	tag, err := conn.PgConn().CopyFrom(ctx, rows, "COPY bench_records_copy FROM STDIN (FORMAT binary)")
	if err != nil {
		return 0, 0, fmt.Errorf("copy: %w", err)
	}
	return time.Since(t0), tag.RowsAffected(), nil
}

func producedNote(d time.Duration) string {
	if d == 0 {
		return ""
	}
	return fmt.Sprintf("; produced in %.2fs", d.Seconds())
}

// behindLatency starts a proxy in front of the Postgres server of dbURL
// that delays every chunk by d each way, and returns dbURL through it.
func behindLatency(dbURL string, d time.Duration) (string, func(), error) {
	parsed, err := neturl.Parse(dbURL)
	if err != nil || parsed.Host == "" {
		return "", nil, fmt.Errorf("bench ingest: --latency needs a database URL with a TCP host:port, not %s", maskSecrets(dbURL))
	}
	host := parsed.Host
	if parsed.Port() == "" {
		host = net.JoinHostPort(parsed.Hostname(), "5432")
	}
	p, err := faultproxy.Start(host)
	if err != nil {
		return "", nil, err
	}
	p.Latency(d)
	parsed.Host = p.Addr()
	return parsed.String(), func() { _ = p.Close() }, nil
}

// selectOneRoundTrip is the median of 21 SELECT 1 round trips on one
// connection to dbURL.
func selectOneRoundTrip(ctx context.Context, dbURL string) (time.Duration, error) {
	c, err := pgx.Connect(ctx, dbURL)
	if err != nil {
		return 0, fmt.Errorf("database: %w", err)
	}
	defer c.Close(context.WithoutCancel(ctx))
	took := make([]time.Duration, 21)
	for i := range took {
		t0 := time.Now()
		if _, err := c.Exec(ctx, "SELECT 1"); err != nil {
			return 0, fmt.Errorf("database: %w", err)
		}
		took[i] = time.Since(t0)
	}
	slices.Sort(took)
	return took[len(took)/2], nil
}

func withDB(u, name string) string {
	parsed, err := neturl.Parse(u)
	if err != nil {
		return u
	}
	parsed.Path = "/" + name
	return parsed.String()
}

// benchDB creates a fresh database named prefix_<random>, migrates it and
// opens a pool on it; done closes the pool and, unless keep, drops the
// database.
func benchDB(ctx context.Context, adminURL, prefix string, keep bool, log *slog.Logger) (pool *pgxpool.Pool, dbURL string, done func(), err error) {
	name := prefix + "_" + strings.ReplaceAll(uuid.NewString(), "-", "")[:12]
	if err := createBenchDB(ctx, adminURL, name); err != nil {
		return nil, "", nil, err
	}
	drop := func() {
		if !keep {
			dropBenchDB(adminURL, name)
		}
	}
	dbURL = withDB(adminURL, name)
	if pool, err = pgxpool.New(ctx, dbURL); err != nil {
		drop()
		return nil, "", nil, err
	}
	if _, err := migrations.Up(ctx, pool, log); err != nil {
		pool.Close()
		drop()
		return nil, "", nil, err
	}
	return pool, dbURL, func() { pool.Close(); drop() }, nil
}

// createBenchDB and dropBenchDB work through the server's maintenance
// database, so --database-url may name a database that does not exist yet.
func createBenchDB(ctx context.Context, admin, name string) error {
	c, err := pgx.Connect(ctx, withDB(admin, "postgres"))
	if err != nil {
		return fmt.Errorf("database: %w", err)
	}
	defer c.Close(context.WithoutCancel(ctx))
	if _, err := c.Exec(ctx, "CREATE DATABASE "+pgx.Identifier{name}.Sanitize()); err != nil {
		return fmt.Errorf("create benchmark database: %w", err)
	}
	return nil
}

func dropBenchDB(admin, name string) {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	c, err := pgx.Connect(ctx, withDB(admin, "postgres"))
	if err != nil {
		fmt.Fprintf(os.Stderr, "tally bench: cannot drop %s: %v\n", name, err)
		return
	}
	defer c.Close(ctx)
	if _, err := c.Exec(ctx, "DROP DATABASE IF EXISTS "+pgx.Identifier{name}.Sanitize()+" WITH (FORCE)"); err != nil {
		fmt.Fprintf(os.Stderr, "tally bench: cannot drop %s: %v\n", name, err)
	}
}

// dbName is the database a URL names.
func dbName(u string) string {
	if parsed, err := neturl.Parse(u); err == nil {
		return strings.TrimPrefix(parsed.Path, "/")
	}
	return u
}
