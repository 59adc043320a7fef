package cli

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"time"

	"github.com/spf13/cobra"

	"github.com/tally-ledger/tally/cmd/tally/internal/bench/chaosbench"
	"github.com/tally-ledger/tally/cmd/tally/internal/devstack"
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
}

func (o benchChaosOptions) Validate() error {
	var errs []error
	if o.members < 1 || o.partitions < 1 || o.steps < 1 {
		errs = append(errs, errors.New("bench chaos: --members, --partitions and --steps must be at least 1"))
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
		return err
	}
	log := slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelError}))
	const topic = "bench.chaos"
	k, err := devstack.StartKafka(devstack.KafkaConfig{Addr: "127.0.0.1:0", Topics: []string{topic}, Partitions: int32(o.partitions)})
	if err != nil {
		return err
	}
	defer k.Close()
	_, dbURL, done, err := benchDB(ctx, o.adminURL, "tally_bench_chaos", o.keep, log)
	if err != nil {
		return err
	}
	defer done()
	fmt.Fprintf(out, "tally bench chaos --seed %d: %d ingest members, %d partitions, %d faults of up to %s, embedded broker %s\n",
		o.seed, o.members, o.partitions, o.steps, o.maxFault, k.Addr)
	t0 := time.Now()
	rep, err := chaosbench.Run(ctx, chaosbench.Config{DatabaseURL: dbURL, Broker: k.Addr, Topic: topic, Members: o.members,
		Seed: o.seed, Steps: o.steps, MaxFault: o.maxFault, Out: out, Logger: log})
	if err != nil {
		fmt.Fprintf(out, "FAILED after %s: %v\n  replay: tally bench chaos --seed %d --steps %d --members %d --partitions %d --max-fault %s\n",
			time.Since(t0).Round(time.Second), err, o.seed, o.steps, o.members, o.partitions, o.maxFault)
		return err
	}
	fmt.Fprintf(out, "ok after %s: %d records in %d messages, every one applied exactly once (totals exact); no stored offset moved back; "+
		"every member ready and caught up %s after the last fault\n",
		time.Since(t0).Round(time.Second), rep.Records, rep.Messages, rep.Healed.Round(time.Millisecond))
	return nil
}

func newBenchChaosCmd() *cobra.Command {
	o := benchChaosOptions{}
	cmd := &cobra.Command{
		Use:   "chaos",
		Short: "Run ingest members under a seeded schedule of faults and check that nothing was lost, doubled or left stuck",
		Long: `Start --members ingest members on an embedded broker and a fresh database, each
reading Postgres and Kafka through a TCP fault proxy of its own, produce
steadily, and run --steps faults drawn from --seed: a member's Postgres or
Kafka link blackholed (nothing arrives, connections stay open) or reset
(every connection reset, new ones refused), its Postgres link slowed, the
member frozen (both links blackholed at once, as a stalled process looks to
the others) or restarted, each for up to --max-fault (past the members' 1.5s
lease), then healed. The schedule is printed as it runs; the same seed runs the same
schedule.

At the end it checks that every record produced is in the ledger exactly
once (per-customer totals exact), that no stored offset ever moved back, and
that every member is ready again and caught up. It exits non-zero and prints
the command that replays the schedule when any check fails.`,
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
	f.BoolVar(&o.keep, "keep", false, "keep the benchmark database")
	return cmd
}
