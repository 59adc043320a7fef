package ingest

import (
	"strconv"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/tally-ledger/tally/ledger"
)

// metrics are the consumer's Prometheus collectors.
type metrics struct {
	records     *prometheus.CounterVec // outcome
	messages    *prometheus.CounterVec // result: accepted | rejected
	deadLetters *prometheus.CounterVec // reason
	batches     prometheus.Counter     //
	txSeconds   prometheus.Histogram   //
	retries     *prometheus.CounterVec // cause
	jumps       *prometheus.CounterVec // partition
	fenced      prometheus.Counter     //
	lag         *prometheus.GaugeVec   // partition
	through     *prometheus.GaugeVec   // partition
	owned       prometheus.Gauge       //
	anomalies   *prometheus.CounterVec // kind
	stalled     *prometheus.GaugeVec   // partition
	skipped     *prometheus.CounterVec // cause
	leaseLost   prometheus.Counter     //
	claims      prometheus.Counter     //
	releases    prometheus.Counter     //
	evictions   prometheus.Counter     //
	moves       prometheus.Counter     // customers arriving on a partition after another
}

func newMetrics(reg prometheus.Registerer, topic string) (*metrics, error) {
	cl := prometheus.Labels{"topic": topic}
	m := &metrics{
		records: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "tally_ingest_records_total", Help: "Records consumed, by ledger outcome.", ConstLabels: cl,
		}, []string{"outcome"}),
		messages: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "tally_ingest_messages_total", Help: "Kafka messages consumed; rejected = refused whole (dead letter).", ConstLabels: cl,
		}, []string{"result"}),
		deadLetters: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "tally_ingest_dead_letters_total", Help: "Dead letters written, by reason.", ConstLabels: cl,
		}, []string{"reason"}),
		batches: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "tally_ingest_batches_total", Help: "Micro-batches committed.", ConstLabels: cl,
		}),
		txSeconds: prometheus.NewHistogram(prometheus.HistogramOpts{
			Name: "tally_ingest_tx_seconds", Help: "Duration of committed micro-batch transactions.", ConstLabels: cl,
			Buckets: prometheus.ExponentialBuckets(0.001, 2, 15),
		}),
		retries: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "tally_ingest_retries_total", Help: "Micro-batch attempts that failed and were retried, by cause.", ConstLabels: cl,
		}, []string{"cause"}),
		jumps: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "tally_ingest_offset_jumps_total", Help: "Offset jumps detected (Kafka no longer had unread messages).", ConstLabels: cl,
		}, []string{"partition"}),
		fenced: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "tally_ingest_fenced_total", Help: "Writes refused by the fence: this member's lease on the partition was gone, or the stored offset was not the expected one (another member wrote it).", ConstLabels: cl,
		}),
		lag: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: "tally_ingest_partition_lag", Help: "High watermark minus the stored next offset, as last seen by this member.", ConstLabels: cl,
		}, []string{"partition"}),
		through: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: "tally_ingest_partition_applied_through_seconds", Help: "Unix time through which the partition's usage is applied.", ConstLabels: cl,
		}, []string{"partition"}),
		owned: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "tally_ingest_owned_partitions", Help: "Partitions this member holds a lease on.", ConstLabels: cl,
		}),
		anomalies: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "tally_ingest_anomalies_total", Help: "Conditions that need an operator: stored offset ahead of the partition's end, offsets going backwards.", ConstLabels: cl,
		}, []string{"kind"}),
		stalled: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: "tally_ingest_partition_stalled", Help: "1 while this member has been retrying the partition's micro-batch for over a minute (its usage is not being applied), else 0.", ConstLabels: cl,
		}, []string{"partition"}),
		skipped: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "tally_ingest_offsets_skipped_total", Help: "Offsets that held no message for ingest and are no loss, by cause: compaction, transaction_commit or transaction_abort (markers). Losses are tally_ingest_offset_jumps_total.", ConstLabels: cl,
		}, []string{"cause"}),
		leaseLost: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "tally_ingest_leases_lost_total", Help: "Partitions this member stopped because another member claimed them (its lease had run out).", ConstLabels: cl,
		}),
		claims: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "tally_ingest_partition_claims_total", Help: "Partition leases this process claimed (a partition released or whose member's lease ran out).", ConstLabels: cl,
		}),
		releases: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "tally_ingest_partition_releases_total", Help: "Partition leases this process released (its surplus when members joined, or a clean shutdown).", ConstLabels: cl,
		}),
		moves: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "tally_ingest_customer_partition_moves_total", Help: "Customers whose messages arrived on this member's partition after another partition's: a producer whose partitioner is not murmur2 (the SDK's), or a repartitioned topic.", ConstLabels: cl,
		}),
		evictions: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "tally_ingest_member_evictions_total", Help: "Times this process found its member lease had run out (stopped or starved for a session timeout) and joined again as a new member.", ConstLabels: cl,
		}),
	}
	for _, c := range []prometheus.Collector{m.records, m.messages, m.deadLetters, m.batches, m.txSeconds,
		m.retries, m.jumps, m.fenced, m.lag, m.through, m.owned, m.anomalies, m.stalled, m.skipped, m.leaseLost, m.claims, m.releases, m.evictions, m.moves} {
		if err := reg.Register(c); err != nil {
			return nil, err
		}
	}
	for _, k := range ledger.Kinds {
		m.records.WithLabelValues(k.String())
	}
	m.messages.WithLabelValues("accepted")
	m.messages.WithLabelValues("rejected")
	// Exported at 0 before their first event, every label value they take
	// (jumps per partition: when the partition starts).
	for _, c := range []string{"postgres", "refused"} {
		m.retries.WithLabelValues(c)
	}
	for _, k := range []string{"offset_ahead_of_end", "offset_backwards", "aborted_transaction", "stalled_lock_holder_ended"} {
		m.anomalies.WithLabelValues(k)
	}
	for _, c := range []string{skipCompaction, skipCommitMarker, skipAbortMarker} {
		m.skipped.WithLabelValues(c)
	}
	return m, nil
}

func (m *metrics) position(partition int, lag int64, through time.Time) {
	p := strconv.Itoa(partition)
	m.lag.WithLabelValues(p).Set(float64(lag))
	if !through.IsZero() {
		m.through.WithLabelValues(p).Set(float64(through.UnixMilli()) / 1000)
	}
}
