package cli

import (
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"strings"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/spf13/cobra"

	"github.com/tally-ledger/tally/ingest"
	"github.com/tally-ledger/tally/internal/devstack"
	"github.com/tally-ledger/tally/migrations"
)

func newDevCmd() *cobra.Command {
	var dir, listen, kafkaAddr string
	cmd := &cobra.Command{
		Use:   "dev",
		Short: "Run Tally on this machine with everything embedded (for trying it out)",
		Long: `Run Tally on this machine with nothing to install but Postgres:

  - Kafka: TALLY_KAFKA_BROKERS if set, else an embedded broker at
    127.0.0.1:9092 (topics tally.meter-batches and tally.quota-decisions,
    4 partitions each; data kept in ./.tally-dev/kafka).
  - Postgres: TALLY_DATABASE_URL if set and reachable, else the local server
    at 127.0.0.1:5432 (database tally, created if missing), else a private
    cluster started from the installed initdb/pg_ctl under ./.tally-dev/pg.

Then it migrates the database, runs the ingest, serves /metrics and /healthz,
prints what to try, and runs until Ctrl-C.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			ctx := cmd.Context()
			out := cmd.OutOrStdout()
			log := newLogger()

			pg, err := devstack.StartPostgres(ctx, devstack.PostgresConfig{
				URL: os.Getenv("TALLY_DATABASE_URL"), Dir: dir, Logger: log,
			})
			if err != nil {
				return err
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

			brokers := splitBrokers(os.Getenv("TALLY_KAFKA_BROKERS"))
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
							"but %s does not exist: drop that database to start over (dropdb tally), or restore the broker's data directory",
							pg.URL, stale, kdir)
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

			return serveIngest(ctx, ingestOptions{
				pool: pool, brokers: brokers, topic: ingest.DefaultTopic, group: ingest.DefaultGroup,
				listen: listen, log: log,
				ready: func(addr string) {
					printDevBanner(out, brokers, kafkaNote, pg, v, addr)
				},
			})
		},
	}
	cmd.Flags().StringVar(&dir, "dir", devstack.DefaultDir, "directory for the embedded broker's and the private Postgres's data")
	cmd.Flags().StringVar(&kafkaAddr, "kafka-addr", devstack.DefaultKafkaAddr, "address of the embedded broker (127.0.0.1:<port>; port 0 picks one)")
	cmd.Flags().StringVar(&listen, "listen", defaultListen, "address for /metrics and /healthz")
	envDefault(cmd.Flags(), "listen", "TALLY_LISTEN")
	return cmd
}

func printDevBanner(w io.Writer, brokers []string, kafkaNote string, pg *devstack.Postgres, version int64, addr string) {
	b := strings.Join(brokers, ",")
	psql := fmt.Sprintf("psql '%s'", pg.URL)
	fmt.Fprintf(w, `
tally dev is running (Ctrl-C to stop).

  Kafka     %s  (%s)
  Postgres  %s  (%s, schema version %d)
  Metrics   http://%s/metrics   Health: http://%s/healthz

Send a sample batch (key = customer id). Send it as often as you like: it is billed once.

  kcat -P -b %s -t %s -k acme testdata/batches/valid-spec-example.json

See it in the ledger:

  %s -c "SELECT customer, meter, seq, total, billed, period_start FROM records ORDER BY ingested_at"

Ingest position and conservation counters per partition:

  %s -c "SELECT partition, next_offset, high_watermark, records_in, records_applied, records_duplicate, records_rejected FROM ingest_partitions ORDER BY partition"

Refused messages and records (try testdata/batches/invalid-*.json):

  %s -c "SELECT partition, \"offset\", record_index, reason, detail FROM dead_letters ORDER BY id"

`, b, kafkaNote, pg.URL, pg.Source, version, addr, addr, b, ingest.DefaultTopic, psql, psql, psql)
}
