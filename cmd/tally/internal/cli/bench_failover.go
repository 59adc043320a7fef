package cli

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"math"
	"math/rand/v2"
	"os"
	"os/exec"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/segmentio/kafka-go"
	"github.com/shopspring/decimal"
	"github.com/spf13/cobra"

	"github.com/tally-ledger/tally/cmd/tally/internal/devstack"
	"github.com/tally-ledger/tally/ingest/wire"
	"github.com/tally-ledger/tally/internal/pause"
)

type benchFailoverOptions struct {
	members, partitions int
	rate, perMessage    int
	kills               int
	rapid               int  // members killed 0.3–1.7s apart, each restarted at once
	stops               int  // members stopped (SIGSTOP: a vanished host), each killed and restarted once its partitions moved
	killAll             bool // then every member killed at once and all restarted at once
	rolling             bool // restart every member in turn (SIGTERM, replacement at once)
	every, soak         time.Duration
	timeout             time.Duration
	steadyLag           time.Duration
	timings             groupTimings
	adminURL            string
	keep                bool
	logFile             string
}

func newBenchFailoverCmd() *cobra.Command {
	o := benchFailoverOptions{}
	cmd := &cobra.Command{
		Use:   "failover",
		Short: "Kill an ingest member (SIGKILL) under steady load: time until its partitions are caught up again",
		Long: `Start --members ingest processes (tally serve --ingest, subprocesses of this
binary) in one group (sharing the partitions through leases in Postgres) on an embedded broker and a fresh database,
produce --rate records/s steadily, then --kills times: once every
partition's enforcement lag is below --steady-lag (the backlog of the last
failover drained), SIGKILL one member and measure, for every partition it
owned, the time from the kill until the partition has applied a message
produced after the kill (kill → caught up), and the enforcement lag a customer on such a partition sees meanwhile (now
minus the partition's applied-through time, what the quota enforcer and
as_of use), against the same lag measured while nothing is killed. The
killed member is restarted before the next kill. Then, with --soak, the
members run --soak longer with nothing killed.

A false eviction is a member that was not killed whose group membership
changed (it was evicted and rejoined as a new member); every one is
counted. At the end production stops, the ledger must catch up and hold
exactly the records produced. Prints p50/p99/max over the kills.

Then --rapid-kills members are killed 0.3–1.7s apart (a random member each
time, restarted at once), --stops members are stopped with SIGSTOP one at a
time (a host that vanished: its connections stay open, so only its lease
tells the others; each is killed and restarted once its partitions caught
up elsewhere), with --kill-all every member is killed at once and as many
started at once, and with --rolling every member is restarted in turn. For each schedule (and for a quiet minute's worth of steady running
before the first kill, the baseline) it reports every partition's longest
pause in applying usage (the longest time its stored offset did not move
under steady production; p50, p99 and max over the partitions) and the
catch-up after the last kill: the time until every partition has applied a
message produced after it.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			return benchFailover(cmd.Context(), cmd.OutOrStdout(), o)
		},
	}
	f := cmd.Flags()
	f.IntVar(&o.members, "members", 3, "ingest processes in the group")
	f.IntVar(&o.partitions, "partitions", 6, "partitions of the benchmark topic")
	f.IntVar(&o.rate, "rate", 20_000, "records produced per second, steadily")
	f.IntVar(&o.perMessage, "per-message", 1000, "records per Kafka message")
	f.IntVar(&o.kills, "kills", 10, "members killed, one at a time, once the previous failover settled (the gentle schedule)")
	f.IntVar(&o.rapid, "rapid-kills", 8, "then members killed 0.3–1.7s apart, each restarted at once (a crash loop); 0: none")
	f.IntVar(&o.stops, "stops", 3, "then members stopped with SIGSTOP, one at a time (a host that vanished: its connections stay open, so only its lease tells), "+
		"each killed and restarted once its partitions caught up elsewhere; 0: none")
	f.BoolVar(&o.killAll, "kill-all", true, "then kill every member at once (SIGKILL) and start as many at once")
	f.BoolVar(&o.rolling, "rolling", true, "then restart every member in turn (SIGTERM, its replacement started at once, the next once the group settled)")
	f.DurationVar(&o.every, "every", 10*time.Second, "steady running before each kill (after the group settled)")
	f.DurationVar(&o.soak, "soak", 0, "after the kills, run this long with nothing killed and count false evictions")
	f.DurationVar(&o.timeout, "timeout", 2*time.Minute, "give up on a kill whose partitions are not caught up after this long")
	f.DurationVar(&o.steadyLag, "steady-lag", 2*time.Second,
		"kill only once every partition's enforcement lag is below this (waits up to a minute; 0: do not wait)")
	addGroupTimingFlags(f, &o.timings)
	f.StringVar(&o.adminURL, "database-url", defaultDatabaseURL, "Postgres server to create the benchmark database on")
	envDefault(f, "database-url", "TALLY_DATABASE_URL")
	f.BoolVar(&o.keep, "keep", false, "keep the benchmark database")
	f.StringVar(&o.logFile, "member-log", "", "append the members' logs to this file (default: discarded)")
	return cmd
}

// failoverMember is one ingest subprocess.
type failoverMember struct {
	cmd  *exec.Cmd
	pid  int
	done chan struct{}
}

type failoverBench struct {
	o       benchFailoverOptions
	out     io.Writer
	pool    *pgxpool.Pool
	dbURL   string
	broker  string
	topic   string
	exe     string
	logOut  io.Writer
	members []*failoverMember

	mu   sync.Mutex
	seen map[int]map[string]bool // pid → member ids seen in the owners table
}

func benchFailover(ctx context.Context, out io.Writer, o benchFailoverOptions) error {
	if o.members < 2 || o.partitions < o.members || o.rate < 1 || o.perMessage < 1 || o.perMessage > wire.MaxRecords || o.kills < 0 {
		return usageError(errors.New("bench failover: need --members ≥ 2, --partitions ≥ --members, --rate ≥ 1, 1 ≤ --per-message ≤ 10000, --kills ≥ 0"))
	}
	log := slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelWarn}))
	exe, err := os.Executable()
	if err != nil {
		return err
	}
	const topic = "bench.failover"
	k, err := devstack.StartKafka(devstack.KafkaConfig{Addr: "127.0.0.1:0", Topics: []string{topic}, Partitions: int32(o.partitions)})
	if err != nil {
		return err
	}
	defer k.Close()

	pool, dbURL, done, err := benchDB(ctx, o.adminURL, "tally_bench_failover", o.keep, log)
	if err != nil {
		return err
	}
	defer done()
	b := &failoverBench{o: o, out: out, pool: pool, dbURL: dbURL, broker: k.Addr, topic: topic, exe: exe,
		logOut: io.Discard, seen: map[int]map[string]bool{}}
	if o.logFile != "" {
		f, err := os.OpenFile(o.logFile, os.O_CREATE|os.O_APPEND|os.O_WRONLY, 0o644)
		if err != nil {
			return err
		}
		defer f.Close()
		b.logOut = f
	}
	t := o.timings
	fmt.Fprintf(out, "tally bench failover: %d members (tally serve --ingest), %d partitions, %d records/s in messages of %d, embedded broker %s\n",
		o.members, o.partitions, o.rate, o.perMessage, k.Addr)
	fmt.Fprintf(out, "  lease timings: session timeout %s, heartbeat interval %s\n", t.session, t.heartbeat)
	defer b.stopAll()
	for range o.members {
		if err := b.startMember(ctx); err != nil {
			return err
		}
	}

	pctx, stopProducing := context.WithCancel(ctx)
	prod := &failoverProducer{broker: k.Addr, topic: topic, rate: o.rate, perMessage: o.perMessage, customers: o.partitions * 8}
	prodDone := make(chan error, 1)
	go func() { prodDone <- prod.run(pctx) }()
	var prodOnce sync.Once
	var prodErr error
	stopProd := func() error {
		prodOnce.Do(func() {
			stopProducing()
			prodErr = <-prodDone
		})
		return prodErr
	}
	defer stopProd() //nolint:errcheck // reported below on the normal path
	started := time.Now()

	wctx, stopWatch := context.WithCancel(ctx)
	watchDone := make(chan struct{})
	go func() { defer close(watchDone); b.watchMembership(wctx) }()
	defer func() {
		stopWatch()
		<-watchDone
	}()

	if err := b.settle(ctx); err != nil {
		return err
	}
	// The baseline: pauses while nothing is killed (messages arrive on a
	// partition every few hundred milliseconds).
	base := b.watchPauses(ctx)
	if !pause.For(ctx, max(o.every, 5*time.Second)) {
		base.stop()
		return ctx.Err()
	}
	b.reportPauses("steady (nothing killed, the baseline)", base.stop(), 0)
	gentle := b.watchPauses(ctx)
	var caughtUp, steady, during, claims []float64
	untouchedMoved := 0 // partitions the killed member did not own that changed owner meanwhile
	for i := range o.kills {
		if !pause.For(ctx, o.every) {
			return ctx.Err()
		}
		// Kill from a steady state: the backlog a previous failover or the
		// restart's partition moves left is drained first (that is capacity, not
		// failover).
		s, err := b.lagNow(ctx, nil)
		for wait := time.Now().Add(time.Minute); err == nil && o.steadyLag > 0 && s > o.steadyLag.Seconds() && time.Now().Before(wait); {
			if !pause.For(ctx, 200*time.Millisecond) {
				return ctx.Err()
			}
			s, err = b.lagNow(ctx, nil)
		}
		if err != nil {
			return err
		}
		steady = append(steady, s)
		victim := b.members[0] // the oldest: every member is killed in turn
		parts, err := b.partitionsOf(ctx, victim.pid)
		if err != nil {
			return err
		}
		if len(parts) == 0 {
			return fmt.Errorf("kill %d: member %d owns no partition", i+1, victim.pid)
		}
		gens, err := b.generations(ctx)
		if err != nil {
			return err
		}
		tKill := time.Now()
		_ = victim.cmd.Process.Signal(syscall.SIGKILL)
		<-victim.done
		rec, claimed, maxLag, err := b.waitCaughtUp(ctx, parts, tKill)
		if err != nil {
			return fmt.Errorf("kill %d (member %d, partitions %v): %w", i+1, victim.pid, parts, err)
		}
		caughtUp, during, claims = append(caughtUp, rec.Seconds()), append(during, maxLag), append(claims, claimed.Seconds())
		fmt.Fprintf(out, "  kill %2d: member pid %d (partitions %v): claimed by another member after %5.2fs, caught up after %5.2fs; enforcement lag meanwhile max %5.2fs (steady %4.2fs)\n",
			i+1, victim.pid, parts, claimed.Seconds(), rec.Seconds(), maxLag, s)
		// Restart it so that every kill hits a group of --members.
		b.members = slices.DeleteFunc(b.members, func(m *failoverMember) bool { return m == victim })
		if err := b.startMember(ctx); err != nil {
			return err
		}
		if err := b.settle(ctx); err != nil {
			return err
		}
		n, err := b.movedBesides(ctx, gens, parts)
		if err != nil {
			return err
		}
		untouchedMoved += n
	}
	if o.kills > 0 {
		b.reportPauses(fmt.Sprintf("gentle (%d kills, each once the group settled)", o.kills), gentle.stop(), -1)
	} else {
		gentle.stop()
	}
	if o.rapid > 0 {
		if err := b.rapidKills(ctx); err != nil {
			return err
		}
	}
	if o.stops > 0 {
		if err := b.stopKills(ctx); err != nil {
			return err
		}
	}
	if o.killAll {
		if err := b.killAllAtOnce(ctx); err != nil {
			return err
		}
	}
	if o.rolling {
		if err := b.rollingRestart(ctx); err != nil {
			return err
		}
	}
	if o.soak > 0 {
		genFrom, err := b.maxGeneration(ctx)
		if err != nil {
			return err
		}
		fmt.Fprintf(out, "  soak: %s with nothing killed ...\n", o.soak)
		var soakLags []float64
		end := time.Now().Add(o.soak)
		for time.Now().Before(end) {
			if !pause.For(ctx, time.Second) {
				return ctx.Err()
			}
			s, err := b.lagNow(ctx, nil)
			if err != nil {
				return err
			}
			soakLags = append(soakLags, s)
		}
		genTo, err := b.maxGeneration(ctx)
		if err != nil {
			return err
		}
		fmt.Fprintf(out, "  soak: enforcement lag p50 %.2fs p99 %.2fs max %.2fs; partition claims %d\n",
			quantile(soakLags, 0.5), quantile(soakLags, 0.99), slices.Max(soakLags), genTo-genFrom)
	}

	if err := stopProd(); err != nil {
		return fmt.Errorf("produce: %w", err)
	}
	elapsed := time.Since(started)
	produced := prod.records.Load()
	if err := b.checkExact(ctx, produced); err != nil {
		return err
	}
	false_ := b.falseEvictions()
	fmt.Fprintf(out, "\n%d records produced in %s (%.0f records/s) and applied exactly once; %d failed writes retried by the producer\n",
		produced, elapsed.Round(time.Second), float64(produced)/elapsed.Seconds(), prod.failed.Load())
	if len(caughtUp) > 0 {
		p99 := quantile(caughtUp, 0.99)
		verdict := "holds"
		if p99 > 10 {
			verdict = "MISSED"
		}
		fmt.Fprintf(out, "kill → claimed by another member over %d kills:  p50 %.2fs  p99 %.2fs\n",
			len(claims), quantile(claims, 0.5), quantile(claims, 0.99))
		fmt.Fprintf(out, "kill → caught up over %d kills:  p50 %.2fs  p99 %.2fs  max %.2fs   (target p99 ≤ 10s: %s)\n",
			len(caughtUp), quantile(caughtUp, 0.5), p99, slices.Max(caughtUp), verdict)
		fmt.Fprintf(out, "partitions the killed member did not own that changed owner (the failover and its replacement's join, over %d kills): %d\n",
			len(caughtUp), untouchedMoved)
		fmt.Fprintf(out, "enforcement lag on a killed member's partitions, worst per kill:  p50 %.2fs  p99 %.2fs;  steady (same run, before each kill): p50 %.2fs  = %.1f× steady\n",
			quantile(during, 0.5), quantile(during, 0.99), quantile(steady, 0.5), quantile(during, 0.5)/math.Max(quantile(steady, 0.5), 0.001))
	}
	fmt.Fprintf(out, "false evictions (members not killed that lost their group membership): %d\n", false_)
	return nil
}

// quantile is the nearest-rank quantile of xs.
func quantile(xs []float64, q float64) float64 {
	if len(xs) == 0 {
		return math.NaN()
	}
	s := slices.Clone(xs)
	slices.Sort(s)
	i := int(math.Ceil(q*float64(len(s)))) - 1
	return s[max(i, 0)]
}

func (b *failoverBench) startMember(ctx context.Context) error {
	t := b.o.timings
	cmd := exec.Command(b.exe, "serve", "--ingest", "--listen", "127.0.0.1:0",
		"--database-url", b.dbURL, "--kafka-brokers", b.broker, "--topic", b.topic, "--group", "bench-failover",
		"--session-timeout", t.session.String(), "--heartbeat-interval", t.heartbeat.String())
	cmd.Env = os.Environ()
	cmd.Stdout = b.logOut
	stderr, err := cmd.StderrPipe()
	if err != nil {
		return err
	}
	if err := cmd.Start(); err != nil {
		return fmt.Errorf("start member: %w", err)
	}
	m := &failoverMember{cmd: cmd, pid: cmd.Process.Pid, done: make(chan struct{})}
	go func() {
		sc := bufio.NewScanner(stderr)
		sc.Buffer(make([]byte, 64<<10), 1<<20)
		for sc.Scan() {
			fmt.Fprintf(b.logOut, "[%d] %s\n", m.pid, sc.Text())
		}
		_ = cmd.Wait()
		close(m.done)
	}()
	b.members = append(b.members, m)
	_ = ctx
	return nil
}

func (b *failoverBench) stopAll() {
	for _, m := range b.members {
		_ = m.cmd.Process.Signal(syscall.SIGTERM)
	}
	for _, m := range b.members {
		select {
		case <-m.done:
		case <-time.After(30 * time.Second):
			_ = m.cmd.Process.Kill()
			<-m.done
		}
	}
	b.members = nil
}

// settle waits until every partition has a live owner and every member owns
// at least one partition.
func (b *failoverBench) settle(ctx context.Context) error {
	deadline := time.Now().Add(2 * time.Minute)
	for {
		var owned, procs int
		err := b.pool.QueryRow(ctx, `SELECT count(*), count(DISTINCT o.process) `+liveOwners, b.topic).Scan(&owned, &procs)
		if err != nil {
			return err
		}
		if owned == b.o.partitions && procs == len(b.members) {
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("the group did not settle: %d of %d partitions owned by %d of %d members", owned, b.o.partitions, procs, len(b.members))
		}
		if !pause.For(ctx, 100*time.Millisecond) {
			return ctx.Err()
		}
	}
}

// partitionsOf returns the partitions process pid holds.
func (b *failoverBench) partitionsOf(ctx context.Context, pid int) ([]int, error) {
	rows, err := b.pool.Query(ctx, `SELECT o.partition `+liveOwners+` AND o.process LIKE '%:' || $2::text ORDER BY o.partition`,
		b.topic, strconv.Itoa(pid))
	if err != nil {
		return nil, err
	}
	var out []int
	for rows.Next() {
		var p int
		if err := rows.Scan(&p); err != nil {
			rows.Close()
			return nil, err
		}
		out = append(out, p)
	}
	rows.Close()
	return out, rows.Err()
}

// lagNow is the largest enforcement lag (now minus applied-through) over
// parts (nil: all partitions), in seconds.
func (b *failoverBench) lagNow(ctx context.Context, parts []int) (float64, error) {
	var lag *float64
	err := b.pool.QueryRow(ctx, `SELECT max(extract(epoch FROM clock_timestamp() - applied_through))::float8
		FROM ingest_partitions WHERE topic = $1 AND ($2::int[] IS NULL OR partition = ANY($2))`, b.topic, parts).Scan(&lag)
	if err != nil {
		return 0, err
	}
	if lag == nil {
		return 0, nil
	}
	return *lag, nil
}

// waitCaughtUp waits until every partition of parts has applied a message
// produced after tKill; it returns that time, the time until the last of
// them was claimed by another member, and the largest enforcement lag seen
// on them meanwhile.
func (b *failoverBench) waitCaughtUp(ctx context.Context, parts []int, tKill time.Time) (time.Duration, time.Duration, float64, error) {
	var maxLag float64
	var claimed time.Duration
	claimedOf := map[int]bool{}
	for {
		now := time.Now()
		if now.Sub(tKill) > b.o.timeout {
			return 0, 0, 0, fmt.Errorf("not caught up after %s", b.o.timeout)
		}
		rows, err := b.pool.Query(ctx, `SELECT p.partition, p.applied_through,
				extract(epoch FROM clock_timestamp() - p.applied_through)::float8,
				coalesce(m.lease_until > now(), false) AND o.since > $3
			FROM ingest_partitions p JOIN ingest_partition_owners o USING (topic, partition)
			LEFT JOIN ingest_members m ON m.topic = o.topic AND m.consumer_group = o.consumer_group AND m.member = o.member
			WHERE p.topic = $1 AND p.partition = ANY($2)`, b.topic, parts, tKill)
		if err != nil {
			return 0, 0, 0, err
		}
		caught := 0
		for rows.Next() {
			var p int
			var through time.Time
			var lag float64
			var newOwner bool
			if err := rows.Scan(&p, &through, &lag, &newOwner); err != nil {
				rows.Close()
				return 0, 0, 0, err
			}
			maxLag = max(maxLag, lag)
			if newOwner && !claimedOf[p] {
				claimedOf[p] = true
				claimed = time.Since(tKill)
			}
			if through.After(tKill) {
				caught++
			}
		}
		rows.Close()
		if err := rows.Err(); err != nil {
			return 0, 0, 0, err
		}
		if caught == len(parts) {
			return time.Since(tKill), claimed, maxLag, nil
		}
		if !pause.For(ctx, 50*time.Millisecond) {
			return 0, 0, 0, ctx.Err()
		}
	}
}

// watchMembership records, every 200ms, which member ids each process has
// held.
func (b *failoverBench) watchMembership(ctx context.Context) {
	for pause.For(ctx, 200*time.Millisecond) {
		rows, err := b.pool.Query(ctx, `SELECT o.process, o.member `+liveOwners, b.topic)
		if err != nil {
			continue
		}
		b.mu.Lock()
		for rows.Next() {
			var process, member string
			if rows.Scan(&process, &member) != nil {
				break
			}
			pid, _ := strconv.Atoi(process[strings.LastIndexByte(process, ':')+1:])
			if b.seen[pid] == nil {
				b.seen[pid] = map[string]bool{}
			}
			b.seen[pid][member] = true
		}
		b.mu.Unlock()
		rows.Close()
	}
}

// liveOwners selects the partitions of topic $1 whose holder's lease is
// live (the members' leases are in ingest_members).
const liveOwners = `FROM ingest_partition_owners o
	JOIN ingest_members m ON m.topic = o.topic AND m.consumer_group = o.consumer_group AND m.member = o.member
	WHERE o.topic = $1 AND m.lease_until > now()`

// maxGeneration is the number of partition claims so far (every claim bumps
// its partition's fencing epoch).
func (b *failoverBench) maxGeneration(ctx context.Context) (int32, error) {
	var g int32
	err := b.pool.QueryRow(ctx, `SELECT coalesce(sum(generation), 0)::int FROM ingest_partition_owners WHERE topic = $1`, b.topic).Scan(&g)
	return g, err
}

// generations is every partition's fencing epoch (each claim bumps it).
func (b *failoverBench) generations(ctx context.Context) (map[int]int32, error) {
	rows, err := b.pool.Query(ctx, `SELECT partition, generation FROM ingest_partition_owners WHERE topic = $1`, b.topic)
	if err != nil {
		return nil, err
	}
	out := map[int]int32{}
	for rows.Next() {
		var p int
		var g int32
		if err := rows.Scan(&p, &g); err != nil {
			rows.Close()
			return nil, err
		}
		out[p] = g
	}
	rows.Close()
	return out, rows.Err()
}

// movedBesides counts the partitions outside parts claimed since gens.
func (b *failoverBench) movedBesides(ctx context.Context, gens map[int]int32, parts []int) (int, error) {
	now, err := b.generations(ctx)
	if err != nil {
		return 0, err
	}
	n := 0
	for p, g := range now {
		if !slices.Contains(parts, p) && g != gens[p] {
			n++
		}
	}
	return n, nil
}

// falseEvictions counts member ids beyond the first of every process: a
// member keeps its id while its lease lives and registers a new one only
// after it was evicted (its lease ran out). A killed process has one id (its
// restart is a new process).
func (b *failoverBench) falseEvictions() int {
	b.mu.Lock()
	defer b.mu.Unlock()
	n := 0
	for _, ids := range b.seen {
		n += max(len(ids)-1, 0)
	}
	return n
}

// checkExact waits until the ledger has applied everything produced and
// checks that it holds exactly the records produced.
func (b *failoverBench) checkExact(ctx context.Context, produced int64) error {
	deadline := time.Now().Add(5 * time.Minute)
	for {
		var applied, in, dup int64
		var lag int64
		err := b.pool.QueryRow(ctx, `SELECT coalesce(sum(records_applied), 0), coalesce(sum(records_in), 0),
			coalesce(sum(records_duplicate), 0), coalesce(sum(greatest(high_watermark - next_offset, 0)), 0)
			FROM ingest_partitions WHERE topic = $1`, b.topic).Scan(&applied, &in, &dup, &lag)
		if err != nil {
			return err
		}
		if applied == produced && in == applied+dup {
			return nil
		}
		if applied > produced {
			return fmt.Errorf("ledger applied %d records, %d were produced", applied, produced)
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("ledger applied %d of %d records produced after 5 minutes (lag %d messages)", applied, produced, lag)
		}
		if !pause.For(ctx, 200*time.Millisecond) {
			return ctx.Err()
		}
	}
}

// failoverProducer sends rate records/s in messages of perMessage records,
// one stream per customer, with sequences and running totals.
type failoverProducer struct {
	broker, topic    string
	rate, perMessage int
	customers        int
	records, failed  atomic.Int64
	seqs             []int64
	totals           []decimal.Decimal
	next             int
}

func (p *failoverProducer) run(ctx context.Context) error {
	tr := &kafka.Transport{}
	defer tr.CloseIdleConnections()
	w := &kafka.Writer{Addr: kafka.TCP(p.broker), Topic: p.topic, Transport: tr, Balancer: &kafka.Murmur2Balancer{},
		RequiredAcks: kafka.RequireAll, BatchTimeout: time.Millisecond, BatchSize: 1}
	defer w.Close()
	p.seqs = make([]int64, p.customers)
	p.totals = make([]decimal.Decimal, p.customers)
	perTick := max(1, p.rate/p.perMessage/20) // messages every 50ms
	interval := time.Duration(float64(time.Second) * float64(perTick*p.perMessage) / float64(p.rate))
	t := time.NewTicker(interval)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return nil
		case <-t.C:
		}
		msgs := make([]kafka.Message, 0, perTick)
		for range perTick {
			msgs = append(msgs, p.message())
		}
		// A failed write is retried until it succeeds (the same bytes: the
		// ledger would drop a duplicate), so the count of records produced
		// is exact.
		for {
			err := w.WriteMessages(context.WithoutCancel(ctx), msgs...)
			if err == nil {
				break
			}
			p.failed.Add(1)
			if !pause.For(context.WithoutCancel(ctx), 100*time.Millisecond) {
				return err
			}
			if p.failed.Load() > 1000 {
				return err
			}
		}
		p.records.Add(int64(perTick * p.perMessage))
	}
}

func (p *failoverProducer) message() kafka.Message {
	c := p.next % p.customers
	p.next++
	customer := fmt.Sprintf("failover-%03d", c)
	now := time.Now().UTC()
	b := wire.Batch{Schema: wire.Schema, BatchID: uuid.Must(uuid.NewV7()), Producer: "bench-failover", Epoch: 1, SentAt: now}
	for range p.perMessage {
		p.seqs[c]++
		q := decimal.New(int64(p.next%997+1), -2)
		p.totals[c] = p.totals[c].Add(q)
		b.Records = append(b.Records, wire.Record{OperationID: uuid.Must(uuid.NewV7()), Customer: customer,
			Meter: "api_calls", Seq: p.seqs[c], Total: p.totals[c], Quantity: decimal.NewNullDecimal(q), OccurredAt: now})
	}
	v, err := wire.Encode(b)
	if err != nil {
		panic(err) // the generator only builds valid batches
	}
	return kafka.Message{Key: []byte(customer), Value: v, Time: now}
}

// pauseWatch samples every partition's stored next offset every 50ms and
// keeps, per partition, the longest time it did not move.
type pauseWatch struct {
	mu      sync.Mutex
	last    map[int]int64
	since   map[int]time.Time // the last advance
	longest map[int]time.Duration
	quit    chan struct{}
	done    chan struct{}
}

func (b *failoverBench) watchPauses(ctx context.Context) *pauseWatch {
	w := &pauseWatch{last: map[int]int64{}, since: map[int]time.Time{}, longest: map[int]time.Duration{},
		quit: make(chan struct{}), done: make(chan struct{})}
	go func() {
		defer close(w.done)
		t := time.NewTicker(50 * time.Millisecond)
		defer t.Stop()
		for {
			select {
			case <-ctx.Done():
				return
			case <-w.quit:
				return
			case <-t.C:
			}
			w.sample(ctx, b)
		}
	}()
	return w
}

func (w *pauseWatch) sample(ctx context.Context, b *failoverBench) {
	rows, err := b.pool.Query(ctx, `SELECT partition, next_offset FROM ingest_partitions WHERE topic = $1`, b.topic)
	if err != nil {
		return
	}
	defer rows.Close()
	now := time.Now()
	w.mu.Lock()
	defer w.mu.Unlock()
	for rows.Next() {
		var p int
		var n int64
		if rows.Scan(&p, &n) != nil {
			return
		}
		prev, seen := w.last[p]
		switch {
		case !seen:
			w.since[p] = now
		case n != prev:
			w.longest[p] = max(w.longest[p], now.Sub(w.since[p]))
			w.since[p] = now
		}
		w.last[p] = n
	}
}

// stop ends the watch and returns each partition's longest pause (a pause
// still running counts up to now).
func (w *pauseWatch) stop() map[int]time.Duration {
	close(w.quit)
	<-w.done
	w.mu.Lock()
	defer w.mu.Unlock()
	now := time.Now()
	out := map[int]time.Duration{}
	for p, since := range w.since {
		out[p] = max(w.longest[p], now.Sub(since))
	}
	return out
}

// reportPauses prints a schedule's longest pause per partition (p50, p99,
// max over the partitions, then each) and its catch-up after the last kill
// (negative: not measured).
func (b *failoverBench) reportPauses(name string, longest map[int]time.Duration, catchUp time.Duration) {
	var xs []float64
	parts := make([]int, 0, len(longest))
	for p := range longest {
		parts = append(parts, p)
	}
	slices.Sort(parts)
	var each strings.Builder
	for _, p := range parts {
		xs = append(xs, longest[p].Seconds())
		fmt.Fprintf(&each, " %d:%.2fs", p, longest[p].Seconds())
	}
	if len(xs) == 0 {
		return
	}
	fmt.Fprintf(b.out, "  %s: longest pause in applying usage per partition  p50 %.2fs  p99 %.2fs  max %.2fs  (%s)\n",
		name, quantile(xs, 0.5), quantile(xs, 0.99), slices.Max(xs), strings.TrimSpace(each.String()))
	if catchUp > 0 {
		fmt.Fprintf(b.out, "  %s: caught up %.2fs after the last kill (every partition applied a message produced after it)\n", name, catchUp.Seconds())
	}
}

// allPartitions is 0 .. partitions-1.
func (b *failoverBench) allPartitions() []int {
	out := make([]int, b.o.partitions)
	for i := range out {
		out[i] = i
	}
	return out
}

// rapidKills kills --rapid-kills members 0.3–1.7s apart, each a random
// member restarted at once, then measures the catch-up after the last kill.
func (b *failoverBench) rapidKills(ctx context.Context) error {
	w := b.watchPauses(ctx)
	defer func() {
		if w != nil {
			w.stop()
		}
	}()
	rng := rand.New(rand.NewPCG(uint64(b.o.rapid), 31))
	var tLast time.Time
	for i := range b.o.rapid {
		victim := b.members[rng.IntN(len(b.members))]
		tLast = time.Now()
		_ = victim.cmd.Process.Signal(syscall.SIGKILL)
		<-victim.done
		b.members = slices.DeleteFunc(b.members, func(m *failoverMember) bool { return m == victim })
		if err := b.startMember(ctx); err != nil {
			return err
		}
		fmt.Fprintf(b.out, "  rapid kill %d: member pid %d killed, replacement pid %d started\n", i+1, victim.pid, b.members[len(b.members)-1].pid)
		if i < b.o.rapid-1 && !pause.For(ctx, time.Duration(300+rng.IntN(1401))*time.Millisecond) {
			return ctx.Err()
		}
	}
	rec, _, _, err := b.waitCaughtUp(ctx, b.allPartitions(), tLast)
	if err != nil {
		return fmt.Errorf("rapid kills: %w", err)
	}
	if err := b.settle(ctx); err != nil {
		return err
	}
	b.reportPauses(fmt.Sprintf("rapid (%d kills 0.3–1.7s apart, each restarted at once)", b.o.rapid), w.stop(), rec)
	w = nil
	return nil
}

// stopKills stops --stops members in turn with SIGSTOP: to Postgres they
// look like a host that vanished (connections open, nothing sent), so their
// partitions move only when their lease runs out. Each is measured like a
// gentle kill, then killed and restarted.
func (b *failoverBench) stopKills(ctx context.Context) error {
	w := b.watchPauses(ctx)
	defer func() {
		if w != nil {
			w.stop()
		}
	}()
	var caughtUp, claims []float64
	untouchedMoved := 0
	if err := b.settle(ctx); err != nil {
		return err
	}
	for i := range b.o.stops {
		if !pause.For(ctx, 2*time.Second) {
			return ctx.Err()
		}
		victim := b.members[0]
		parts, err := b.partitionsOf(ctx, victim.pid)
		if err != nil {
			return err
		}
		if len(parts) == 0 {
			return fmt.Errorf("stop %d: member %d owns no partition", i+1, victim.pid)
		}
		gens, err := b.generations(ctx)
		if err != nil {
			return err
		}
		tStop := time.Now()
		_ = victim.cmd.Process.Signal(syscall.SIGSTOP)
		rec, claimed, _, err := b.waitCaughtUp(ctx, parts, tStop)
		_ = victim.cmd.Process.Signal(syscall.SIGKILL)
		<-victim.done
		if err != nil {
			return fmt.Errorf("stop %d (member %d, partitions %v): %w", i+1, victim.pid, parts, err)
		}
		caughtUp, claims = append(caughtUp, rec.Seconds()), append(claims, claimed.Seconds())
		fmt.Fprintf(b.out, "  stop %d: member pid %d stopped (partitions %v): claimed by another member after %5.2fs, caught up after %5.2fs\n",
			i+1, victim.pid, parts, claimed.Seconds(), rec.Seconds())
		b.members = slices.DeleteFunc(b.members, func(m *failoverMember) bool { return m == victim })
		if err := b.startMember(ctx); err != nil {
			return err
		}
		if err := b.settle(ctx); err != nil {
			return err
		}
		n, err := b.movedBesides(ctx, gens, parts)
		if err != nil {
			return err
		}
		untouchedMoved += n
	}
	b.reportPauses(fmt.Sprintf("stops (%d members stopped with SIGSTOP, only their lease tells; each then killed and restarted)", b.o.stops), w.stop(), -1)
	w = nil
	fmt.Fprintf(b.out, "  stops: stop → claimed p50 %.2fs p99 %.2fs; stop → caught up p50 %.2fs p99 %.2fs max %.2fs; "+
		"partitions the stopped member did not own that changed owner: %d\n",
		quantile(claims, 0.5), quantile(claims, 0.99), quantile(caughtUp, 0.5), quantile(caughtUp, 0.99), slices.Max(caughtUp), untouchedMoved)
	return nil
}

// killAllAtOnce kills every member at once and starts as many at once: the
// whole group's crash.
func (b *failoverBench) killAllAtOnce(ctx context.Context) error {
	if err := b.settle(ctx); err != nil {
		return err
	}
	if !pause.For(ctx, 2*time.Second) {
		return ctx.Err()
	}
	w := b.watchPauses(ctx)
	defer func() {
		if w != nil {
			w.stop()
		}
	}()
	old := slices.Clone(b.members)
	tKill := time.Now()
	for _, m := range old {
		_ = m.cmd.Process.Signal(syscall.SIGKILL)
	}
	for _, m := range old {
		<-m.done
	}
	b.members = nil
	for range old {
		if err := b.startMember(ctx); err != nil {
			return err
		}
	}
	rec, _, _, err := b.waitCaughtUp(ctx, b.allPartitions(), tKill)
	if err != nil {
		return fmt.Errorf("kill all: %w", err)
	}
	if err := b.settle(ctx); err != nil {
		return err
	}
	b.reportPauses(fmt.Sprintf("kill all (%d members killed at once, as many started at once)", len(old)), w.stop(), rec)
	w = nil
	return nil
}

// rollingRestart restarts every member in turn: SIGTERM (it finishes its
// transactions and releases its leases), its replacement started at once,
// the next member once the group settled.
func (b *failoverBench) rollingRestart(ctx context.Context) error {
	w := b.watchPauses(ctx)
	defer func() {
		if w != nil {
			w.stop()
		}
	}()
	old := slices.Clone(b.members)
	var tLast time.Time
	for _, m := range old {
		tLast = time.Now()
		_ = m.cmd.Process.Signal(syscall.SIGTERM)
		select {
		case <-m.done:
		case <-time.After(30 * time.Second):
			return fmt.Errorf("rolling restart: member %d did not stop within 30s of SIGTERM", m.pid)
		}
		b.members = slices.DeleteFunc(b.members, func(x *failoverMember) bool { return x == m })
		if err := b.startMember(ctx); err != nil {
			return err
		}
		if err := b.settle(ctx); err != nil {
			return err
		}
	}
	rec, _, _, err := b.waitCaughtUp(ctx, b.allPartitions(), tLast)
	if err != nil {
		return fmt.Errorf("rolling restart: %w", err)
	}
	b.reportPauses(fmt.Sprintf("rolling restart (%d members, one after the other)", len(old)), w.stop(), rec)
	w = nil
	return nil
}
