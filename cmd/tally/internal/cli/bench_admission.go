package cli

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"strconv"
	"strings"
	"time"

	"github.com/spf13/cobra"

	"github.com/tally-ledger/tally/cmd/tally/internal/bench/admissionbench"
	"github.com/tally-ledger/tally/quota"
)

// benchAdmissionOptions is `tally bench admission`: the options of the
// simulation plus where it runs.
type benchAdmissionOptions struct {
	sim      admissionbench.Options
	adminURL string
	keep     bool
	// hot is the hot-key run, chosen by --budgets (docs/design.md §13).
	hot     admissionbench.HotOptions
	budgets bool
	// rate is the rate-contract run, chosen by a contract given to --rate
	// (docs/design.md §17).
	rate         admissionbench.RateOptions
	rateContract bool
	cpuProfile   string
}

// rateFlag is --rate: a bare number is the trace's requests per second; a
// contract AMOUNT/PER[,burst=B] ("100/s,burst=200") chooses the
// rate-contract run (the burst defaults to twice the amount).
type rateFlag struct{ o *benchAdmissionOptions }

func (f rateFlag) Type() string { return "rate" }

func (f rateFlag) String() string {
	if f.o == nil {
		return ""
	}
	if f.o.rateContract {
		return fmt.Sprintf("%d/%s,burst=%d", f.o.rate.Amount, f.o.rate.Per, f.o.rate.Burst)
	}
	return strconv.Itoa(f.o.sim.Rate)
}

func (f rateFlag) Set(v string) error {
	amount, rest, contract := strings.Cut(v, "/")
	if !contract {
		n, err := strconv.Atoi(v)
		if err != nil || n <= 0 {
			return fmt.Errorf("%q is neither requests per second (a positive whole number) nor a contract such as 100/s,burst=200", v)
		}
		f.o.sim.Rate = n
		return nil
	}
	a, err := strconv.ParseInt(amount, 10, 64)
	if err != nil || a <= 0 {
		return fmt.Errorf("contract %q: the amount before / must be a positive whole number", v)
	}
	per, burst, hasBurst := strings.Cut(rest, ",")
	if per != "" && (per[0] < '0' || per[0] > '9') {
		per = "1" + per // "s" is "1s"
	}
	d, err := time.ParseDuration(per)
	if err != nil || d <= 0 {
		return fmt.Errorf("contract %q: the period after / must be a duration such as s, 1s or 500ms", v)
	}
	b := 2 * a
	if hasBurst {
		n, ok := strings.CutPrefix(burst, "burst=")
		if b, err = strconv.ParseInt(n, 10, 64); !ok || err != nil || b <= 0 {
			return fmt.Errorf("contract %q: write the burst as burst=N, N a positive whole number", v)
		}
	}
	f.o.rate.Amount, f.o.rate.Per, f.o.rate.Burst, f.o.rateContract = a, d, b, true
	return nil
}

func (o benchAdmissionOptions) Validate() error {
	sim := o.sim
	sim.DatabaseURL = "set by Run" // a database of its own, made by Run
	var errs []error
	if o.adminURL == "" {
		errs = append(errs, errors.New("--database-url is required"))
	}
	// The simulation takes 0 for its default; on the command line the
	// defaults are the flags', so a 0 is a mistake.
	for _, f := range []struct {
		name string
		zero bool
	}{{"gateways", sim.Gateways == 0}, {"customers", sim.Customers == 0}, {"rate", sim.Rate == 0},
		{"duration", sim.Duration == 0}, {"limit", sim.Limit == 0}, {"fixed-grant", sim.FixedGrant == 0}, {"burst", sim.Burst == 0},
		{"lag-interval", sim.LagInterval == 0}, {"lag-flush", sim.LagFlush == 0}, {"api-pool-size", o.hot.APIPoolSize == 0},
		{"rounds", sim.Rounds == 0}} {
		if f.zero {
			errs = append(errs, fmt.Errorf("--%s must not be 0", f.name))
		}
	}
	if o.budgets {
		hot := o.hot
		hot.DatabaseURL = "set by Run"
		if hot.Holders == 0 || hot.Duration == 0 || len(hot.Budgets) == 0 {
			errs = append(errs, errors.New("--budgets, --holders and --hot-duration must not be empty or 0"))
		}
		errs = append(errs, hot.Validate())
	}
	return errors.Join(append(errs, sim.Validate())...)
}

// Run creates a database of its own on the server of adminURL, runs every
// regime and prints the table.
func (o benchAdmissionOptions) Run(ctx context.Context, out io.Writer) error {
	if err := o.Validate(); err != nil {
		return usageError(err)
	}
	log := slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelWarn}))
	_, dbURL, done, err := benchDB(ctx, o.adminURL, "tally_bench", o.keep, log)
	if err != nil {
		return err
	}
	defer done()
	stop, err := startCPUProfile(o.cpuProfile)
	if err != nil {
		return err
	}
	defer stop()
	if o.budgets {
		return o.runHot(ctx, out, dbURL, log)
	}
	if o.rateContract {
		return o.runRate(ctx, out, dbURL, log)
	}
	sim := o.sim
	sim.DatabaseURL, sim.Logger, sim.APIPoolSize = dbURL, log, o.hot.APIPoolSize
	fmt.Fprintf(out, "tally bench admission: database %s; regimes %s, one after another%s\n", dbName(dbURL), strings.Join(sim.Regimes, ", "), roundsNote(sim.Rounds))
	r, err := admissionbench.Run(ctx, sim)
	if err != nil {
		return err
	}
	r.Report(out)
	for _, row := range r.Rows {
		if len(row.Problems) > 0 {
			return fmt.Errorf("bench admission: %s: %d invariant checks failed (above)", row.Regime, len(row.Problems))
		}
	}
	return nil
}

// runRate is the rate-contract run: --gateways gateways × one tenant.
func (o benchAdmissionOptions) runRate(ctx context.Context, out io.Writer, dbURL string, log *slog.Logger) error {
	r := o.rate
	r.DatabaseURL, r.Logger, r.RedisAddr, r.Seed = dbURL, log, o.sim.RedisAddr, o.sim.Seed
	fmt.Fprintf(out, "tally bench admission --rate %d/%s,burst=%d: database %s\n", o.rate.Amount, o.rate.Per, o.rate.Burst, dbName(dbURL))
	res, err := admissionbench.RunRate(ctx, r)
	if err != nil {
		return err
	}
	res.Report(out)
	return nil
}

// runHot is the hot-key run: --holders holders taking grants on the
// --budgets named, against the central counter, then a refusal by global.
func (o benchAdmissionOptions) runHot(ctx context.Context, out io.Writer, dbURL string, log *slog.Logger) error {
	h := o.hot
	h.DatabaseURL, h.Logger = dbURL, log
	fmt.Fprintf(out, "tally bench admission: database %s; hot key on %s\n", dbName(dbURL), strings.Join(h.Budgets, ","))
	r, err := admissionbench.RunHot(ctx, h)
	if err != nil {
		return err
	}
	r.Report(out)
	n := len(r.Refusal.Problems)
	for _, row := range r.Rows {
		n += len(row.Problems)
	}
	if n > 0 {
		return fmt.Errorf("bench admission --budgets: %d invariant checks failed (above)", n)
	}
	return nil
}

func newBenchAdmissionCmd() *cobra.Command {
	o := benchAdmissionOptions{}
	cmd := &cobra.Command{
		Use:   "admission",
		Short: "Exact admission's compromise in numbers: lagged decisions, grants and central counters side by side (docs/design.md §10, §12)",
		Long: `Replay one demand trace — --gateways gateways × --customers customers, Zipf-skewed
across customers (--skew), bursty in time (--burst), requests of cost 1 at
--rate per second for --duration — against a limit of --limit units per
customer for the period (the replay), under six regimes, one after another:

  lagged decisions          gateways admit until a decision says exceeded;
                            usage metered every --lag-flush, decided every
                            --lag-interval (today's path, docs/design.md §5)
  exact, fixed grant        the admit SDK through the REST API, each gateway
                            taking grants of --fixed-grant units per budget
  exact, sized by demand    the same with the SDK's demand sizing (--lookahead)
  central counter, Postgres one UPDATE … RETURNING per request, each gateway
                            on a Postgres connection of its own
  central counter, Postgres the same statement behind a service of its own:
    via HTTP                one HTTP call per request (a token, a JSON body)
                            to a handler on --api-pool-size connections, as
                            gateways without database credentials reach it;
                            beside the row above it says what the hop costs
  central counter, Redis    one Lua check-and-INCRBY per request against
                            --redis (the row is skipped when none answers)

For each: worst admitted ÷ limit, units over the limit, units stranded
(granted, unspent) at the end, false denials (refused while the customer's
admissions so far plus the request were within the limit: capacity sat
unspent in another gateway's grant), central calls per 1,000 admissions,
and admission latency p50/p99; calls and p99 also at steady demand, past
a warm-up of the first sixth of the replay (every customer's first
grants, new budget rows, new connections). Then each regime against the
targets. With --rounds N the regimes run N times, alternating, and each
regime's medians follow, with its p99 and CPU per request as multiples of
the Postgres counter's in the same round.

With --budgets (any of customer, pool, global) it measures the hot key
instead (docs/design.md §13): --holders concurrent holders, one customer
each, all customers in one pool, take grants of 1 drawing on the budgets
named and release them at once, for --hot-duration per row: through the
REST API (POST /v1/grants with gateway tokens), through the admission store
in process, the store's issue alone (grants left live), and as baseline a central Postgres counter (one UPDATE …
RETURNING over the same budgets, a connection per holder). It reports
grants/s and p50/p99 grant latency against the §10 target (≥ 2,000 grants/s
with 50 holders), checks that the budgets read back add up, then sets the
global limit to what global consumed and checks that every holder is
refused by global and that no customer's or pool's budget moved.

With a contract given to --rate (--rate 100/s,burst=200) it measures a rate
contract instead (docs/design.md §17): --gateways (default 20) gateways ×
one tenant of that contract; every second starts with a burst of B
requests at each gateway, plus 4 × the contract's rate spread
over the second. Four designs side by side: a local token bucket per
gateway (each enforcing the whole contract), a central counter per request
in Postgres and in Redis, and grants through the admit SDK. For each: the
worst window's admitted ÷ the §17 bound (burst + amount × (t2 − t1 + 1s +
max_skew) / per) and ÷ the bare contract, false denials (refused while one
exact bucket fed with what was admitted held a token), central calls per
1,000 admissions, and latency p50/p99.

The run uses a database of its own on the server of --database-url,
dropped afterwards (unless --keep). Redis is used by this benchmark only.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			o.budgets = cmd.Flags().Changed("budgets")
			if o.rateContract {
				// The rate run's own defaults unless given: 20 gateways, 5 s.
				o.rate.Gateways, o.rate.Duration = 20, 5*time.Second
				if cmd.Flags().Changed("gateways") {
					o.rate.Gateways = o.sim.Gateways
				}
				if cmd.Flags().Changed("duration") {
					o.rate.Duration = o.sim.Duration
				}
			}
			return o.Run(cmd.Context(), cmd.OutOrStdout())
		},
	}
	f := cmd.Flags()
	f.IntVar(&o.sim.Gateways, "gateways", 10, "simulated gateways")
	f.IntVar(&o.sim.Customers, "customers", 100, "customers, one budget each")
	o.sim.Rate = 2000
	f.Var(rateFlag{&o}, "rate", "requests per second, all customers together; or a rate contract AMOUNT/PER[,burst=B], e.g. 100/s,burst=200 (burst: twice the amount unless given), which runs the rate-contract comparison instead (docs/design.md §17)")
	f.DurationVar(&o.sim.Duration, "duration", 6*time.Second, "length of the replay (the period) per regime")
	f.Int64Var(&o.sim.Limit, "limit", 500, "units per customer for the period")
	f.Float64Var(&o.sim.Skew, "skew", 1.1, "Zipf exponent of demand across customers (0: even)")
	f.Float64Var(&o.sim.Burst, "burst", 4, "rate multiplier during a customer's bursts, a fifth of the time (1: no bursts, at most 5)")
	f.Int64Var(&o.sim.FixedGrant, "fixed-grant", 50, "units per gateway and budget in the fixed-grant regime")
	f.DurationVar(&o.sim.Lookahead, "lookahead", 0, "demand the sized regime's grants cover (0: the SDK's default, 2s)")
	f.DurationVar(&o.sim.LagInterval, "lag-interval", quota.DefaultInterval, "the lagged regime's decision interval (the enforcer's)")
	f.DurationVar(&o.sim.LagFlush, "lag-flush", 100*time.Millisecond, "how often the lagged regime meters admitted usage")
	f.StringVar(&o.sim.RedisAddr, "redis", "127.0.0.1:6379", `Redis for the central-counter row ("" skips it)`)
	f.Uint64Var(&o.sim.Seed, "seed", 1, "seed of the demand trace")
	f.IntVar(&o.sim.Rounds, "rounds", 1, "run the regimes this many times, alternating, and add each one's medians, its p99 and CPU per request ÷ the Postgres counter's in the same round (one replay's p99 moves with the machine's load)")
	f.StringSliceVar(&o.sim.Regimes, "regimes", admissionbench.RegimeKeys, "regimes to run, of lagged, fixed, sized, postgres, postgres-http, redis (they run in that order)")
	f.StringSliceVar(&o.hot.Budgets, "budgets", []string{"customer"}, "the hot-key run: budgets every grant draws on, of customer, pool, global (without it: the regimes above)")
	f.IntVar(&o.hot.Holders, "holders", 50, "the hot-key run: concurrent holders, one customer each")
	f.DurationVar(&o.hot.Duration, "hot-duration", 5*time.Second, "the hot-key run: length of each measured row")
	f.IntVar(&o.hot.APIPoolSize, "api-pool-size", 4, "Postgres connections of the REST API in the exact regimes and the hot-key run (as tally serve's --api-pool-size)")
	f.DurationVar(&o.rate.MaxSkew, "rate-max-skew", 100*time.Millisecond, "the rate-contract run: the rate rule's max_skew")
	f.StringVar(&o.adminURL, "database-url", defaultDatabaseURL, "Postgres server to create the benchmark database on")
	envDefault(f, "database-url", "TALLY_DATABASE_URL")
	f.BoolVar(&o.keep, "keep", false, "keep the benchmark database")
	f.StringVar(&o.cpuProfile, "cpuprofile", "", "write a CPU profile of this process (the gateways' SDK, the REST API and the replay; not Postgres) to this file")
	return cmd
}

// roundsNote says how many rounds run, when more than one.
func roundsNote(n int) string {
	if n > 1 {
		return fmt.Sprintf(", %d rounds", n)
	}
	return ""
}
