package cli

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"strings"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/spf13/cobra"

	"github.com/tally-ledger/tally/cmd/tally/internal/scenario"
	"github.com/tally-ledger/tally/producer"
)

func newProduceCmd() *cobra.Command {
	var (
		brokers, faults, expectPath string
		dbURL                       string
		rate                        float64
		crashes, bad                int
		verbose                     bool
	)
	cfg := scenario.Config{}
	fault := 0.05
	cmd := &cobra.Command{
		Use:   "produce",
		Short: "Generate metering load and faults with the producer SDK, and write the ground truth",
		Long: `Generate usage with the producer SDK: --producers producers each report usage of
--meters meters for --customers customers, from --workers goroutines each,
for --duration (or --records records), at --rate records/s (0: as fast as
acknowledged, every Record fsynced). Ids are prefixed with a run id, so runs
never mix.

--gauges N and --uniques N add N gauge meters (g1, g2, ...: a level of 0 to
50 in thousandths per producer, changing by random steps, through
RecordLevel; a customer's level is the sum over producers) and N unique
meters (u1, u2, ...: members user-0 to user-49, through RecordMember) per
customer. Their records are refused unless the meters are declared, so
produce first declares them in the ledger of --database-url (as PUT
/v1/meters/{meter} would; a meter already used with another kind is an
error). With --spread, gauge readings are stamped on a clock running from
now minus the spread to now over the run (a stream's readings go forward
in time); after the load every producer reads each customer's gauges once
more, so that Close ends every level with a final record.

Faults (--faults all, or a comma list of duplicates, retransmits, lost,
reorder, crashes, bad):
  duplicates   a message is written twice
  retransmits  a write succeeds but the producer is told it failed: it resends the same batch
  lost         a middle batch is acknowledged but never written (a counter's usage is in later
               totals: a gap; a lost gauge reading is not refilled, the level before it holds
               longer, and a lost member counts only if another reading saw it)
  reorder      a message is written after later ones (late fills)
  crashes      a producer stops abruptly; alternately its state survives (same epoch) or is wiped (new epoch,
               whose first reading of a customer's gauge ends the old epoch's level there)
  bad          raw messages ingest must dead-letter (malformed JSON, 10 decimals, wrong customer)

--expect FILE writes the ground truth: the exact total to bill per customer,
meter and period, each gauge's max, latest and unit_seconds and each unique
meter's distinct members per customer and period (from the readings that
reached Kafka), every stream's final state and open gaps, and the dead
letters. Check a ledger against it with: tally verify --expect FILE`,
		Example: `  tally produce --duration 10s --faults all --expect /tmp/expect.json
  tally produce --duration 10s --faults all --gauges 1 --uniques 1 --spread 1080h --expect /tmp/expect.json
  tally verify --expect /tmp/expect.json --wait 60s`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			cfg.Rate = rate
			f, err := parseFaults(faults, fault, cmd.Flags().Changed("crashes"), crashes, cmd.Flags().Changed("bad-messages"), bad)
			if err != nil {
				return usageError(err)
			}
			cfg.Faults = f
			// The scenario takes 0 for its defaults; here the defaults are
			// the flags', so a 0 would silently run with them.
			var errs []error
			if cfg.Brokers, err = parseBrokers(brokers, brokersFlag); err != nil {
				errs = append(errs, err)
			}
			for _, n := range []struct {
				flag string
				v    int
			}{{"producers", cfg.Producers}, {"customers", cfg.Customers}, {"meters", cfg.Meters}, {"workers", cfg.Workers}} {
				if n.v < 1 {
					errs = append(errs, fmt.Errorf("--%s must be at least 1, got %d", n.flag, n.v))
				}
			}
			if !finiteNonNegative(rate) {
				errs = append(errs, fmt.Errorf("--rate must be a number of records per second, 0 (as fast as acknowledged) or more, got %v", rate))
			}
			if !(fault >= 0 && fault <= 0.5) {
				errs = append(errs, fmt.Errorf("--fault-rate must be a probability from 0 to 0.5, got %v", fault))
			}
			if cfg.Linger <= 0 {
				errs = append(errs, fmt.Errorf("--linger must be positive, got %s", cfg.Linger))
			}
			if cfg.Duration == 0 && cfg.Records == 0 {
				errs = append(errs, errors.New("--duration 0 runs until --records records: give --records too"))
			}
			if len(errs) == 0 {
				errs = append(errs, cfg.Validate()) // the rest, and negatives
			}
			if err := errors.Join(errs...); err != nil {
				return usageError(err)
			}
			if cfg.Gauges > 0 || cfg.Uniques > 0 {
				if err := declareMeters(cmd.Context(), dbURL, cfg); err != nil {
					return err
				}
			}
			level := slog.LevelError
			if verbose {
				level = slog.LevelInfo
			}
			cfg.Logger = slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: level}))
			tty := stderrIsTTY()
			if tty {
				cfg.Progress = func(s scenario.Stats) {
					fmt.Fprintf(os.Stderr, "\r\033[Kproduce: %d records acknowledged (%.0f/s), %d messages, %d crashes",
						s.Records, s.RecordsPerSecond, s.Messages, s.Crashes)
				}
			}
			e, err := scenario.Run(cmd.Context(), cfg)
			if tty {
				fmt.Fprint(os.Stderr, "\r\033[K")
			}
			if e != nil && expectPath != "" {
				if werr := writeExpect(expectPath, e); werr != nil {
					return errors.Join(err, werr)
				}
			}
			if err != nil {
				return err
			}
			printRun(cmd.OutOrStdout(), e, expectPath)
			return nil
		},
	}
	fs := cmd.Flags()
	addBrokersFlag(fs, &brokers, "")
	fs.StringVar(&cfg.Topic, "topic", producer.DefaultTopic, "meter-batch topic")
	envDefault(fs, "topic", "TALLY_TOPIC")
	fs.IntVar(&cfg.Producers, "producers", 2, "producers (each with its own state directory and epochs)")
	fs.IntVar(&cfg.Customers, "customers", 3, "customers")
	fs.IntVar(&cfg.Meters, "meters", 2, "meters per customer")
	fs.IntVar(&cfg.Gauges, "gauges", 0, "gauge meters per customer (g1, g2, ...), declared in the ledger of --database-url")
	fs.IntVar(&cfg.Uniques, "uniques", 0, "unique meters per customer (u1, u2, ...), declared in the ledger of --database-url")
	fs.StringVar(&dbURL, "database-url", defaultDatabaseURL, "Postgres connection URL of the ledger, to declare the --gauges and --uniques meters")
	envDefault(fs, "database-url", "TALLY_DATABASE_URL")
	fs.IntVar(&cfg.Workers, "workers", 4, "goroutines calling Record on each producer")
	fs.Float64Var(&rate, "rate", 0, "records per second over all producers, 0 or more (0: as fast as they are acknowledged)")
	fs.DurationVar(&cfg.Duration, "duration", 10*time.Second, "how long to record usage")
	fs.Int64Var(&cfg.Records, "records", 0, "stop after this many records (or at --duration, whichever comes first; --duration 0 for records only)")
	fs.DurationVar(&cfg.Spread, "spread", 0, "spread occurred_at over this much of the past (e.g. 1080h covers several monthly periods)")
	fs.StringVar(&cfg.Dir, "dir", "", "directory for the producers' state (default: a temporary directory, removed at the end)")
	fs.Uint64Var(&cfg.Seed, "seed", 0, "random seed for quantities and faults (0: random)")
	fs.StringVar(&cfg.Run, "run", "", "run id prefixing producer and customer ids (default: random)")
	fs.DurationVar(&cfg.Linger, "linger", 50*time.Millisecond, "producer Linger: how long a record waits for more to share its message")
	fs.StringVar(&faults, "faults", "", "faults to inject: all, or a comma list of duplicates,retransmits,lost,reorder,crashes,bad")
	fs.Float64Var(&fault, "fault-rate", 0.05, "probability per message of each probabilistic fault, from 0 to 0.5 (each one also happens at its first chance)")
	fs.IntVar(&crashes, "crashes", 2, "producer crashes when crashes are on")
	fs.IntVar(&bad, "bad-messages", 3, "bad messages when bad is on")
	fs.StringVar(&expectPath, "expect", "", "write the ground truth (JSON) to this file")
	fs.BoolVar(&verbose, "verbose", false, "log the producers' retries and restarts")
	return cmd
}

// declareMeters declares the run's gauge and unique meters in the ledger
// at dbURL.
func declareMeters(ctx context.Context, dbURL string, cfg scenario.Config) error {
	pool, err := pgxpool.New(ctx, dbURL)
	if err != nil {
		return fmt.Errorf("--database-url: %w", err)
	}
	defer pool.Close()
	if err := scenario.DeclareMeters(ctx, pool, cfg); err != nil {
		return fmt.Errorf("%w (--gauges and --uniques need the ledger's database: --database-url or TALLY_DATABASE_URL)", err)
	}
	return nil
}

func parseFaults(list string, rate float64, crashesSet bool, crashes int, badSet bool, bad int) (scenario.Faults, error) {
	var f scenario.Faults
	names := strings.Split(list, ",")
	if list == "all" {
		names = []string{"duplicates", "retransmits", "lost", "reorder", "crashes", "bad"}
	}
	for _, n := range names {
		switch strings.TrimSpace(n) {
		case "":
		case "duplicates":
			f.Duplicates = rate
		case "retransmits":
			f.Retransmits = rate
		case "lost":
			f.Lost = rate
		case "reorder":
			f.Reorder = rate
		case "crashes":
			f.Crashes = crashes
		case "bad":
			f.BadMessages = bad
		default:
			return f, fmt.Errorf("--faults: unknown fault %q; use all, or some of duplicates,retransmits,lost,reorder,crashes,bad", n)
		}
	}
	if crashesSet && f.Crashes == 0 && crashes > 0 {
		f.Crashes = crashes
	}
	if badSet && f.BadMessages == 0 && bad > 0 {
		f.BadMessages = bad
	}
	return f, nil
}

func writeExpect(path string, e *scenario.Expect) error {
	b, err := json.MarshalIndent(e, "", "  ")
	if err != nil {
		return err
	}
	if err := os.WriteFile(path, append(b, '\n'), 0o644); err != nil {
		return fmt.Errorf("--expect: %w", err)
	}
	return nil
}

func printRun(w io.Writer, e *scenario.Expect, expectPath string) {
	s := e.Stats
	gaps, periods := 0, map[string]bool{}
	for _, st := range e.Streams {
		gaps += len(st.Gaps)
	}
	for _, t := range e.Totals {
		periods[t.Period] = true
	}
	fmt.Fprintf(w, "run %s: %d records acknowledged (each fsynced) in %.1fs by %d producers: %.0f records/s\n",
		e.Run, s.Records, s.Seconds, s.Producers, s.RecordsPerSecond)
	fmt.Fprintf(w, "kafka: %d messages; faults: %d duplicated, %d retransmitted, %d lost (%d open gaps), %d reordered, %d crashes (%d epochs), %d bad messages\n",
		s.Messages, s.Duplicates, s.Retransmits, s.Lost, gaps, s.Reordered, s.Crashes, s.Epochs, s.BadMessages)
	fmt.Fprintf(w, "ground truth: %d customer/meter/period totals over %d periods, %d streams\n", len(e.Totals), len(periods), len(e.Streams))
	if len(e.Gauges) > 0 || len(e.Uniques) > 0 {
		fmt.Fprintf(w, "gauges and unique meters: %d customer/gauge/period aggregates, %d customer/unique-meter/period counts; %d readings lost\n",
			len(e.Gauges), len(e.Uniques), s.LostReadings)
	}
	if expectPath != "" {
		fmt.Fprintf(w, "wrote %s; check the ledger with: tally verify --expect %s --wait 60s\n", expectPath, expectPath)
	}
}

// stderrIsTTY: progress lines go to a terminal only.
func stderrIsTTY() bool {
	st, err := os.Stderr.Stat()
	return err == nil && st.Mode()&os.ModeCharDevice != 0
}
