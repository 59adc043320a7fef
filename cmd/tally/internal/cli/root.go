// Package cli wires Tally's subcommands (one file each) with cobra.
package cli

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"math"
	"net/url"
	"os"
	"os/signal"
	"regexp"
	"strings"
	"syscall"

	"github.com/spf13/cobra"
	"github.com/spf13/pflag"

	"github.com/tally-ledger/tally/internal/ids"
)

// ExitError carries a specific exit code (reconcile uses 3 for discrepancies,
// usageError 2).
type ExitError struct {
	Code int
	Err  error
}

func (e *ExitError) Error() string { return e.Err.Error() }
func (e *ExitError) Unwrap() error { return e.Err }

// exitUsage is the exit code of a usage error: an invalid, missing or
// conflicting flag, environment variable or argument, or an unknown
// command.
const exitUsage = 2

// usageError marks err (nil stays nil) as a usage error, found before
// anything ran: the command exits 2.
func usageError(err error) error {
	if err == nil {
		return nil
	}
	return &ExitError{Code: exitUsage, Err: err}
}

// Main runs the CLI and returns the process exit code.
func Main(args []string) int {
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGINT, syscall.SIGTERM)
	defer stop()
	go func() {
		// The first signal stops the command gracefully; from then on a
		// signal has its default effect: a second one ends the process
		// at once (every write is a transaction: nothing half-done stays).
		<-ctx.Done()
		stop()
		// A signal's cause matches context.Canceled under errors.Is; the
		// command's own end cancels with context.Canceled itself.
		if cause := context.Cause(ctx); cause != nil && cause != context.Canceled {
			fmt.Fprintf(os.Stderr, "tally: %v: stopping (a second signal ends the process at once)\n", cause)
		}
	}()
	return execute(ctx, args, os.Stdout, os.Stderr)
}

// execute runs the CLI with args, printing an error on stderr, and returns
// the exit code: an ExitError's code, else 1 for an error and 0 for none.
func execute(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	root := newRoot()
	root.SetArgs(args)
	root.SetOut(stdout)
	root.SetErr(stderr)
	err := root.ExecuteContext(ctx)
	if err == nil {
		return 0
	}
	fmt.Fprintln(stderr, "tally:", err)
	var ee *ExitError
	if errors.As(err, &ee) {
		return ee.Code
	}
	return 1
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

Every configuration flag (addresses, topics, tokens, timings) can also be set
with the environment variable shown in its help; a run's arguments (a
customer, a period, a reason) and the benchmarks' parameters are flags only.`,
		SilenceUsage:  true,
		SilenceErrors: true,
		// Runs before every subcommand (none has a PersistentPreRun of
		// its own): a variable envDefault could not parse, a required flag
		// not given or flags given together that exclude each other are
		// usage errors. (cobra checks the flags again after this, and
		// would return its errors as they are: exit 1.)
		PersistentPreRunE: func(cmd *cobra.Command, _ []string) error {
			if err := envErrors(cmd); err != nil {
				return err
			}
			if err := cmd.ValidateRequiredFlags(); err != nil {
				return usageError(err)
			}
			return usageError(cmd.ValidateFlagGroups())
		},
	}
	root.SetFlagErrorFunc(func(_ *cobra.Command, err error) error { return usageError(err) })
	root.AddCommand(newMigrateCmd(), newDevCmd())
	root.AddCommand(newServeCmd(), newBenchCmd())
	root.AddCommand(newPeriodsCmd())
	root.AddCommand(newReconcileCmd())
	root.AddCommand(newTokensCmd())
	root.AddCommand(newProduceCmd())
	root.AddCommand(newVerifyCmd())
	// cobra adds its completion command only as it executes, past
	// checkArgs: added now, "tally completion bogus" is refused too.
	root.InitDefaultCompletionCmd()
	checkArgs(root)
	return root
}

// checkArgs makes every argument error of cmd and its subcommands a usage
// error. A command that only groups others (tokens, bench...) prints its
// help when given no argument, and refuses an unknown subcommand, naming
// it and the valid ones; cobra would print the help and exit 0.
func checkArgs(cmd *cobra.Command) {
	for _, c := range cmd.Commands() {
		checkArgs(c)
	}
	if !cmd.Runnable() && cmd.HasSubCommands() {
		cmd.RunE = func(cmd *cobra.Command, _ []string) error { return cmd.Help() }
	}
	validate := cmd.Args
	cmd.Args = func(cmd *cobra.Command, args []string) error {
		if len(args) > 0 && cmd.HasAvailableSubCommands() && (validate == nil || validate(cmd, args) != nil) {
			var valid []string
			for _, c := range cmd.Commands() {
				if c.IsAvailableCommand() {
					valid = append(valid, c.Name())
				}
			}
			return usageError(fmt.Errorf("unknown command %q for %q; valid commands: %s (see %s --help)",
				args[0], cmd.CommandPath(), strings.Join(valid, ", "), cmd.CommandPath()))
		}
		if validate == nil {
			return nil
		}
		err := validate(cmd, args)
		name := strings.TrimPrefix(cmd.CommandPath(), cmd.Root().Name()+" ")
		if err != nil && len(args) > 0 && validate(cmd, nil) == nil && validate(cmd, args[:1]) != nil {
			return usageError(fmt.Errorf("%s takes no arguments, got %q (usage: %s)", name, args[0], cmd.UseLine()))
		}
		if err != nil {
			return usageError(fmt.Errorf("%s: %w (usage: %s)", name, err, cmd.UseLine()))
		}
		return nil
	}
}

// checkCustomerFlag refuses a --customer given that is not a customer id
// (a usage error). An empty one (--customer "$C" with C unset) would
// otherwise read as no customer given: every customer, which for
// reconcile --close closes every customer's period.
func checkCustomerFlag(cmd *cobra.Command, customer string) error {
	if !cmd.Flags().Changed("customer") || ids.Valid(customer) {
		return nil
	}
	return fmt.Errorf("--customer: %q is not %s", customer, ids.Rule)
}

// finiteNonNegative reports whether v, the value of a float flag, is a
// number, 0 or more: the flag parses "NaN", "Inf" and "-1" too.
func finiteNonNegative(v float64) bool {
	return v >= 0 && !math.IsInf(v, 1)
}

// envErrorKey is the flag annotation envDefault leaves on a flag whose
// environment variable does not parse.
const envErrorKey = "tally/env-error"

// envDefault makes a flag take its default from an environment variable and
// says so in --help. A variable that is set (even to "") and does not parse
// as the flag's type is an error naming it when the command runs (exit 2),
// never silently the built-in default, and --help says it is invalid. A
// string flag with a built-in default (a topic, an address, a directory,
// the database URL) cannot be empty: set so, the variable is such an
// error, and the flag given "" is refused as any invalid value is (an
// empty value silently meant the built-in default, or libpq's defaults for
// the database URL). A password in a URL or keyword/value value is masked
// in --help and errors.
func envDefault(fs *pflag.FlagSet, name, env string) {
	envDefaultOf(fs, name, env, false)
}

// envDefaultMayBeEmpty is envDefault for a string flag whose empty value
// means something of its own: an empty TALLY_KAFKA_BROKERS names no
// broker, which a command refuses only when it needs one.
func envDefaultMayBeEmpty(fs *pflag.FlagSet, name, env string) {
	envDefaultOf(fs, name, env, true)
}

func envDefaultOf(fs *pflag.FlagSet, name, env string, mayBeEmpty bool) {
	f := fs.Lookup(name)
	f.Usage += fmt.Sprintf(" [$%s]", env)
	if !mayBeEmpty && f.Value.Type() == "string" && f.DefValue != "" {
		f.Value = notEmpty{Value: f.Value, def: maskSecrets(f.DefValue)}
	}
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

// notEmpty is a string flag's value that refuses "".
type notEmpty struct {
	pflag.Value
	def string // the built-in default, for the error
}

func (n notEmpty) Set(v string) error {
	if v == "" {
		return fmt.Errorf("must not be empty (leave it out for the default, %s)", n.def)
	}
	return n.Value.Set(v)
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
