package cli

import (
	"context"
	"fmt"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/spf13/pflag"
	"golang.org/x/sync/errgroup"

	"github.com/tally-ledger/tally/alerts"
	"github.com/tally-ledger/tally/quota"
)

// alertOptions are the alerts' settings in runOptions.
type alertOptions struct {
	topic        string // default alerts.DefaultTopic
	allowPrivate bool   // webhooks may be on loopback and private addresses
}

func addAlertFlags(f *pflag.FlagSet, a *alertOptions) {
	f.StringVar(&a.topic, "alerts-topic", alerts.DefaultTopic, "topic the alert events are delivered to (key <subject>/<meter>)")
	envDefault(f, "alerts-topic", "TALLY_ALERTS_TOPIC")
	f.BoolVar(&a.allowPrivate, "webhook-allow-private", false, "let alert webhooks reach loopback and private addresses (refused otherwise)")
	envDefault(f, "webhook-allow-private", "TALLY_WEBHOOK_ALLOW_PRIVATE")
}

// startAlerts runs, beside the quota enforcer enf, the alert evaluator
// (while enf leads, fenced by its lease) and the dispatcher, on a pool of
// their own: a slow webhook receiver never takes the enforcer's
// connections. The pool is closed when the group's context ends. With the
// API in the process, the evaluator is woken by the API's listening
// connection (its Subscriber, returned) instead of one of its own.
func startAlerts(ctx context.Context, g *errgroup.Group, o runOptions, enf *quota.Enforcer, reg prometheus.Registerer) (*alerts.Evaluator, error) {
	cfg := o.enforcePool.Config().Copy()
	cfg.MaxConns, cfg.MinConns = 3, 0
	cfg.ConnConfig.RuntimeParams["application_name"] = "tally-alerts"
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	if err != nil {
		return nil, fmt.Errorf("alerts: database: %w", err)
	}
	log := o.log.With("component", "alerts")
	disp, err := alerts.NewDispatcher(alerts.DispatcherConfig{Pool: pool, Brokers: o.brokers, Topic: o.alerts.topic,
		AllowPrivate: o.alerts.allowPrivate, Logger: log, Registerer: reg})
	if err != nil {
		pool.Close()
		return nil, err
	}
	eval, err := alerts.NewEvaluator(alerts.EvaluatorConfig{Pool: pool, Leader: enf, IngestTopic: o.topic, Kafka: true,
		Logger: log, Registerer: reg, Committed: disp.Wake, NoListen: o.api && o.listen != ""})
	if err != nil {
		pool.Close()
		return nil, err
	}
	var inner errgroup.Group
	inner.Go(func() error { return eval.Run(ctx) })
	inner.Go(func() error { return disp.Run(ctx) })
	g.Go(func() error {
		defer pool.Close()
		return inner.Wait()
	})
	return eval, nil
}
