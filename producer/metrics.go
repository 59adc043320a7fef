package producer

import "github.com/prometheus/client_golang/prometheus"

type metrics struct {
	buffered    prometheus.Gauge
	epoch       prometheus.Gauge
	records     prometheus.Counter
	batchesSent prometheus.Counter
	sendErrors  prometheus.Counter
	tooLarge    prometheus.Counter
	splits      prometheus.Counter
	sendBudget  prometheus.Gauge
	streams     prometheus.Gauge
	keyRepeats  prometheus.Counter
	damaged     prometheus.Counter
}

func newMetrics(reg prometheus.Registerer, producer string) (*metrics, error) {
	labels := prometheus.Labels{"producer": producer}
	m := &metrics{
		buffered: prometheus.NewGauge(prometheus.GaugeOpts{Name: "tally_producer_buffered_records",
			Help: "Records durable on disk and not yet acknowledged by Kafka.", ConstLabels: labels}),
		epoch: prometheus.NewGauge(prometheus.GaugeOpts{Name: "tally_producer_epoch",
			Help: "The producer's current epoch.", ConstLabels: labels}),
		records: prometheus.NewCounter(prometheus.CounterOpts{Name: "tally_producer_records_total",
			Help: "Records acknowledged to callers of Record (durable on disk).", ConstLabels: labels}),
		batchesSent: prometheus.NewCounter(prometheus.CounterOpts{Name: "tally_producer_batches_sent_total",
			Help: "Batches acknowledged by Kafka and removed from disk.", ConstLabels: labels}),
		sendErrors: prometheus.NewCounter(prometheus.CounterOpts{Name: "tally_producer_send_errors_total",
			Help: "Failed attempts to send batches to Kafka (each is retried).", ConstLabels: labels}),
		tooLarge: prometheus.NewCounter(prometheus.CounterOpts{Name: "tally_producer_size_refusals_total",
			Help: "Messages Kafka refused as too large ([10] Message Size Too Large); each is resent in a smaller request or split.", ConstLabels: labels}),
		splits: prometheus.NewCounter(prometheus.CounterOpts{Name: "tally_producer_batch_splits_total",
			Help: "Stored batches split in two because Kafka refused one alone as too large.", ConstLabels: labels}),
		sendBudget: prometheus.NewGauge(prometheus.GaugeOpts{Name: "tally_producer_send_request_bytes",
			Help: "Bytes of stored batches the producer puts in one write (lowered after a size refusal).", ConstLabels: labels}),
		streams: prometheus.NewGauge(prometheus.GaugeOpts{Name: "tally_producer_streams_in_memory",
			Help: "Stream states (seq and running total) cached in memory, at most StreamCache.", ConstLabels: labels}),
		keyRepeats: prometheus.NewCounter(prometheus.CounterOpts{Name: "tally_producer_key_repeats_total",
			Help: "Record calls whose idempotency key was already used: answered with the first call's outcome, nothing recorded.", ConstLabels: labels}),
		damaged: prometheus.NewCounter(prometheus.CounterOpts{Name: "tally_producer_damaged_records_total",
			Help: "Pending records, stored batches and stream states of the state file whose value failed its CRC-32C or did not decode: set aside in its damaged bucket, the others sent.", ConstLabels: labels}),
	}
	for _, c := range []prometheus.Collector{m.buffered, m.epoch, m.records, m.batchesSent, m.sendErrors, m.tooLarge, m.splits, m.sendBudget, m.streams, m.keyRepeats, m.damaged} {
		if err := reg.Register(c); err != nil {
			return nil, err
		}
	}
	return m, nil
}

func (m *metrics) unregister(reg prometheus.Registerer) {
	for _, c := range []prometheus.Collector{m.buffered, m.epoch, m.records, m.batchesSent, m.sendErrors, m.tooLarge, m.splits, m.sendBudget, m.streams, m.keyRepeats, m.damaged} {
		reg.Unregister(c)
	}
}
