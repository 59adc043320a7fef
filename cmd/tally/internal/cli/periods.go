package cli

import (
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"slices"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/shopspring/decimal"
	"github.com/spf13/cobra"

	"github.com/tally-ledger/tally/ledger"
	"github.com/tally-ledger/tally/periods"
	"github.com/tally-ledger/tally/reconcile"
)

func newPeriodsCmd() *cobra.Command {
	var dbURL string
	var grace time.Duration
	cmd := &cobra.Command{
		Use:   "periods",
		Short: "List a customer's accounting periods and close them",
		Long: `Accounting periods follow each customer's billing calendar. A period is
open until its end, then in grace (late usage still lands in it) for
--grace, then awaiting close. Closing freezes its statement: usage for it
that arrives later is billed in the current period as a prior-period
adjustment, and the closed statement never changes.`,
	}
	cmd.PersistentFlags().StringVar(&dbURL, "database-url", defaultDatabaseURL, "Postgres connection URL")
	envDefault(cmd.PersistentFlags(), "database-url", "TALLY_DATABASE_URL")
	cmd.PersistentFlags().DurationVar(&grace, "grace", periods.DefaultGrace, "how long after its end a period takes late usage before it is due for closing")
	envDefault(cmd.PersistentFlags(), "grace", "TALLY_GRACE")

	// The same gate as the API and the console: a close without --force
	// needs a clean reconciliation run of the period.
	store := func() periods.Store {
		return periods.Store{Grace: periods.GraceSetting(grace), Gate: reconcile.Gate, Kinds: ledger.StatementKinds}
	}
	open := func(cmd *cobra.Command) (*pgxpool.Pool, error) {
		if err := periods.ValidateGrace(grace); err != nil {
			return nil, usageError(err)
		}
		return pgxpool.New(cmd.Context(), dbURL)
	}

	var customer string
	list := &cobra.Command{
		Use:   "list --customer C",
		Short: "List a customer's periods with their state and billed total",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if err := checkCustomerFlag(cmd, customer); err != nil {
				return usageError(err)
			}
			pool, err := open(cmd)
			if err != nil {
				return err
			}
			defer pool.Close()
			ps, err := store().List(cmd.Context(), pool, customer)
			if err != nil {
				return err
			}
			tw := tabwriter.NewWriter(cmd.OutOrStdout(), 0, 4, 2, ' ', 0)
			fmt.Fprintln(tw, "PERIOD\tSTART (UTC)\tEND (UTC)\tSTATE\tBILLED")
			for _, p := range ps {
				fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\n", p.Name, p.Start.Format(time.RFC3339), p.End.Format(time.RFC3339), p.State, billedText(p.Billed))
			}
			return tw.Flush()
		},
	}
	list.Flags().StringVar(&customer, "customer", "", "customer id (required)")
	_ = list.MarkFlagRequired("customer")

	var req periods.CloseRequest
	closeCmd := &cobra.Command{
		Use:   "close --customer C --period P [--force --reason R --actor A]",
		Short: "Close a period and print its frozen statement (JSON)",
		Long: `Close a customer's period and print its frozen statement as JSON.
The period must have ended. Without --force its grace must have ended too
(late usage still lands in a period in grace) and it needs a clean
reconciliation run that nothing has invalidated since; --force closes
anyway and records --reason and --actor. Closing a closed period prints the
statement it was closed with.`,
		Example: `  tally periods close --customer acme --period 2026-11-01 --force --reason "migrated from old system" --actor alice`,
		Args:    cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if err := checkCustomerFlag(cmd, req.Customer); err != nil {
				return usageError(err)
			}
			if err := periods.CheckRef(req.Period); err != nil {
				return usageError(err)
			}
			// What the store would refuse, named as flags, before the
			// database is opened.
			if req.Force && (req.Reason == "" || req.Actor == "") {
				return usageError(errors.New("--force needs --reason and --actor (both recorded with the close)"))
			}
			pool, err := open(cmd)
			if err != nil {
				return err
			}
			defer pool.Close()
			var st periods.Statement
			err = pgx.BeginFunc(cmd.Context(), pool, func(tx pgx.Tx) error {
				st, err = store().Close(cmd.Context(), tx, req)
				return err
			})
			if err != nil {
				return err
			}
			enc := json.NewEncoder(cmd.OutOrStdout())
			enc.SetIndent("", "  ")
			return enc.Encode(st)
		},
	}
	f := closeCmd.Flags()
	f.StringVar(&req.Customer, "customer", "", "customer id (required)")
	f.StringVar(&req.Period, "period", "previous", "period: its start date (2026-11-01), or previous")
	f.BoolVar(&req.Force, "force", false, "close without a clean reconciliation run (needs --reason and --actor)")
	f.StringVar(&req.Reason, "reason", "", "why the close is forced (recorded)")
	f.StringVar(&req.Actor, "actor", "", "who forces the close (recorded)")
	_ = closeCmd.MarkFlagRequired("customer")

	cmd.AddCommand(list, closeCmd)
	return cmd
}

// billedText is a period's billed totals, one per counter meter in meter
// order ("api_calls=12 storage_gb=3.5"), or "-" when nothing is billed.
func billedText(billed map[string]decimal.Decimal) string {
	if len(billed) == 0 {
		return "-"
	}
	parts := make([]string, 0, len(billed))
	for _, m := range slices.Sorted(maps.Keys(billed)) {
		parts = append(parts, m+"="+billed[m].String())
	}
	return strings.Join(parts, " ")
}
