package admission

import (
	"strings"

	"github.com/prometheus/client_golang/prometheus"
)

// issueMetrics are the metrics of issuing, registered when
// Config.Registerer is set.
type issueMetrics struct {
	issued    *prometheus.CounterVec // grants, by budgets drawn (customer, pool, global)
	refused   *prometheus.CounterVec // refusals, by the binding budget's kind
	batchSize prometheus.Histogram
	batchSecs prometheus.Histogram
	brought   *prometheus.CounterVec // budget rows brought to a new rule version, by kind
	debits    *prometheus.CounterVec // debits taken, by path (one_round_trip, batch)
	// reportSize and reportSecs are those of the renew and release
	// transactions (report_batch.go).
	reportSize prometheus.Histogram
	reportSecs prometheus.Histogram
	// phases: where a grant request's or a debit's time went (phase.go).
	phases *prometheus.HistogramVec
}

func newIssueMetrics(reg prometheus.Registerer) *issueMetrics {
	m := &issueMetrics{
		issued: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "tally_admission_grants_issued_total",
			Help: "Grants issued, by the number of budgets each drew from.",
		}, []string{"budgets"}),
		refused: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "tally_admission_grants_refused_total",
			Help: "Grant requests refused as budget_exhausted, by the kind of the binding budget (customer, pool, global).",
		}, []string{"binding"}),
		batchSize: prometheus.NewHistogram(prometheus.HistogramOpts{
			Name:    "tally_admission_issue_batch_requests",
			Help:    "Grant requests decided in one issuing transaction.",
			Buckets: prometheus.ExponentialBuckets(1, 2, 10),
		}),
		batchSecs: prometheus.NewHistogram(prometheus.HistogramOpts{
			Name:    "tally_admission_issue_batch_seconds",
			Help:    "Time of one issuing transaction, locks to commit.",
			Buckets: prometheus.ExponentialBuckets(0.0005, 2, 14),
		}),
		brought: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "tally_admission_budgets_brought_total",
			Help: "Budget rows brought to a new rule version (created, a rule changed or turned exact) and counted from what their period already consumed, by kind (customer, scope: a pool or global).",
		}, []string{"kind"}),
		debits: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "tally_admission_debits_total",
			Help: "Debits taken (a request's cost taken centrally, recorded as a grant spent and released at once), by path: one_round_trip, or batch (an issue transaction of its own, when a row had to be created or brought, or a rate budget applies).",
		}, []string{"path"}),
		reportSize: prometheus.NewHistogram(prometheus.HistogramOpts{
			Name:    "tally_admission_report_batch_reports",
			Help:    "Renews and releases decided in one shared transaction.",
			Buckets: prometheus.ExponentialBuckets(1, 2, 10),
		}),
		reportSecs: prometheus.NewHistogram(prometheus.HistogramOpts{
			Name:    "tally_admission_report_batch_seconds",
			Help:    "Time of one renew and release transaction, locks to commit.",
			Buckets: prometheus.ExponentialBuckets(0.0005, 2, 14),
		}),
		phases: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name: "tally_admission_phase_seconds",
			Help: "Where the time of a grant request or a debit went, by path (grant, debit) and phase: plan (finding the budgets that apply; a read only when no plan is cached), " +
				"queue (waiting for an issue transaction to take it: the one in flight on the same rows, or a free lane), connection (waiting for a Postgres connection), postgres (the transaction, locks to commit).",
			Buckets: prometheus.ExponentialBuckets(0.00005, 2, 16),
		}, []string{"path", "phase"}),
	}
	for _, path := range []string{pathGrant, pathDebit} {
		for _, ph := range phaseNames {
			m.phases.WithLabelValues(path, ph)
		}
	}
	// Exported at 0 before their first event, every label value they take.
	for _, kind := range []string{"customer", "pool", "global"} {
		m.refused.WithLabelValues(kind)
	}
	for _, path := range []string{"one_round_trip", "batch"} {
		m.debits.WithLabelValues(path)
	}
	for _, kind := range []string{"customer", "scope"} {
		m.brought.WithLabelValues(kind)
	}
	if reg != nil {
		reg.MustRegister(m.issued, m.refused, m.batchSize, m.batchSecs, m.brought, m.debits, m.reportSize, m.reportSecs, m.phases)
	}
	return m
}

// refusedBy counts a refusal by the kind of its binding budget
// ("customer:acme/calls" → customer, "global/calls" → global).
func (m *issueMetrics) refusedBy(binding string) {
	kind, _, _ := strings.Cut(binding, ":")
	kind, _, _ = strings.Cut(kind, "/")
	m.refused.WithLabelValues(kind).Inc()
}
