package cli

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"strings"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	"github.com/spf13/cobra"
	"golang.org/x/sync/errgroup"

	"github.com/tally-ledger/tally/ingest"
	"github.com/tally-ledger/tally/ledger"
	"github.com/tally-ledger/tally/migrations"
)

const defaultListen = "127.0.0.1:8080"

func newServeCmd() *cobra.Command {
	var (
		dbURL, brokers, topic, group, listen string
		runIngest, runAPI, runEnforce        bool
	)
	cmd := &cobra.Command{
		Use:   "serve",
		Short: "Run Tally's long-running parts against a real Kafka and Postgres",
		Long: `Run the Kafka ingest (and, once built, the REST API and the quota
enforcer) against TALLY_KAFKA_BROKERS and TALLY_DATABASE_URL.

With no --ingest/--api/--enforce flag, everything that is built runs. Several
processes may run --ingest with the same --group: they share the topic's
partitions, one partition owned by one process at a time.

serve never migrates: it refuses to start when the schema is behind (run
tally migrate first). /metrics and /healthz are served on --listen.
SIGINT/SIGTERM finish or roll back in-flight work and leave the group.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			ctx := cmd.Context()
			flags := cmd.Flags()
			explicit := flags.Changed("ingest") || flags.Changed("api") || flags.Changed("enforce")
			if !explicit {
				runIngest = true
			}
			for _, x := range []struct {
				on   bool
				name string
			}{{runAPI, "--api (the REST API)"}, {runEnforce, "--enforce (the quota enforcer)"}} {
				if x.on {
					fmt.Fprintf(cmd.ErrOrStderr(), "tally serve: %s is not built yet; not running it\n", x.name)
				}
			}
			if !runIngest {
				return errors.New("nothing to run: only --ingest is built so far")
			}
			log := newLogger()
			pool, err := pgxpool.New(ctx, dbURL)
			if err != nil {
				return fmt.Errorf("database: %w", err)
			}
			defer pool.Close()
			if err := checkSchema(ctx, pool); err != nil {
				return err
			}
			return serveIngest(ctx, ingestOptions{
				pool: pool, brokers: splitBrokers(brokers), topic: topic, group: group,
				listen: listen, log: log,
			})
		},
	}
	f := cmd.Flags()
	f.BoolVar(&runIngest, "ingest", false, "run the Kafka ingest")
	f.BoolVar(&runAPI, "api", false, "run the REST API (not built yet)")
	f.BoolVar(&runEnforce, "enforce", false, "run the quota enforcer (not built yet)")
	f.StringVar(&dbURL, "database-url", defaultDatabaseURL, "Postgres connection URL")
	envDefault(f, "database-url", "TALLY_DATABASE_URL")
	f.StringVar(&brokers, "kafka-brokers", "127.0.0.1:9092", "Kafka bootstrap brokers, comma-separated")
	envDefault(f, "kafka-brokers", "TALLY_KAFKA_BROKERS")
	f.StringVar(&topic, "topic", ingest.DefaultTopic, "topic of metering batches")
	envDefault(f, "topic", "TALLY_TOPIC")
	f.StringVar(&group, "group", ingest.DefaultGroup, "Kafka consumer group of the ingest processes")
	envDefault(f, "group", "TALLY_GROUP")
	f.StringVar(&listen, "listen", defaultListen, "address for /metrics and /healthz")
	envDefault(f, "listen", "TALLY_LISTEN")
	return cmd
}

func splitBrokers(s string) []string {
	var out []string
	for _, b := range strings.Split(s, ",") {
		if b = strings.TrimSpace(b); b != "" {
			out = append(out, b)
		}
	}
	return out
}

// checkSchema refuses a database whose schema is older than this binary.
func checkSchema(ctx context.Context, pool *pgxpool.Pool) error {
	current, latest, err := migrations.Status(ctx, pool)
	if err != nil {
		return fmt.Errorf("database schema: %w", err)
	}
	if current < latest {
		return fmt.Errorf("database schema is at version %d, this binary needs %d: run `tally migrate` first", current, latest)
	}
	return nil
}

type ingestOptions struct {
	pool    *pgxpool.Pool
	brokers []string
	topic   string
	group   string
	listen  string // "" for no HTTP listener
	log     *slog.Logger
	// ready, when set, is called once the HTTP listener is bound.
	ready func(addr string)
	// registry, when set, is used instead of a fresh one.
	registry *prometheus.Registry
}

// serveIngest runs the consumer and the /metrics + /healthz listener until
// ctx ends.
func serveIngest(ctx context.Context, o ingestOptions) error {
	reg := o.registry
	if reg == nil {
		reg = prometheus.NewRegistry()
		reg.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	}
	l, err := ledger.New(ledger.Config{Logger: o.log})
	if err != nil {
		return err
	}
	c, err := ingest.NewConsumer(ingest.Config{
		Brokers: o.brokers, Topic: o.topic, Group: o.group,
		Pool: o.pool, Ledger: l, Logger: o.log, Registry: reg,
	})
	if err != nil {
		return err
	}
	g, gctx := errgroup.WithContext(ctx)
	if o.listen != "" {
		ln, err := net.Listen("tcp", o.listen)
		if err != nil {
			return fmt.Errorf("listen %s: %w", o.listen, err)
		}
		mux := http.NewServeMux()
		mux.Handle("GET /metrics", promhttp.HandlerFor(reg, promhttp.HandlerOpts{Registry: reg}))
		mux.HandleFunc("GET /healthz", func(w http.ResponseWriter, _ *http.Request) {
			w.Header().Set("Content-Type", "text/plain; charset=utf-8")
			_, _ = io.WriteString(w, "ok\n")
		})
		srv := &http.Server{Handler: mux, ReadHeaderTimeout: 10 * time.Second}
		g.Go(func() error {
			if err := srv.Serve(ln); !errors.Is(err, http.ErrServerClosed) {
				return fmt.Errorf("http: %w", err)
			}
			return nil
		})
		g.Go(func() error {
			<-gctx.Done()
			sctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 10*time.Second)
			defer cancel()
			return srv.Shutdown(sctx)
		})
		o.log.Info("serving /metrics and /healthz", "addr", ln.Addr().String())
		if o.ready != nil {
			o.ready(ln.Addr().String())
		}
	} else if o.ready != nil {
		o.ready("")
	}
	g.Go(func() error { return c.Run(gctx) })
	return g.Wait()
}
