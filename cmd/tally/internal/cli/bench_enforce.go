package cli

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"os"
	"time"

	"github.com/spf13/cobra"

	"github.com/tally-ledger/tally/cmd/tally/internal/bench/enforcebench"
	"github.com/tally-ledger/tally/cmd/tally/internal/devstack"
	"github.com/tally-ledger/tally/quota"
)

type benchEnforceOptions struct {
	customers, rate, partitions int
	duration, interval          time.Duration
	adminURL                    string
	keep                        bool
	alerts                      bool
}

func newBenchEnforceCmd() *cobra.Command {
	o := benchEnforceOptions{}
	cmd := &cobra.Command{
		Use:   "enforce",
		Short: "Produce → quota decision latency and overshoot at a fixed rate (docs/design.md §10: p99 ≤ 2s at 20k records/s)",
		Long: `Produce --rate records/s for --duration, spread over --customers customers with
one quota each (limits crossed at staggered times), to an embedded broker;
the real ingest consumer, ledger and quota enforcer run with their defaults
(except --interval); a kafka-go reader consumes tally.quota-decisions as a
gateway would. Prints produce → decision latency p50/p99 over every crossing
of warn_at and of the limit, and the overshoot past the limit when the
decision flipped, against rate × lag.

The run uses a database of its own on the server of --database-url,
dropped afterwards (unless --keep).`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			return benchEnforce(cmd.Context(), cmd.OutOrStdout(), o)
		},
	}
	f := cmd.Flags()
	f.IntVar(&o.customers, "customers", 100, "customers, one meter and one quota each")
	f.IntVar(&o.rate, "rate", 20000, "records per second, all customers together")
	f.IntVar(&o.partitions, "partitions", 4, "partitions of the benchmark topics")
	f.DurationVar(&o.duration, "duration", 20*time.Second, "how long to produce")
	f.DurationVar(&o.interval, "interval", quota.DefaultInterval, "the enforcer's evaluation interval")
	f.StringVar(&o.adminURL, "database-url", defaultDatabaseURL, "Postgres server to create the benchmark database on")
	envDefault(f, "database-url", "TALLY_DATABASE_URL")
	f.BoolVar(&o.keep, "keep", false, "keep the benchmark database")
	f.BoolVar(&o.alerts, "alerts", false, "also alert on every customer at 80% and 100% of its quota to an in-process webhook, and report ingest transaction → webhook request")
	return cmd
}

func benchEnforce(ctx context.Context, out io.Writer, o benchEnforceOptions) error {
	log := slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelWarn}))
	k, err := devstack.StartKafka(devstack.KafkaConfig{Addr: "127.0.0.1:0",
		Topics: []string{quota.DefaultIngestTopic, quota.DefaultTopic}, Partitions: int32(o.partitions)})
	if err != nil {
		return err
	}
	defer k.Close()
	pool, _, done, err := benchDB(ctx, o.adminURL, "tally_bench", o.keep, log)
	if err != nil {
		return err
	}
	defer done()
	fmt.Fprintf(out, "tally bench enforce: %d records/s for %v over %d customers, %d partitions, enforcer interval %v, embedded broker %s\n",
		o.rate, o.duration, o.customers, o.partitions, o.interval, k.Addr)
	r, err := enforcebench.Run(ctx, enforcebench.Options{Pool: pool, Brokers: []string{k.Addr},
		DecisionPartitions: o.partitions, Customers: o.customers, Rate: o.rate, Duration: o.duration,
		Interval: o.interval, Logger: log, Alerts: o.alerts})
	if err != nil {
		return err
	}
	r.Report(out)
	if len(r.Missing) > 0 {
		return fmt.Errorf("bench enforce: %d crossings got no decision", len(r.Missing))
	}
	if _, _, _, missing := r.AlertLatency(); o.alerts && missing > 0 {
		return fmt.Errorf("bench enforce --alerts: %d crossings got no webhook", missing)
	}
	return nil
}
