package cli

import (
	"context"
	"crypto/rand"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"net/url"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/spf13/cobra"

	"github.com/tally-ledger/tally/admission"
	"github.com/tally-ledger/tally/cmd/tally/internal/devstack"
	"github.com/tally-ledger/tally/ingest"
	"github.com/tally-ledger/tally/migrations"
	"github.com/tally-ledger/tally/periods"
)

func newDevCmd() *cobra.Command {
	var dir, listen, kafkaAddr string
	var simulated, reset bool
	var maxSkew time.Duration
	cmd := &cobra.Command{
		Use:   "dev",
		Short: "Run Tally on this machine with everything embedded (for trying it out)",
		Long: `Run Tally on this machine with nothing to install but Postgres:

  - Kafka: TALLY_KAFKA_BROKERS if set, else an embedded broker at
    127.0.0.1:9092 (topics tally.meter-batches, tally.quota-decisions and tally.alerts,
    4 partitions each; data kept in ./.tally-dev/kafka).
  - Postgres: TALLY_DATABASE_URL if set and reachable, else the local server
    at 127.0.0.1:5432 (a database of the data directory's own, tally_ and a
    digest of its path, created if missing: two clones never share one),
    else a private cluster started from the installed initdb/pg_ctl under
    ./.tally-dev/pg (Unix socket only, in a directory only its user can
    enter; reused if a killed tally dev left it running).

Then it migrates the database and runs everything tally serve runs (ingest,
REST API and web console, quota enforcer) plus simulated producers (customers demo-acme and
demo-globex, with a demo quota on demo-acme that is exceeded about two
minutes after start, and demo-acme's seats gauge and active-users meter), and two simulated gateways that admit demo-initech's
tokens through the admit SDK from one exact budget (their grants are
visible over REST). It prints the API's URL, an admin token (generated
unless TALLY_ADMIN_TOKEN is set) and what to try, and runs until Ctrl-C.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			ctx := cmd.Context()
			out := cmd.OutOrStdout()
			// Pure configuration is checked before anything starts, so a
			// mistake is the one line that says what to change.
			if err := admission.ValidateMaxSkew(maxSkew); err != nil {
				return &ExitError{Code: exitUsage, Err: fmt.Errorf("--grant-max-skew (TALLY_GRANT_MAX_SKEW): %w", err)}
			}
			if token := os.Getenv("TALLY_ADMIN_TOKEN"); token != "" {
				if err := checkAdminToken(token, "or unset it and tally dev generates one"); err != nil {
					return err
				}
			}
			// TALLY_KAFKA_BROKERS naming no broker (unset or empty): the
			// embedded one.
			var brokers []string
			if env := os.Getenv("TALLY_KAFKA_BROKERS"); len(splitBrokers(env)) > 0 {
				var err error
				if brokers, err = parseBrokers(env, "TALLY_KAFKA_BROKERS"); err != nil {
					return usageError(err)
				}
			} else if _, err := devstack.KafkaPort(kafkaAddr); err != nil {
				return &ExitError{Code: exitUsage, Err: fmt.Errorf("--kafka-addr: %w", err)}
			}
			log := newLogger()

			pg, err := devstack.StartPostgres(ctx, devstack.PostgresConfig{
				URL: os.Getenv("TALLY_DATABASE_URL"), Dir: dir, Logger: log, Reset: reset,
			})
			if err != nil {
				return err
			}
			if reset {
				// The broker's positions were in the dropped database: its
				// data goes with it, or ingest would resume past messages
				// the new database never saw.
				kdir := filepath.Join(dir, "kafka")
				if err := os.RemoveAll(kdir); err != nil {
					_ = pg.Close()
					return fmt.Errorf("--reset: remove the embedded broker's data %s: %w", kdir, err)
				}
				dropped := "nothing to drop in Postgres (no dev database yet)"
				if pg.Dropped != "" {
					dropped = "dropped the database " + pg.Dropped + " (" + pg.Source + ")"
				}
				fmt.Fprintf(out, "tally dev --reset: %s and removed the embedded broker's data %s; starting empty.\n", dropped, kdir)
			}
			defer func() {
				if err := pg.Close(); err != nil {
					log.Error("stopping the private Postgres", "err", err)
				}
			}()
			pool, err := pgxpool.New(ctx, pg.URL)
			if err != nil {
				return err
			}
			defer pool.Close()
			v, err := migrations.Up(ctx, pool, log)
			if err != nil {
				return err
			}

			kafkaNote := "TALLY_KAFKA_BROKERS"
			if len(brokers) == 0 {
				kdir := filepath.Join(dir, "kafka")
				if _, err := os.Stat(kdir); errors.Is(err, fs.ErrNotExist) {
					// A new embedded broker starts its offsets at 0;
					// positions stored for an earlier one would make ingest
					// wait for offsets this broker has not reached (it
					// never skips).
					var stale int64
					if err := pool.QueryRow(ctx, "SELECT coalesce(max(next_offset), 0) FROM ingest_partitions WHERE topic = $1",
						ingest.DefaultTopic).Scan(&stale); err != nil {
						return err
					}
					if stale > 0 {
						return fmt.Errorf("the database %s holds ingest positions of an earlier embedded broker (up to offset %d), "+
							"but that broker's data directory %s does not exist (deleted?): restore it, or start over with "+
							"tally dev --reset (it drops that database, %s, which holds only the dev data of %s), or use another --dir",
							pg.URL, stale, kdir, devDatabaseName(pg.URL), dir)
					}
				}
				k, err := devstack.StartKafka(devstack.KafkaConfig{
					Addr:   kafkaAddr,
					Dir:    kdir,
					Topics: devstack.DefaultTopics, Partitions: devstack.DefaultPartitions,
				})
				if err != nil {
					return err
				}
				defer k.Close()
				brokers = []string{k.Addr}
				kafkaNote = fmt.Sprintf("embedded broker; data in %s; topics %s with %d partitions",
					k.Dir, strings.Join(devstack.DefaultTopics, ", "), devstack.DefaultPartitions)
			}

			token, generated := os.Getenv("TALLY_ADMIN_TOKEN"), false
			if token == "" {
				token, generated = rand.Text()+rand.Text(), true // 52 base32 characters, 260 bits
			}
			var apiAddr string // set by ready, before also runs
			o := runOptions{
				pool: pool, brokers: brokers, listen: listen, adminToken: token,
				grace: periods.DefaultGrace, ingest: true, api: true, enforce: true, log: log, maxSkew: maxSkew,
				ready: func(addr string) {
					apiAddr = addr
					printDevBanner(out, brokers, kafkaNote, pg, v, addr, token, generated, simulated)
				},
			}
			o.alerts.allowPrivate = true // the dev receiver is on loopback
			if simulated {
				o.also = func(ctx context.Context) error {
					if err := devAlerts(ctx, pool, log); err != nil {
						log.Warn("no demo alert", "err", err)
					}
					return simulate(ctx, brokers, dir, pool, log, "http://"+apiAddr, token)
				}
			}
			return run(ctx, o)
		},
	}
	cmd.Flags().StringVar(&dir, "dir", devstack.DefaultDir, "directory for the embedded broker's and the private Postgres's data")
	cmd.Flags().StringVar(&kafkaAddr, "kafka-addr", devstack.DefaultKafkaAddr, "address of the embedded broker (127.0.0.1:<port>; port 0 picks one)")
	cmd.Flags().StringVar(&listen, "listen", defaultListen, "address of the REST API (and /metrics, /healthz)")
	cmd.Flags().BoolVar(&simulated, "simulate", true, "run simulated producers and a demo quota")
	cmd.Flags().BoolVar(&reset, "reset", false, "start over: drop this data directory's dev database and the embedded broker's data (never a TALLY_DATABASE_URL database)")
	envDefault(cmd.Flags(), "dir", "TALLY_DEV_DIR")
	envDefault(cmd.Flags(), "kafka-addr", "TALLY_DEV_KAFKA_ADDR")
	envDefault(cmd.Flags(), "listen", "TALLY_LISTEN")
	envDefault(cmd.Flags(), "simulate", "TALLY_DEV_SIMULATE")
	addMaxSkewFlag(cmd.Flags(), &maxSkew)
	return cmd
}

// devDatabaseName is the database of a Postgres URL, for a dropdb line.
func devDatabaseName(dbURL string) string {
	u, err := url.Parse(dbURL)
	if err != nil || strings.TrimPrefix(u.Path, "/") == "" {
		return "<the database of " + dbURL + ">"
	}
	return strings.TrimPrefix(u.Path, "/")
}

func printDevBanner(w io.Writer, brokers []string, kafkaNote string, pg *devstack.Postgres, version int64, addr, token string, generated, simulated bool) {
	b := strings.Join(brokers, ",")
	psql := fmt.Sprintf("psql '%s'", pg.URL)
	tokenNote := "from TALLY_ADMIN_TOKEN"
	if generated {
		tokenNote = "generated for this run; set TALLY_ADMIN_TOKEN to choose one"
	}
	fmt.Fprintf(w, `
tally dev is running (Ctrl-C to stop).

  Kafka     %s  (%s)
  Postgres  %s  (%s, schema version %d)
  REST API  http://%s/v1   (OpenAPI: http://%s/openapi.json)
  Console   http://%s/console/   (sign in with the admin token below)
  Admin     export TALLY_ADMIN_TOKEN=%s   (%s)
  Database  export TALLY_DATABASE_URL='%s'   (so tally reconcile, tokens, verify and psql reach this database)

Send a sample batch (key = customer id). Send it as often as you like: it is billed once.

  kcat -P -b %s -t %s -k acme -X topic.partitioner=murmur2_random testdata/batches/valid-spec-example.json

Ask for acme's usage this period:

  curl -s -H "Authorization: Bearer $TALLY_ADMIN_TOKEN" http://%s/v1/customers/acme/usage

See it in the ledger:

  %s -c "SELECT customer, meter, seq, total, billed, period_start FROM records ORDER BY ingested_at DESC LIMIT 5"

Refused messages and records (try testdata/batches/invalid-*.json):

  %s -c "SELECT partition, \"offset\", record_index, reason, detail FROM dead_letters ORDER BY id"
`, b, kafkaNote, pg.URL, pg.Source, version, addr, addr, addr, token, tokenNote, pg.URL, b, ingest.DefaultTopic, addr, psql, psql)
	if simulated {
		fmt.Fprintf(w, `
Simulated producers are recording usage for demo-acme and demo-globex. demo-acme's
quota on api_calls goes ok -> warning -> exceeded in about two minutes; watch it:

  curl -s -H "Authorization: Bearer $TALLY_ADMIN_TOKEN" http://%s/v1/customers/demo-acme/quotas
  kcat -C -b %s -t tally.quota-decisions -o end -f '%%k %%s\n'

The alert demo-acme-quota fires at 80%% and 100%% of that quota: a receiver
tally dev runs logs each signed webhook ("webhook received"). Its state, its
events, and a credit that resolves it:

  curl -s -H "Authorization: Bearer $TALLY_ADMIN_TOKEN" http://%s/v1/alerts/demo-acme-quota
  curl -s -H "Authorization: Bearer $TALLY_ADMIN_TOKEN" http://%s/v1/alert-events
  curl -s -H "Authorization: Bearer $TALLY_ADMIN_TOKEN" --json '{"operation_id":"'$(uuidgen)'","customer":"demo-acme","meter":"api_calls","quantity":"-5000","reason":"demo credit","actor":"you"}' http://%s/v1/adjustments

Two simulated gateways (%s, %s) admit %d requests a second each for
%s's %s through the admit SDK, sharing one exact budget: together they
never admit more than its limit (docs/gateways-exact.md). Their grants, and the budget:

  curl -s -H "Authorization: Bearer $TALLY_ADMIN_TOKEN" 'http://%s/v1/customers/%s/grants?state=live'
  curl -s -H "Authorization: Bearer $TALLY_ADMIN_TOKEN" http://%s/v1/customers/%s/budgets
`, addr, b, addr, addr, addr, gwHolders[0], gwHolders[1], gwRate, gwCustomer, gwMeter, addr, gwCustomer, addr, gwCustomer)
	}
	fmt.Fprintln(w)
}
