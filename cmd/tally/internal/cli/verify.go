package cli

import (
	"encoding/json"
	"fmt"
	"os"
	"strings"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/spf13/cobra"

	"github.com/tally-ledger/tally/cmd/tally/internal/scenario"
)

func newVerifyCmd() *cobra.Command {
	var dbURL, expectPath string
	var wait time.Duration
	cmd := &cobra.Command{
		Use:   "verify --expect FILE",
		Short: "Compare the ledger with the ground truth written by tally produce",
		Long: `Compare the ledger with the ground truth of a tally produce run: billed usage
per customer, meter and period (rollups); each gauge's max, latest and
unit_seconds and each unique meter's distinct members per customer and
period, read as the usage answer reads them; every stream's last seq, total
and final flag, open gaps, dead letters and conflicts of the run's customers.

Exit status 0 when everything matches, 3 when something differs (each
difference is printed), 1 on error, 2 for invalid flags or an --expect
file that cannot be read or is not a ground truth (no run id, no customers
or nothing to check). Ingest is asynchronous: --wait retries
until the ledger matches or the time is up.`,
		Example: `  tally verify --expect /tmp/expect.json --wait 60s`,
		Args:    cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			b, err := os.ReadFile(expectPath)
			if err != nil {
				return usageError(fmt.Errorf("--expect: %w", err))
			}
			var e scenario.Expect
			if err := json.Unmarshal(b, &e); err != nil {
				return usageError(fmt.Errorf("--expect %s: %w", expectPath, err))
			}
			if err := e.Check(); err != nil {
				return usageError(fmt.Errorf("--expect %s: %w", expectPath, err))
			}
			ctx := cmd.Context()
			pool, err := pgxpool.New(ctx, dbURL)
			if err != nil {
				return fmt.Errorf("database: %w", err)
			}
			defer pool.Close()
			deadline := time.Now().Add(wait)
			for {
				diffs, err := scenario.Verify(ctx, pool, &e)
				if err != nil {
					return err
				}
				if len(diffs) == 0 {
					gaps := 0
					for _, s := range e.Streams {
						gaps += len(s.Gaps)
					}
					dl := 0
					for _, n := range e.DeadLetters {
						dl += n
					}
					kinds := ""
					if len(e.Gauges) > 0 || len(e.Uniques) > 0 {
						kinds = fmt.Sprintf("%d gauge and %d unique-meter period aggregates, ", len(e.Gauges), len(e.Uniques))
					}
					fmt.Fprintf(cmd.OutOrStdout(), "clean: run %s: %d customer/meter/period totals, %s%d streams, %d open gaps and %d dead letters match the ledger\n",
						e.Run, len(e.Totals), kinds, len(e.Streams), gaps, dl)
					return nil
				}
				if !time.Now().Before(deadline) {
					n := fmt.Sprintf("%d differences", len(diffs))
					if len(diffs) == 1 {
						n = "1 difference"
					}
					fmt.Fprintf(cmd.OutOrStdout(), "run %s: %s between the ledger and %s:\n  %s\n",
						e.Run, n, expectPath, strings.Join(diffs, "\n  "))
					return &ExitError{Code: 3, Err: fmt.Errorf("verify: %s", n)}
				}
				select {
				case <-time.After(500 * time.Millisecond):
				case <-ctx.Done():
					return ctx.Err()
				}
			}
		},
	}
	fs := cmd.Flags()
	fs.StringVar(&expectPath, "expect", "", "ground truth written by tally produce --expect (required)")
	_ = cmd.MarkFlagRequired("expect")
	fs.StringVar(&dbURL, "database-url", defaultDatabaseURL, "Postgres connection URL")
	envDefault(fs, "database-url", "TALLY_DATABASE_URL")
	fs.DurationVar(&wait, "wait", 0, "keep checking until the ledger matches or this much time passed (ingest is asynchronous)")
	return cmd
}
