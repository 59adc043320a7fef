package quota

import "github.com/prometheus/client_golang/prometheus"

type metrics struct {
	published     *prometheus.CounterVec // by state and mode
	current       *prometheus.GaugeVec   // rules by state, as of the last evaluation
	publishErrors prometheus.Counter
	storeErrors   prometheus.Counter
	evalFailures  prometheus.Counter
	evalSeconds   prometheus.Histogram
	leader        prometheus.Gauge
	maxLag        prometheus.Gauge
	unknownAsOf   prometheus.Gauge
	rules         prometheus.Gauge
}

func newMetrics(reg prometheus.Registerer) *metrics {
	m := &metrics{
		published: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "tally_quota_decisions_published_total",
			Help: "Quota decisions published to Kafka, by state and mode.",
		}, []string{"state", "mode"}),
		current: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: "tally_quota_rules_by_state",
			Help: "Current quota rules by the state of their last evaluation.",
		}, []string{"state"}),
		publishErrors: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "tally_quota_publish_errors_total",
			Help: "Failed writes of decisions to Kafka (the decisions are retried on the next evaluation).",
		}),
		storeErrors: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "tally_quota_store_errors_total",
			Help: "Failed writes of published decisions to Postgres.",
		}),
		evalFailures: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "tally_quota_evaluation_failures_total",
			Help: "Evaluations that could not read rules or usage; nothing fresh was published.",
		}),
		evalSeconds: prometheus.NewHistogram(prometheus.HistogramOpts{
			Name:    "tally_quota_evaluation_seconds",
			Help:    "Time to read usage, decide, publish and store one evaluation of every rule.",
			Buckets: prometheus.ExponentialBuckets(0.001, 2, 14),
		}),
		leader: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "tally_quota_leader",
			Help: "1 while this process holds the enforcer lease and publishes decisions.",
		}),
		maxLag: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "tally_quota_lag_seconds",
			Help: "The largest lag_seconds (decided_at - as_of) of the last evaluation.",
		}),
		unknownAsOf: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "tally_quota_unknown_as_of_rules",
			Help: "Rules whose as_of is unknown (no ingest position yet) in the last evaluation.",
		}),
		rules: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "tally_quota_rules",
			Help: "Current quota rules evaluated.",
		}),
	}
	reg.MustRegister(m.published, m.current, m.publishErrors, m.storeErrors, m.evalFailures,
		m.evalSeconds, m.leader, m.maxLag, m.unknownAsOf, m.rules)
	return m
}
