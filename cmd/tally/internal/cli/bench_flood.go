package cli

import (
	"context"
	"crypto/rand"
	"encoding/base64"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"os"
	"runtime"
	"time"

	"github.com/spf13/cobra"

	"github.com/tally-ledger/tally/cmd/tally/internal/bench/floodbench"
	"github.com/tally-ledger/tally/cmd/tally/internal/devstack"
	"github.com/tally-ledger/tally/ingest"
)

type benchFloodOptions struct {
	records, perMessage, partitions int
	rounds, conns, methods          int
	saturation, warmup              time.Duration
	adminURL, dbPrefix              string
	keep, onePool                   bool
}

func newBenchFloodCmd() *cobra.Command {
	o := benchFloodOptions{}
	cmd := &cobra.Command{
		Use:   "flood",
		Short: "Ingest under a flood of made-up API tokens, against the same request load to /healthz",
		Long: `Run tally serve's ingest, API and enforcer (its own code path and pools, with
the per-address rate limit off, as behind a proxy) on an embedded broker and
a fresh database, then:

 1. measure the API's saturation: a load generator (a separate process) on
    --conns keep-alive connections sends requests with a new random
    well-formed customer token each (every one costs a Postgres query) as
    fast as they are answered, for --saturation;
 2. in --rounds rounds, alternating, ingest --records records while the
    generator sends, at half the saturation rate and on --conns
    connections, either the same made-up-token requests (flood) or the same
    number of requests to /healthz, which touches no database (CPU-only
    load of the same size); report records/s, the enforcer's evaluations
    per second and its largest lag, and the medians' ratio (target: flood ≥
    0.8 × CPU-only);
 3. send --methods requests, each with a method name never used before, and
    report the process's heap and its number of HTTP series before and
    after (target: flat).

The database is created on the server of --database-url and dropped
afterwards (unless --keep).`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			return benchFlood(cmd.Context(), cmd.OutOrStdout(), o)
		},
	}
	f := cmd.Flags()
	f.IntVar(&o.records, "records", 100_000, "records ingested per measurement")
	f.IntVar(&o.perMessage, "per-message", 1000, "records per Kafka message")
	f.IntVar(&o.partitions, "partitions", 4, "partitions of the ingest topic")
	f.IntVar(&o.rounds, "rounds", 2, "rounds of the two measurements (flood, CPU-only), interleaved; medians are compared")
	f.IntVar(&o.conns, "conns", 200, "connections of the load generator")
	f.IntVar(&o.methods, "methods", 1_000_000, "requests with distinct method names in the memory check (0: skip)")
	f.DurationVar(&o.saturation, "saturation", 10*time.Second, "how long to measure the API's saturation rate")
	f.DurationVar(&o.warmup, "warmup", 2*time.Second, "load before each ingest measurement starts")
	f.StringVar(&o.adminURL, "database-url", defaultDatabaseURL, "Postgres server to create the benchmark database on")
	envDefault(f, "database-url", "TALLY_DATABASE_URL")
	f.StringVar(&o.dbPrefix, "database-prefix", "tally_bench_flood", "prefix of the benchmark database's name")
	f.BoolVar(&o.keep, "keep", false, "keep the benchmark database")
	f.BoolVar(&o.onePool, "one-pool", false, "run ingest, API and enforcer on one pool (the ingest's), as before they had their own: the comparison without bulkheads")
	cmd.AddCommand(newBenchLoadCmd())
	return cmd
}

func benchFlood(ctx context.Context, out io.Writer, o benchFloodOptions) error {
	c := floodbench.Config{Records: o.records, PerMessage: o.perMessage, Partitions: o.partitions, Rounds: o.rounds,
		Conns: o.conns, Methods: o.methods, Saturation: o.saturation, Warmup: o.warmup, Out: out}
	if err := c.Validate(); err != nil {
		return usageError(err)
	}
	exe, err := loadExecutable()
	if err != nil {
		return err
	}
	c.LoadCommand = []string{exe, "bench", "flood", "load"}
	log := slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelError}))
	k, err := devstack.StartKafka(devstack.KafkaConfig{Addr: "127.0.0.1:0",
		Topics: []string{ingest.DefaultTopic, defaultDecisionsTopic}, Partitions: int32(o.partitions)})
	if err != nil {
		return err
	}
	defer k.Close()
	mpool, dbURL, done, err := benchDB(ctx, o.adminURL, o.dbPrefix, o.keep, log)
	if err != nil {
		return err
	}
	defer done()

	// tally serve, in this process: the same run and pools as the command.
	var tok [32]byte
	_, _ = rand.Read(tok[:])
	ro := runOptions{brokers: []string{k.Addr}, listen: "127.0.0.1:0", adminToken: base64.RawURLEncoding.EncodeToString(tok[:]),
		ingest: true, api: true, enforce: true, log: log, apiLimits: apiLimits{addressRate: -1}}
	sizes := poolSizes{ingest: defaultIngestPoolSize(), api: 4, enforce: 2}
	pools, err := openPools(ctx, dbURL, ro, sizes)
	if err != nil {
		return err
	}
	defer pools.close()
	ro.pool, ro.apiPool, ro.enforcePool = pools.ingest, pools.api, pools.enforce
	poolNote := fmt.Sprintf("pools: ingest %d, api %d, enforce %d", sizes.ingest, sizes.api, sizes.enforce)
	if o.onePool {
		ro.apiPool, ro.enforcePool = pools.ingest, pools.ingest
		poolNote = fmt.Sprintf("ONE pool of %d for ingest, api and enforce", sizes.ingest)
	}
	addrCh := make(chan string, 1)
	ro.ready = func(addr string) { addrCh <- addr }
	sctx, stopServe := context.WithCancel(ctx)
	served := make(chan error, 1)
	go func() { served <- run(sctx, ro) }()
	defer func() { stopServe(); <-served }()
	var base string
	select {
	case a := <-addrCh:
		base = "http://" + a
	case err := <-served:
		return fmt.Errorf("serve: %w", err)
	}
	fmt.Fprintf(out, "tally bench flood: serve on %s (%s; per-address limit off), broker %s, database %s, GOMAXPROCS %d\n",
		base, poolNote, k.Addr, dbName(dbURL), runtime.GOMAXPROCS(0))

	c.URL, c.AdminToken, c.Pool, c.Broker = base, ro.adminToken, mpool, k.Addr
	_, err = floodbench.Run(ctx, c)
	return err
}

// loadExecutable is the program run as the load generator: this one.
var loadExecutable = os.Executable

func newBenchLoadCmd() *cobra.Command {
	return &cobra.Command{
		Use:    "load PLAN_JSON",
		Short:  "The load generator of tally bench flood (a separate process)",
		Hidden: true,
		Args:   cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			var spec floodbench.LoadSpec
			if err := json.Unmarshal([]byte(args[0]), &spec); err != nil {
				return err
			}
			res := floodbench.GenerateLoad(cmd.Context(), spec)
			return json.NewEncoder(cmd.OutOrStdout()).Encode(res)
		},
	}
}
