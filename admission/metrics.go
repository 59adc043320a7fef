package admission

import (
	"context"
	"errors"
	"log/slog"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/shopspring/decimal"
	"github.com/tally-ledger/tally/internal/pgnamed"
)

// Metrics counts what the grant protocol does, for Prometheus. Amounts
// are exported as float64 samples: they are for watching, never for
// billing (the ledger and the grant rows stay exact).
type Metrics struct {
	issued      prometheus.Counter
	issuedUnits prometheus.Counter
	refused     *prometheus.CounterVec
	issueTime   *prometheus.HistogramVec
	renewals    *prometheus.CounterVec
	releases    *prometheus.CounterVec
	bypassRep   *prometheus.CounterVec
	bypassUnits prometheus.Counter
	bypassN     prometheus.Counter
	debits      *prometheus.CounterVec
	debitTime   *prometheus.HistogramVec
}

// Refusal reasons, the label of tally_grants_refused_total and of
// renewals and releases refused.
var refusalReasons = []string{"budget_exhausted", "not_exact", "stale_generation", "not_holder", "grant_ended",
	"not_found", "invalid", "error"}

// reason names err's kind for a metric label (a fixed set).
func reason(err error) string {
	switch {
	case err == nil:
		return "ok"
	case errors.Is(err, ErrNotFound):
		return "not_found"
	}
	if _, ok := errors.AsType[*BudgetExhaustedError](err); ok {
		return "budget_exhausted"
	}
	if _, ok := errors.AsType[*NotExactError](err); ok {
		return "not_exact"
	}
	if _, ok := errors.AsType[*StaleGenerationError](err); ok {
		return "stale_generation"
	}
	if _, ok := errors.AsType[*FencedError](err); ok {
		return "not_holder"
	}
	if _, ok := errors.AsType[*GrantEndedError](err); ok {
		return "grant_ended"
	}
	if _, ok := errors.AsType[*SpentError](err); ok {
		return "invalid"
	}
	if _, ok := errors.AsType[*FieldError](err); ok {
		return "invalid"
	}
	return "error"
}

// NewMetrics registers the protocol's counters with reg, and a collector
// that reads, at each scrape, the live and expired grants of open periods
// from db (bounded by a 2 s timeout; a failed read exports nothing and
// logs). now is the clock of the grant store.
func NewMetrics(reg prometheus.Registerer, db DBTX, now func() time.Time, log *slog.Logger) (*Metrics, error) {
	m := &Metrics{
		issued: prometheus.NewCounter(prometheus.CounterOpts{Name: "tally_grants_issued_total",
			Help: "Grants issued."}),
		issuedUnits: prometheus.NewCounter(prometheus.CounterOpts{Name: "tally_grants_issued_units_total",
			Help: "Units granted (sum of issued amounts)."}),
		refused: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "tally_grants_refused_total",
			Help: "Grant requests refused, by reason: budget_exhausted, not_exact, stale_generation, invalid, error (and not_holder, grant_ended, not_found, which a grant request does not meet: the reasons of renewals and releases)."}, []string{"reason"}),
		issueTime: prometheus.NewHistogramVec(prometheus.HistogramOpts{Name: "tally_grant_issue_duration_seconds",
			Help:    "Time to answer a grant request (the issuing transaction included), by outcome: issued or refused.",
			Buckets: []float64{.0005, .001, .0025, .005, .01, .025, .05, .1, .25, .5, 1, 2.5}}, []string{"outcome"}),
		renewals: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "tally_grant_renewals_total",
			Help: "Grant renewals, by outcome: ok, or the reason of a refusal."}, []string{"outcome"}),
		releases: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "tally_grant_releases_total",
			Help: "Grant releases, by outcome: ok, or the reason of a refusal."}, []string{"outcome"}),
		bypassRep: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "tally_bypass_reports_total",
			Help: "Bypass reports received from gateways, by outcome: ok, or the reason of a refusal (a resent report counts again)."}, []string{"outcome"}),
		bypassUnits: prometheus.NewCounter(prometheus.CounterOpts{Name: "tally_bypassed_units_total",
			Help: "Units admitted without a grant, as reported in accepted bypass reports (a resent report counts again)."}),
		bypassN: prometheus.NewCounter(prometheus.CounterOpts{Name: "tally_bypassed_admissions_total",
			Help: "Admissions made without a grant, as reported in accepted bypass reports (a resent report counts again)."}),
		debits: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "tally_debits_total",
			Help: "Debit requests, by outcome: ok, or the reason of a refusal (budget_exhausted, not_exact, stale_generation, invalid, error)."}, []string{"outcome"}),
		debitTime: prometheus.NewHistogramVec(prometheus.HistogramOpts{Name: "tally_debit_duration_seconds",
			Help:    "Time to answer a debit request (its transaction included), by outcome: debited or refused.",
			Buckets: []float64{.0005, .001, .0025, .005, .01, .025, .05, .1, .25, .5, 1, 2.5}}, []string{"outcome"}),
	}
	for _, r := range refusalReasons {
		m.refused.WithLabelValues(r)
	}
	// Each outcome a call can end in, exported at 0 from the start.
	for _, o := range []string{"ok", "budget_exhausted", "not_exact", "stale_generation", "invalid", "error"} {
		m.debits.WithLabelValues(o)
	}
	for _, o := range []string{"ok", "stale_generation", "not_holder", "grant_ended", "not_found", "invalid", "error"} {
		m.renewals.WithLabelValues(o)
		m.releases.WithLabelValues(o)
	}
	for _, o := range []string{"ok", "invalid", "error"} {
		m.bypassRep.WithLabelValues(o)
	}
	for _, o := range []string{"debited", "refused"} {
		m.debitTime.WithLabelValues(o)
	}
	for _, o := range []string{"issued", "refused"} {
		m.issueTime.WithLabelValues(o)
	}
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	cs := []prometheus.Collector{m.issued, m.issuedUnits, m.refused, m.issueTime, m.renewals, m.releases,
		m.bypassRep, m.bypassUnits, m.bypassN, m.debits, m.debitTime, &grantCollector{db: db, now: now, log: log}}
	for _, c := range cs {
		if err := reg.Register(c); err != nil {
			return nil, err
		}
	}
	return m, nil
}

// Debited records the answer to a debit request that took d.
func (m *Metrics) Debited(err error, d time.Duration) {
	m.debits.WithLabelValues(reason(err)).Inc()
	outcome := "debited"
	if err != nil {
		outcome = "refused"
	}
	m.debitTime.WithLabelValues(outcome).Observe(d.Seconds())
}

// Issued records the answer to a grant request that took d.
func (m *Metrics) Issued(g Grant, err error, d time.Duration) {
	if err != nil {
		m.refused.WithLabelValues(reason(err)).Inc()
		m.issueTime.WithLabelValues("refused").Observe(d.Seconds())
		return
	}
	m.issued.Inc()
	m.issuedUnits.Add(g.Amount.InexactFloat64())
	m.issueTime.WithLabelValues("issued").Observe(d.Seconds())
}

// Renewed records the answer to a renewal.
func (m *Metrics) Renewed(err error) { m.renewals.WithLabelValues(reason(err)).Inc() }

// Released records the answer to a release.
func (m *Metrics) Released(err error) { m.releases.WithLabelValues(reason(err)).Inc() }

// Bypassed records the answer to a bypass report.
func (m *Metrics) Bypassed(r BypassReport, err error) {
	m.bypassRep.WithLabelValues(reason(err)).Inc()
	if err != nil {
		return
	}
	var units decimal.Decimal
	var n int64
	for _, it := range r.Items {
		units = units.Add(it.Amount)
		n += it.Admissions
	}
	m.bypassUnits.Add(units.InexactFloat64())
	m.bypassN.Add(float64(n))
}

var (
	descLive = prometheus.NewDesc("tally_grants_live",
		"Grants live now (not released, reclaim_at not reached), in open periods.", nil, nil)
	descLiveUnits = prometheus.NewDesc("tally_grants_live_units",
		"Units held by live grants, in open periods.", nil, nil)
	descExpired = prometheus.NewDesc("tally_grants_expired",
		"Grants of open periods that ended at reclaim_at without a final report (counted fully spent).", nil, nil)
	descStranded = prometheus.NewDesc("tally_grants_expired_stranded_units",
		"Units granted and never reported spent by the expired grants of open periods: capacity lost to the budget until the period ends.", nil, nil)
)

// grantCollector reads the gauges at scrape time: every API replica
// exports the same values (aggregate them with max, not sum).
type grantCollector struct {
	db  DBTX
	now func() time.Time
	log *slog.Logger
}

func (c *grantCollector) Describe(ch chan<- *prometheus.Desc) {
	ch <- descLive
	ch <- descLiveUnits
	ch <- descExpired
	ch <- descStranded
}

func (c *grantCollector) Collect(ch chan<- prometheus.Metric) {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	var live, expired int64
	var lu, su decimal.Decimal
	now := c.now().UTC()
	if err := c.db.QueryRow(ctx, qGrantGauges, pgnamed.Args{"now": now}).Scan(&live, numeric(&lu), &expired, numeric(&su)); err != nil {
		c.log.Warn("admission: grant gauges not read", "err", err)
		return
	}
	ch <- prometheus.MustNewConstMetric(descLive, prometheus.GaugeValue, float64(live))
	ch <- prometheus.MustNewConstMetric(descLiveUnits, prometheus.GaugeValue, lu.InexactFloat64())
	ch <- prometheus.MustNewConstMetric(descExpired, prometheus.GaugeValue, float64(expired))
	ch <- prometheus.MustNewConstMetric(descStranded, prometheus.GaugeValue, su.InexactFloat64())
}
