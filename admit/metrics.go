package admit

import (
	"errors"
	"sync"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"
)

// metrics are the client's Prometheus metrics, registered on
// Config.Registerer (none when it is nil: every method still works).
// Admissions answered from memory on the hot path are counted in the
// budgets' per-CPU shards and summed when scraped, so Admit stays free of
// shared writes.
type metrics struct {
	slow [numHow][2]atomic.Int64 // admissions answered off the hot path, by how and admitted
	// retired: the hot-path counts of forgotten budgets, so the counters
	// do not go back when a budget is forgotten.
	retired shard
	// retiring: held by a scrape (read) and while budgets move from the
	// map to retired (write), so a scrape counts each budget once: in the
	// map or in retired, never in neither (a counter going back) nor both.
	retiring    sync.RWMutex
	forgotten   prometheus.Counter
	calls       *prometheus.CounterVec
	latency     *prometheus.HistogramVec
	reports     *prometheus.CounterVec
	undelivered prometheus.Gauge
	bypassFiles prometheus.Gauge
	// bypassDamaged: bypass reports set aside as .damaged.
	bypassDamaged prometheus.Counter
	reachable     prometheus.Gauge

	// reg and registered are where the collectors were registered, so
	// Close takes them off again and the registry takes a new client.
	reg        prometheus.Registerer
	registered []prometheus.Collector
}

var (
	descAdmissions = prometheus.NewDesc("tally_admit_admissions_total",
		"Admit answers, by how (grant, debit, decision, no-rule, bypass, exhausted, unreachable) and outcome (admitted, refused)",
		[]string{"how", "outcome"}, nil)
	descHeld = prometheus.NewDesc("tally_admit_held_units",
		"Units held in live grants and not yet admitted, over every budget", nil, nil)
	descGrants = prometheus.NewDesc("tally_admit_grants_held",
		"Live grants held", nil, nil)
	descBudgets = prometheus.NewDesc("tally_admit_budgets",
		"Budgets (customer and meter) kept in memory: used by an Admit within ForgetAfter, or holding something", nil, nil)
)

func newMetrics(reg prometheus.Registerer, c *Client) (*metrics, error) {
	m := &metrics{
		calls: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "tally_admit_grant_calls_total",
			Help: "Calls to Tally's grant API, by call (issue, debit, renew, release, bypasses) and result (ok, exhausted, not_exact, refused, overloaded, changing, unreachable, canceled)"},
			[]string{"call", "result"}),
		latency: prometheus.NewHistogramVec(prometheus.HistogramOpts{Name: "tally_admit_grant_call_seconds",
			Help:    "Latency of calls to Tally's grant API that got an answer, by call",
			Buckets: []float64{.001, .0025, .005, .01, .025, .05, .1, .25, .5, 1, 2.5}}, []string{"call"}),
		reports: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "tally_admit_spend_reports_total",
			Help: "Final spend reports done with, by result: delivered, late (after the grant was reclaimed: recorded, freed nothing), rejected (refused by Tally, set aside in Dir as .rejected)"},
			[]string{"result"}),
		undelivered: prometheus.NewGauge(prometheus.GaugeOpts{Name: "tally_admit_spend_reports_undelivered",
			Help: "Final spend reports kept in Dir, not yet delivered to Tally"}),
		bypassFiles: prometheus.NewGauge(prometheus.GaugeOpts{Name: "tally_admit_bypass_reports_pending",
			Help: "Bypass reports sealed in Dir, not yet delivered to Tally"}),
		bypassDamaged: prometheus.NewCounter(prometheus.CounterOpts{Name: "tally_admit_bypass_reports_damaged_total",
			Help: "Bypass reports set aside in Dir as .damaged (a line fails its CRC-32C or does not parse): not reported, they need an operator"}),
		reachable: prometheus.NewGauge(prometheus.GaugeOpts{Name: "tally_admit_tally_reachable",
			Help: "1 while Tally answers, 0 while the client admits by on_unreachable"}),
		forgotten: prometheus.NewCounter(prometheus.CounterOpts{Name: "tally_admit_budgets_forgotten_total",
			Help: "Budgets forgotten: unused by any Admit for ForgetAfter and holding nothing"}),
	}
	m.reachable.Set(1)
	if reg == nil {
		return m, nil
	}
	cols := []prometheus.Collector{&admissions{c: c, m: m}, m.calls, m.latency, m.reports, m.undelivered, m.bypassFiles, m.bypassDamaged, m.reachable, m.forgotten}
	for i, col := range cols {
		if err := reg.Register(col); err != nil {
			for _, done := range cols[:i] {
				reg.Unregister(done)
			}
			return nil, err
		}
	}
	m.reg, m.registered = reg, cols
	return m, nil
}

// unregister takes the collectors off the registry they were registered
// on (none when Config.Registerer was nil).
func (m *metrics) unregister() {
	for _, col := range m.registered {
		m.reg.Unregister(col)
	}
	m.registered = nil
}

// admit counts an admission answered off the hot path.
func (m *metrics) admit(d Decision) {
	if d.How < numHow {
		m.slow[d.How][b2i(d.Admitted)].Add(1)
	}
}

// call counts a call to Tally and its latency.
func (m *metrics) call(kind string, err error, took time.Duration) {
	var ex *exhaustedError
	var ne *notExactError
	var te *TallyError
	var le *loadError
	var ue *unreachableError
	var ch *changingError
	result := "ok"
	switch {
	case err == nil:
	case errors.As(err, &ex):
		result = "exhausted"
	case errors.As(err, &ne):
		result = "not_exact"
	case errors.As(err, &te):
		result = "refused"
	case errors.As(err, &le):
		result = "overloaded"
	case errors.As(err, &ch):
		result = "changing"
	case errors.As(err, &ue):
		result = "unreachable"
	default:
		result = "canceled"
	}
	m.calls.WithLabelValues(kind, result).Inc()
	if result != "unreachable" && result != "canceled" {
		m.latency.WithLabelValues(kind).Observe(took.Seconds())
	}
}

// observeState sets the gauges that count files in Dir.
func (m *metrics) observeState(c *Client) {
	m.bypassFiles.Set(float64(c.pendingBypassReports()))
}

// admissions collects tally_admit_admissions_total (hot-path shards plus
// the slow path's counters) and what is held.
type admissions struct {
	c *Client
	m *metrics
}

func (a *admissions) Describe(ch chan<- *prometheus.Desc) {
	ch <- descAdmissions
	ch <- descHeld
	ch <- descGrants
	ch <- descBudgets
}

func (a *admissions) Collect(ch chan<- prometheus.Metric) {
	var fromGrant, decAdmitted, decRefused, noRule, held int64
	var grants, budgets int
	count := func(s *shard) {
		fromGrant += s.taken.Load()
		decAdmitted += s.decAdmitted.Load()
		decRefused += s.decRefused.Load()
		noRule += s.noRule.Load()
	}
	a.m.retiring.RLock()
	defer a.m.retiring.RUnlock()
	count(&a.m.retired)
	for b := range a.c.budgets.all {
		budgets++
		for i := range b.shards {
			count(&b.shards[i])
		}
		held += b.available()
		grants += int(b.heldGrants.Load())
	}
	counts := map[[2]string]float64{
		{"grant", "admitted"}:    float64(fromGrant),
		{"decision", "admitted"}: float64(decAdmitted),
		{"decision", "refused"}:  float64(decRefused),
		{"no-rule", "admitted"}:  float64(noRule),
	}
	for h := range numHow {
		for ok, outcome := range []string{"refused", "admitted"} {
			if v := a.m.slow[h][ok].Load(); v > 0 {
				counts[[2]string{h.String(), outcome}] += float64(v)
			}
		}
	}
	for k, v := range counts {
		ch <- prometheus.MustNewConstMetric(descAdmissions, prometheus.CounterValue, v, k[0], k[1])
	}
	ch <- prometheus.MustNewConstMetric(descHeld, prometheus.GaugeValue, float64(held))
	ch <- prometheus.MustNewConstMetric(descGrants, prometheus.GaugeValue, float64(grants))
	ch <- prometheus.MustNewConstMetric(descBudgets, prometheus.GaugeValue, float64(budgets))
}

func b2i(b bool) int {
	if b {
		return 1
	}
	return 0
}

// retire adds a forgotten budget's hot-path counts to the client's own.
func (m *metrics) retire(b *budget) {
	for i := range b.shards {
		s := &b.shards[i]
		m.retired.taken.Add(s.taken.Load())
		m.retired.decAdmitted.Add(s.decAdmitted.Load())
		m.retired.decRefused.Add(s.decRefused.Load())
		m.retired.noRule.Add(s.noRule.Load())
	}
	m.forgotten.Inc()
}
