package quota

import (
	"context"
	"fmt"
	"time"

	"github.com/shopspring/decimal"
)

// MeterStatus is one quota of a customer as GET /v1/customers/{customer}/quotas
// returns it: the current rule, the period's usage read live from the
// ledger, and the last decision the enforcer published.
type MeterStatus struct {
	Meter       string          `json:"meter"`
	Rule        Rule            `json:"rule"`
	Period      string          `json:"period"`
	PeriodStart time.Time       `json:"period_start"`
	PeriodEnd   time.Time       `json:"period_end"`
	State       State           `json:"state"`
	Used        decimal.Decimal `json:"used"`
	Remaining   decimal.Decimal `json:"remaining"`
	AsOf        *time.Time      `json:"as_of"`
	LagSeconds  *Seconds        `json:"lag_seconds"`
	// Projected uses the rollup-bucket rate (hours), coarser than the
	// enforcer's own samples.
	Projected decimal.Decimal `json:"projected"`
	// Decision is the last decision published for this quota (what
	// gateways act on); null until the enforcer has published one.
	Decision *Decision `json:"decision"`
}

// StatusOptions tune StatusWith. Zero values take the defaults.
type StatusOptions struct {
	Now         time.Time     // default time.Now()
	IngestTopic string        // default "tally.meter-batches"
	RateWindow  time.Duration // default 5m
}

// Status returns every current quota of customer, ordered by meter.
// A customer without rules has none (an empty slice, not an error).
func Status(ctx context.Context, db DBTX, customer string) ([]MeterStatus, error) {
	return StatusWith(ctx, db, customer, StatusOptions{})
}

// StatusWith is Status with options.
func StatusWith(ctx context.Context, db DBTX, customer string, o StatusOptions) ([]MeterStatus, error) {
	if o.Now.IsZero() {
		o.Now = time.Now()
	}
	if o.IngestTopic == "" {
		o.IngestTopic = DefaultIngestTopic
	}
	if o.RateWindow == 0 {
		o.RateWindow = DefaultRateWindow
	}
	now := o.Now.UTC().Truncate(time.Microsecond)
	var byCust bool
	if err := db.QueryRow(ctx, qHasIngestCustomers).Scan(&byCust); err != nil {
		return nil, fmt.Errorf("quota: %w", err)
	}
	snap, err := loadSnapshot(ctx, db, snapshotQuery{now: now, customer: &customer, ingestTopic: o.IngestTopic, window: o.RateWindow, byCustomer: byCust})
	if err != nil {
		return nil, err
	}
	published, err := Decisions(ctx, db, customer)
	if err != nil {
		return nil, err
	}
	byMeter := map[string]Decision{}
	for _, d := range published {
		byMeter[d.Meter] = d
	}
	out := make([]MeterStatus, 0, len(snap))
	for _, u := range snap {
		d := decide(u.rule, u.period, u.used, u.asOf, u.fallback, now)
		s := MeterStatus{
			Meter: u.rule.Meter, Rule: u.rule, Period: u.period.Name,
			PeriodStart: u.period.Start.UTC(), PeriodEnd: u.period.End.UTC(),
			State: d.State, Used: d.Used, Remaining: d.Remaining, AsOf: d.AsOf, LagSeconds: d.LagSeconds,
			Projected: d.Projected,
		}
		if p, ok := byMeter[u.rule.Meter]; ok {
			s.Decision = &p
		}
		out = append(out, s)
	}
	return out, nil
}
