package cli

import (
	"errors"
	"fmt"
	"os"
	"strings"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/spf13/cobra"

	"github.com/tally-ledger/tally/periods"
	"github.com/tally-ledger/tally/reconcile"
)

func newReconcileCmd() *cobra.Command {
	var (
		dbURL   string
		grace   time.Duration
		opt     reconcile.Options
		nightly bool
		format  string
		brokers string
		topic   string
	)
	cmd := &cobra.Command{
		Use:   "reconcile (--period P [--customer C] [--close] [--deep] | --nightly)",
		Short: "Check an accounting period before it is billed, and close it",
		Long: `Reconcile checks every number of an accounting period: rollups against
ledger entries, stream totals, open gaps, conflicts and dead letters, late
usage, abandoned streams and ingest conservation counters. It stores the
run and prints a report.

--nightly reconciles every period whose grace has ended and that is not
closed yet (each customer's, from its calendar, empty ones included),
closes the clean ones, and checks the current periods.

A dead letter of a customer the ledger does not know, or an offset jump
(messages deleted before ingest read them), blocks every close it could
touch until it is replayed or accepted: see "tally reconcile accept".

Exit codes: 0 clean, 3 discrepancies found, 1 error, 2 invalid flags or
arguments (nothing was run). Safe to re-run; runs for the same period never
overlap.`,
		Example: `  tally reconcile --period 2026-11-01
  tally reconcile --period 2026-11-01 --customer acme --format csv > acme.csv
  tally reconcile --nightly        # from cron: 30 2 * * *`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			// Every flag is checked before anything is run, stored or closed.
			var errs []error
			if nightly == (opt.Period != "") {
				errs = append(errs, errors.New("give either --period or --nightly"))
			}
			if nightly {
				for _, name := range []string{"customer", "close", "deep"} {
					if cmd.Flags().Changed(name) {
						errs = append(errs, fmt.Errorf("--%s goes with --period, not --nightly (which closes what it finds clean, for every customer)", name))
					}
				}
			}
			if err := reconcile.ValidateFormat(format); err != nil {
				errs = append(errs, fmt.Errorf("--format: %w", err))
			}
			if err := periods.ValidateGrace(grace); err != nil {
				errs = append(errs, err)
			}
			var deep []string
			if opt.Deep {
				var err error
				if deep, err = parseBrokers(brokers, brokersFlag); err != nil {
					errs = append(errs, err)
				}
			}
			if !nightly {
				if err := checkCustomerFlag(cmd, opt.Customer); err != nil {
					errs = append(errs, err)
				}
			}
			if !nightly && opt.Period != "" {
				if err := periods.CheckRef(opt.Period); err != nil {
					errs = append(errs, err)
				}
			}
			if err := errors.Join(errs...); err != nil {
				return usageError(err)
			}
			pool, err := pgxpool.New(cmd.Context(), dbURL)
			if err != nil {
				return fmt.Errorf("database: %w", err)
			}
			defer pool.Close()
			cfg := reconcile.Config{Pool: pool, Logger: newLogger(), Grace: periods.GraceSetting(grace)}
			if opt.Deep {
				cfg.Deep = reconcile.KafkaSource{Brokers: deep, Topic: topic}
			}
			if isTerminal(os.Stderr) {
				cfg.Progress = os.Stderr
			}
			rc, err := reconcile.New(cfg)
			if err != nil {
				return err
			}
			// The first run that is not clean, for the exit status.
			var unclean error
			note := func(r *reconcile.Run) {
				if unclean == nil && r.Status != reconcile.StatusClean {
					unclean = &ExitError{Code: 3, Err: fmt.Errorf("period %s: %d discrepancies (run %s)", r.Period, r.Discrepancies(), r.ID)}
				}
			}
			var werr error
			if nightly {
				// Each run's report as it ends (a job after an outage has
				// hundreds of periods due: none is held until the last
				// ends); an array in JSON, however many periods were due.
				// No run at all (it always checks the current periods):
				// it never started, and the error says why. A report
				// that cannot be written stops the report, not the job.
				rw, rerr := reconcile.NewReportWriter(cmd.OutOrStdout(), format)
				if rerr != nil {
					return usageError(rerr)
				}
				wrote := false
				err = rc.NightlyEach(cmd.Context(), func(r *reconcile.Run) error {
					note(r)
					if werr == nil {
						werr, wrote = rw.Write(r), true
					}
					return nil
				})
				if werr == nil && wrote {
					werr = rw.Close()
				}
			} else {
				var run *reconcile.Run
				run, err = rc.Run(cmd.Context(), opt)
				if run != nil { // else it never started: no report, the error says why
					note(run)
					werr = reconcile.WriteReport(cmd.OutOrStdout(), format, run)
				}
			}
			if werr != nil {
				return werr
			}
			if err != nil {
				return err
			}
			return unclean
		},
	}
	f := cmd.Flags()
	f.StringVar(&opt.Period, "period", "", "period to reconcile: its start date (2026-11-01), previous or current")
	f.StringVar(&opt.Customer, "customer", "", "only this customer (default: every customer with that period)")
	f.BoolVar(&opt.Close, "close", false, "close the period of each customer found clean whose grace has ended")
	f.BoolVar(&opt.Deep, "deep", false, "also re-read the topic from Kafka, up to what ingest has applied, and recompute usage and stream totals independently")
	f.BoolVar(&nightly, "nightly", false, "reconcile and close every period whose grace has ended; check current periods")
	f.StringVar(&format, "format", "text", "report format: text, json or csv")
	addBrokersFlag(f, &brokers, "for --deep")
	f.StringVar(&topic, "topic", "tally.meter-batches", "metering topic for --deep")
	envDefault(f, "topic", "TALLY_TOPIC")
	f.StringVar(&dbURL, "database-url", defaultDatabaseURL, "Postgres connection URL")
	envDefault(f, "database-url", "TALLY_DATABASE_URL")
	f.DurationVar(&grace, "grace", periods.DefaultGrace, "how long after its end a period takes late usage")
	envDefault(f, "grace", "TALLY_GRACE")
	cmd.AddCommand(newReconcileAcceptCmd())
	return cmd
}

func newReconcileAcceptCmd() *cobra.Command {
	var dbURL, deadLetter, jump string
	var a reconcile.Acceptance
	cmd := &cobra.Command{
		Use:   "accept (--dead-letter ID | --offset-jump ID) --actor A --reason R",
		Short: "Accept a loss that no replay will undo, so it stops blocking closes",
		Long: `An unreplayed dead letter of a customer the ledger does not know, and an
offset jump (Kafka deleted messages before ingest read them), block every
close they could touch. When the loss stands (test traffic, a producer
that will resend, a topic that was meant to be empty), accept it: the
acceptance is recorded with --actor and --reason; nothing billed changes.
Then reconcile again.`,
		Example: `  tally reconcile accept --dead-letter 019a3c8e-7a40-7000-8000-0000000000d1 --actor alice --reason "load test traffic"`,
		Args:    cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			var errs []error
			ref := deadLetter
			a.Kind = reconcile.AcceptDeadLetter
			if jump != "" {
				ref, a.Kind = jump, reconcile.AcceptOffsetJump
			}
			if (deadLetter == "") == (jump == "") {
				errs = append(errs, errors.New("give either --dead-letter or --offset-jump"))
			} else if id, err := uuid.Parse(ref); err != nil {
				errs = append(errs, fmt.Errorf("--%s: %w", strings.ReplaceAll(a.Kind, "_", "-"), err))
			} else {
				a.ID = id
			}
			if a.Actor == "" {
				errs = append(errs, errors.New("--actor is required"))
			}
			if a.Reason == "" {
				errs = append(errs, errors.New("--reason is required"))
			}
			if err := errors.Join(errs...); err != nil {
				return usageError(err)
			}
			pool, err := pgxpool.New(cmd.Context(), dbURL)
			if err != nil {
				return fmt.Errorf("database: %w", err)
			}
			defer pool.Close()
			if err := reconcile.Accept(cmd.Context(), pool, a); err != nil {
				return err
			}
			fmt.Fprintf(cmd.OutOrStdout(), "accepted %s %s (%s: %s); reconcile again to close\n", a.Kind, a.ID, a.Actor, a.Reason)
			return nil
		},
	}
	f := cmd.Flags()
	f.StringVar(&deadLetter, "dead-letter", "", "id of the dead letter to accept")
	f.StringVar(&jump, "offset-jump", "", "id of the offset jump to accept")
	f.StringVar(&a.Actor, "actor", "", "who accepts the loss (recorded)")
	f.StringVar(&a.Reason, "reason", "", "why the loss stands (recorded)")
	f.StringVar(&dbURL, "database-url", defaultDatabaseURL, "Postgres connection URL")
	envDefault(f, "database-url", "TALLY_DATABASE_URL")
	return cmd
}

// isTerminal reports whether f is a terminal (progress lines go there only).
func isTerminal(f *os.File) bool {
	st, err := f.Stat()
	return err == nil && st.Mode()&os.ModeCharDevice != 0
}
