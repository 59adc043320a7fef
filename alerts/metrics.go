package alerts

import "github.com/prometheus/client_golang/prometheus"

type evalMetrics struct {
	events   *prometheus.CounterVec
	lag      prometheus.Histogram
	seconds  prometheus.Histogram
	failures prometheus.Counter
}

func newEvalMetrics(reg prometheus.Registerer) *evalMetrics {
	m := &evalMetrics{
		events: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "tally_alert_events_total",
			Help: "Alert events written (each with its transition, in one transaction), by type.",
		}, []string{"type"}),
		lag: prometheus.NewHistogram(prometheus.HistogramOpts{
			Name:    "tally_alert_transition_lag_seconds",
			Help:    "For each transition, how far the usage it was decided on lagged: the evaluation instant minus as_of.",
			Buckets: []float64{0.1, 0.25, 0.5, 1, 2, 5, 10, 30, 60, 300},
		}),
		seconds: prometheus.NewHistogram(prometheus.HistogramOpts{
			Name:    "tally_alert_evaluation_seconds",
			Help:    "Duration of one alert evaluation (read, decide, write).",
			Buckets: prometheus.ExponentialBuckets(0.001, 2, 14),
		}),
		failures: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "tally_alert_evaluation_failures_total",
			Help: "Alert evaluations that failed (nothing written; retried at the next one).",
		}),
	}
	reg.MustRegister(m.events, m.lag, m.seconds, m.failures)
	return m
}

type deliveryMetrics struct {
	deliveries *prometheus.CounterVec
	oldest     prometheus.Gauge
	latency    prometheus.Histogram
	inFlight   prometheus.Gauge
}

func newDeliveryMetrics(reg prometheus.Registerer) *deliveryMetrics {
	m := &deliveryMetrics{
		deliveries: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "tally_alert_deliveries_total",
			Help: "Alert delivery attempts by endpoint kind (webhook, kafka) and outcome (delivered, retry, failed).",
		}, []string{"kind", "outcome"}),
		oldest: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "tally_alert_oldest_undelivered_seconds",
			Help: "Age of the oldest pending alert delivery (0 when none).",
		}),
		latency: prometheus.NewHistogram(prometheus.HistogramOpts{
			Name:    "tally_alert_delivery_seconds",
			Help:    "From an event's transition to its delivery (2xx or Kafka ack).",
			Buckets: []float64{0.05, 0.1, 0.25, 0.5, 1, 2, 5, 30, 300, 3600},
		}),
		inFlight: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "tally_alert_deliveries_in_flight",
			Help: "Alert deliveries being attempted now.",
		}),
	}
	reg.MustRegister(m.deliveries, m.oldest, m.latency, m.inFlight)
	return m
}
