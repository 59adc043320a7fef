package cli

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"os/exec"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/shopspring/decimal"
	"github.com/spf13/cobra"

	"github.com/tally-ledger/tally/cmd/tally/internal/bench/chaosbench"
	"github.com/tally-ledger/tally/cmd/tally/internal/devstack"
	"github.com/tally-ledger/tally/migrations"
)

// benchChaosOptions are tally bench chaos's flags; chaosbench.Run does the work.
type benchChaosOptions struct {
	seed       uint64
	steps      int
	members    int
	partitions int
	maxFault   time.Duration
	adminURL   string
	keep       bool
	gateways   int
	grantLimit int64
	process    bool // one more member as a subprocess (tally serve --ingest), stopped with SIGSTOP
	private    bool // a private Postgres cluster the schedule restarts (pg_ctl restart -m immediate)
}

func (o benchChaosOptions) Validate() error {
	var errs []error
	if o.members < 1 || o.partitions < 1 || o.steps < 1 {
		errs = append(errs, errors.New("bench chaos: --members, --partitions and --steps must be at least 1"))
	}
	if o.gateways < 0 || o.grantLimit < 0 {
		errs = append(errs, errors.New("bench chaos: --gateways and --grant-limit must not be negative"))
	}
	if o.maxFault < 200*time.Millisecond {
		errs = append(errs, fmt.Errorf("bench chaos: --max-fault %s is below 200ms", o.maxFault))
	}
	return errors.Join(errs...)
}

// Run creates a database of its own and an embedded broker, runs the seeded
// schedule and prints it with the outcome.
func (o benchChaosOptions) Run(ctx context.Context, out io.Writer) error {
	if err := o.Validate(); err != nil {
		return usageError(err)
	}
	log := slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelError}))
	const topic = "bench.chaos"
	k, err := devstack.StartKafka(devstack.KafkaConfig{Addr: "127.0.0.1:0", Topics: []string{topic}, Partitions: int32(o.partitions)})
	if err != nil {
		return err
	}
	defer k.Close()
	cfg := chaosbench.Config{Broker: k.Addr, Topic: topic, Members: o.members,
		Seed: o.seed, Steps: o.steps, MaxFault: o.maxFault, Out: out, Logger: log,
		Gateways: o.gateways, GrantLimit: decimal.NewFromInt(o.grantLimit)}
	where := "a database on " + maskSecrets(o.adminURL)
	if o.private {
		pg, closePG, err := o.startPrivate(ctx, log)
		if err != nil {
			return err
		}
		defer closePG()
		cfg.DatabaseURL, cfg.PostgresTarget, cfg.RestartPostgres = pg.URL, "unix:"+pg.Socket, pg.RestartImmediate
		where = "a private Postgres cluster (" + pg.Source + ")"
	} else {
		_, dbURL, done, err := benchDB(ctx, o.adminURL, "tally_bench_chaos", o.keep, log)
		if err != nil {
			return err
		}
		defer done()
		cfg.DatabaseURL = dbURL
	}
	if o.process {
		exe, err := os.Executable()
		if err != nil {
			return err
		}
		cfg.Process = func(spec chaosbench.ProcessSpec) *exec.Cmd {
			return exec.Command(exe, chaosbench.ServeArgs(spec)...)
		}
	}
	fmt.Fprintf(out, "tally bench chaos --seed %d: %d ingest members in process%s, %d partitions, %d gateways racing for exact grants of %s units, "+
		"%d faults of up to %s drawn from %v, %s, embedded broker %s\n",
		o.seed, o.members, map[bool]string{true: " and one as a subprocess, an API process", false: ""}[o.process], o.partitions, o.gateways,
		chaosbench.GrantLimitOf(cfg), o.steps, o.maxFault, chaosbench.FaultsOf(cfg), where, k.Addr)
	t0 := time.Now()
	rep, err := chaosbench.Run(ctx, cfg)
	if err != nil {
		fmt.Fprintf(out, "FAILED after %s: %v\n  replay: tally bench chaos --seed %d --steps %d --members %d --partitions %d --max-fault %s "+
			"--gateways %d --grant-limit %d --process=%t --private-postgres=%t\n",
			time.Since(t0).Round(time.Second), err, o.seed, o.steps, o.members, o.partitions, o.maxFault,
			o.gateways, o.grantLimit, o.process, o.private)
		return err
	}
	fmt.Fprintf(out, "ok after %s: %d records in %d messages, every one applied exactly once (totals exact); no stored offset moved back; "+
		"every member ready and caught up %s after the last fault\n",
		time.Since(t0).Round(time.Second), rep.Records, rep.Messages, rep.Healed.Round(time.Millisecond))
	if o.gateways > 0 {
		g := rep.Grants
		fmt.Fprintf(out, "grants: %d answered, %s units admitted by the gateways and %s consumed against a limit of %s (no over-admission); "+
			"%d refused (budget exhausted), %d failed and %d releases lost under faults; every answered grant stored\n",
			g.Granted, g.Admitted, g.Consumed, g.Limit, g.Refused, g.Failed, g.Unreleased)
		if g.Refused == 0 {
			fmt.Fprintf(out, "  the gateways never reached the limit: over-admission was not put to the test (lower --grant-limit)\n")
		}
	}
	return nil
}

// startPrivate starts a private Postgres cluster for the run (in a
// temporary directory, removed by closePG unless --keep) and migrates its
// database.
func (o benchChaosOptions) startPrivate(ctx context.Context, log *slog.Logger) (pg *devstack.Postgres, closePG func(), err error) {
	dir, err := os.MkdirTemp("", "tally-bench-chaos-")
	if err != nil {
		return nil, nil, err
	}
	remove := func() {
		if !o.keep {
			_ = os.RemoveAll(dir)
		}
	}
	// The server may run as another user (as root: postgres).
	if err := os.Chmod(dir, 0o755); err != nil {
		remove()
		return nil, nil, err
	}
	if pg, err = devstack.StartPrivate(ctx, devstack.PostgresConfig{Dir: dir, PrivatePort: 54393, Logger: log}); err != nil {
		remove()
		return nil, nil, err
	}
	closePG = func() { _ = pg.Close(); remove() }
	pool, err := pgxpool.New(ctx, pg.URL)
	if err != nil {
		closePG()
		return nil, nil, err
	}
	defer pool.Close()
	if _, err := migrations.Up(ctx, pool, log); err != nil {
		closePG()
		return nil, nil, err
	}
	return pg, closePG, nil
}

func newBenchChaosCmd() *cobra.Command {
	o := benchChaosOptions{}
	cmd := &cobra.Command{
		Use:   "chaos",
		Short: "Run ingest members under a seeded schedule of faults and check that nothing was lost, doubled or left stuck",
		Long: `Start --members ingest members in process, and with --process one more as a
subprocess (tally serve --ingest), on an embedded broker and, with
--private-postgres, a private Postgres cluster (initdb, pg_ctl; else a fresh
database on --database-url), each member reading Postgres and Kafka through
TCP fault proxies of its own; --gateways gateways race for exact grants of
one budget through the REST API (POST /v1/grants, then release) of an API
process (tally serve --api, with --process; else the grant path in process),
each with its own gateway token, the API's Postgres link its own. Produce
steadily, and run --steps faults drawn from --seed: a member's Postgres or
Kafka link blackholed (nothing arrives, connections stay open) or reset
(every connection reset, new ones refused), its Postgres link slowed, the
member frozen (both links blackholed at once, as a stalled process looks to
the others) or restarted, the grant path's link reset or blackholed, the
subprocess stopped with SIGSTOP past its lease and then continued, the
whole server restarted with pg_ctl restart -m immediate; each for up to
--max-fault (past the members' 1.5s lease), then healed. The schedule is
printed as it runs; the same seed runs the same schedule.

At the end it checks that every record produced is in the ledger exactly
once (per-customer totals exact), that no stored offset ever moved back,
that the gateways admitted no more than the limit and every grant answered
to one is stored, and that every member and the API process are ready
again (the subprocesses by
their /readyz) and caught up. It exits non-zero and prints the command that
replays the schedule when any check fails.`,
		Example: `  tally bench chaos --seed 42
  tally bench chaos --seed 7 --steps 60 --members 4 --partitions 8`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error { return o.Run(cmd.Context(), cmd.OutOrStdout()) },
	}
	f := cmd.Flags()
	f.Uint64Var(&o.seed, "seed", 1, "seed of the fault schedule (the same seed runs the same schedule)")
	f.IntVar(&o.steps, "steps", 30, "faults in the schedule")
	f.IntVar(&o.members, "members", 3, "ingest members")
	f.IntVar(&o.partitions, "partitions", 6, "partitions of the benchmark topic")
	f.DurationVar(&o.maxFault, "max-fault", 3*time.Second, "longest fault")
	f.StringVar(&o.adminURL, "database-url", defaultDatabaseURL, "Postgres server to create the benchmark database on")
	envDefault(f, "database-url", "TALLY_DATABASE_URL")
	f.BoolVar(&o.keep, "keep", false, "keep the benchmark database (or the private cluster's directory)")
	f.IntVar(&o.gateways, "gateways", 10, "gateways racing for exact grants of one budget through the grant path (its own faulty Postgres link); 0: none")
	f.Int64Var(&o.grantLimit, "grant-limit", 0, "the exact budget's limit the gateways race for (no gateway may admit past it); 0: 400 per step, reached during the schedule")
	f.BoolVar(&o.process, "process", true, "run one more member as a subprocess (tally serve --ingest) that the schedule stops with SIGSTOP past its lease, and the gateways' API as a process (tally serve --api); both probed through /readyz")
	f.BoolVar(&o.private, "private-postgres", true, "run on a private Postgres cluster (initdb, pg_ctl) that the schedule restarts with pg_ctl restart -m immediate; false: a database on --database-url, never restarted")
	return cmd
}
