// Package cli wires Tally's subcommands (one file each) with cobra.
package cli

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net/url"
	"os"
	"os/signal"
	"regexp"
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
		// Runs before every subcommand (none has a PersistentPreRun of
		// its own): a variable envDefault could not parse is an error.
		PersistentPreRunE: func(cmd *cobra.Command, _ []string) error { return envErrors(cmd) },
	}
	root.SetFlagErrorFunc(func(_ *cobra.Command, err error) error {
		return &ExitError{Code: exitUsage, Err: err}
	})
	root.AddCommand(newMigrateCmd(), newDevCmd())
	root.AddCommand(newServeCmd(), newBenchCmd())
	root.AddCommand(newPeriodsCmd())
	root.AddCommand(newReconcileCmd())
	root.AddCommand(newTokensCmd())
	root.AddCommand(newProduceCmd())
	root.AddCommand(newVerifyCmd())
	return root
}

// exitUsage is the exit code of an invalid flag or environment variable.
const exitUsage = 2

// envErrorKey is the flag annotation envDefault leaves on a flag whose
// environment variable does not parse.
const envErrorKey = "tally/env-error"

// envDefault makes a flag take its default from an environment variable and
// says so in --help. A variable that is set (even to "") and does not parse
// as the flag's type is an error naming it when the command runs (exit 2),
// never silently the built-in default, and --help says it is invalid. A
// password in a URL or keyword/value value is masked in --help and errors.
func envDefault(fs *pflag.FlagSet, name, env string) {
	f := fs.Lookup(name)
	f.Usage += fmt.Sprintf(" [$%s]", env)
	v, ok := os.LookupEnv(env)
	if !ok {
		return
	}
	if err := f.Value.Set(v); err != nil {
		msg := fmt.Sprintf("invalid value %q of $%s (for --%s): %v", maskSecrets(v), env, name, maskSecrets(err.Error()))
		_ = fs.SetAnnotation(name, envErrorKey, []string{msg})
		f.Usage += fmt.Sprintf(" (the %s value set is invalid)", env)
		return
	}
	f.DefValue = maskSecrets(v)
}

// envErrors returns the errors envDefault left on cmd's flags (its own and
// those it inherits).
func envErrors(cmd *cobra.Command) error {
	var errs []error
	cmd.Flags().VisitAll(func(f *pflag.Flag) {
		for _, msg := range f.Annotations[envErrorKey] {
			errs = append(errs, errors.New(msg))
		}
	})
	if len(errs) == 0 {
		return nil
	}
	return &ExitError{Code: exitUsage, Err: errors.Join(errs...)}
}

// kvPassword finds the password of a keyword/value connection string
// (password=secret or password='a secret').
var kvPassword = regexp.MustCompile(`(?i)(\bpassword\s*=\s*)('(?:[^'\\]|\\.)*'|[^\s]*)`)

// maskSecrets hides the password of a connection URL
// (postgres://user:secret@host/db) or keyword/value string.
func maskSecrets(v string) string {
	if u, err := url.Parse(v); err == nil && u.User != nil {
		if _, has := u.User.Password(); has {
			u.User = url.UserPassword(u.User.Username(), "xxxxx")
			return u.String()
		}
	}
	return kvPassword.ReplaceAllString(v, "${1}xxxxx")
}

func newLogger() *slog.Logger {
	return slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelInfo}))
}
