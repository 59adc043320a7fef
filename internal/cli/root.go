// Package cli wires Tally's subcommands (one file each) with cobra.
package cli

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"os/signal"
	"syscall"

	"github.com/spf13/cobra"
	"github.com/spf13/pflag"
)

// ExitError carries a specific exit code (reconcile uses 3 for discrepancies).
type ExitError struct {
	Code int
	Err  error
}

func (e *ExitError) Error() string { return e.Err.Error() }
func (e *ExitError) Unwrap() error { return e.Err }

// Main runs the CLI and returns the process exit code.
func Main(args []string) int {
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGINT, syscall.SIGTERM)
	defer stop()
	root := newRoot()
	root.SetArgs(args)
	if err := root.ExecuteContext(ctx); err != nil {
		fmt.Fprintln(os.Stderr, "tally:", err)
		var ee *ExitError
		if errors.As(err, &ee) {
			return ee.Code
		}
		return 1
	}
	return 0
}

func newRoot() *cobra.Command {
	root := &cobra.Command{
		Use:   "tally",
		Short: "Tally: a durable metering ledger for usage-based billing",
		Long: `Tally applies metering batches from Kafka exactly once to a Postgres ledger,
attributes usage to each customer's accounting period, and reconciles
every period before it is billed.

Start here:  tally dev        (everything embedded, for trying it out)
Production:  tally migrate && tally serve

Every flag can also be set with the environment variable shown in its help.`,
		SilenceUsage:  true,
		SilenceErrors: true,
	}
	root.AddCommand(newMigrateCmd(), newDevCmd())
	root.AddCommand(newServeCmd(), newBenchCmd())
	root.AddCommand(newPeriodsCmd())
	root.AddCommand(newReconcileCmd())
	root.AddCommand(newTokensCmd())
	root.AddCommand(newProduceCmd())
	root.AddCommand(newVerifyCmd())
	return root
}

// envDefault makes a flag take its default from an environment variable and
// says so in --help.
func envDefault(fs *pflag.FlagSet, name, env string) {
	f := fs.Lookup(name)
	f.Usage += fmt.Sprintf(" [$%s]", env)
	if v, ok := os.LookupEnv(env); ok {
		if err := f.Value.Set(v); err == nil {
			f.DefValue = v
		}
	}
}

func newLogger() *slog.Logger {
	return slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelInfo}))
}
