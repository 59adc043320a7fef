package api

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"time"

	"github.com/google/uuid"
	"github.com/shopspring/decimal"

	"github.com/tally-ledger/tally/ingest"
	"github.com/tally-ledger/tally/ledger"
	"github.com/tally-ledger/tally/periods"
)

// What the API offers callers in the same process (the web console,
// package console): the same token check, usage answer and replay the
// REST handlers use, without HTTP. Errors are the API's (a *Problem for
// an unknown token, customer or period).

// Caller is whom a token belongs to: the admin, a customer's read token,
// or a gateway's grant token.
type Caller struct {
	Admin    bool
	Customer string // a customer token's customer
	Gateway  string // a gateway token's holder
}

// Identify checks a token as the REST API does (cached the same way; a
// revoked token stops working as soon as the API hears of it). An unknown
// or revoked token is a *Problem with status 401.
func (a *API) Identify(ctx context.Context, token string) (Caller, error) {
	p, err := a.identify(ctx, token)
	if err != nil {
		return Caller{}, err
	}
	return Caller{Admin: p.admin, Customer: p.customer, Gateway: p.gateway}, nil
}

// Usage is a customer's usage in one period by local day, as GET
// /v1/customers/{customer}/usage answers it (the same cache and rollups).
type Usage struct {
	Customer   string
	Period     string // its name: the start date in the customer's zone
	Start, End time.Time
	State      periods.State
	GraceEnds  time.Time
	AsOf       *time.Time // usage is complete through AsOf; nil: unknown
	LagSeconds *float64   // now - AsOf, to the millisecond
	Meters     []MeterUsage
	// Gauges and Uniques: the period's gauges and unique meters
	// (docs/design.md §16), gauges through now.
	Gauges  []ledger.GaugeUsage
	Uniques []ledger.UniqueUsage
}

// MeterUsage is one meter's usage in the period: its total and its days
// (only days with usage).
type MeterUsage struct {
	Meter string
	Total decimal.Decimal
	Days  []UsageBucket
}

// UsageBucket is one local day of usage.
type UsageBucket struct {
	Start, End time.Time
	Quantity   decimal.Decimal
}

// Usage answers customer's usage by day in the period ref ("current",
// "previous" or a start date). The customer must exist (else a 404
// *Problem); the caller decides who may read it.
func (a *API) Usage(ctx context.Context, customer, ref string) (Usage, error) {
	if err := checkID("customer", customer); err != nil {
		return Usage{}, err
	}
	ans, err := a.answerUsage(ctx, customer, ref, "", false)
	if err != nil {
		return Usage{}, err
	}
	pv := ans.period
	u := Usage{Customer: customer, Period: pv.Name, Start: pv.Start, End: pv.End, State: pv.State,
		GraceEnds: *pv.GraceEnds, AsOf: ans.asOf, LagSeconds: ans.lag}
	for _, it := range ans.data.items {
		var raw struct {
			Meter  string       `json:"meter"`
			Series []bucketView `json:"series"`
		}
		if err := json.Unmarshal(it.json, &raw); err != nil {
			return Usage{}, fmt.Errorf("usage: %w", err)
		}
		m := MeterUsage{Meter: raw.Meter}
		if m.Total, err = decimal.NewFromString(it.total); err != nil {
			return Usage{}, fmt.Errorf("usage: meter %q: total: %w", raw.Meter, err)
		}
		for _, b := range raw.Series {
			var ub UsageBucket
			if ub.Start, err = time.Parse(time.RFC3339Nano, b.Start); err == nil {
				ub.End, err = time.Parse(time.RFC3339Nano, b.End)
			}
			if err == nil {
				ub.Quantity, err = decimal.NewFromString(b.Quantity)
			}
			if err != nil {
				return Usage{}, fmt.Errorf("usage: meter %q: %w", raw.Meter, err)
			}
			m.Days = append(m.Days, ub)
		}
		u.Meters = append(u.Meters, m)
	}
	u.Gauges, u.Uniques = ans.data.kinds.Gauges(a.now()), ans.data.kinds.Uniques
	return u, nil
}

// IdentifyCharged checks a token as Identify does and takes cost requests
// from its per-token limit, as that many REST requests would (a console
// page that reads ten things costs ten): the admin token has none. Over
// the limit it is a *Problem with status 429 and RetryAfter (seconds).
func (a *API) IdentifyCharged(ctx context.Context, token string, cost int) (Caller, error) {
	p, err := a.identify(ctx, token)
	if err != nil {
		return Caller{}, err
	}
	if ok, wait := a.chargeToken(p, cost); !ok {
		secs := retryAfterSeconds(wait)
		return Caller{}, &Problem{Type: TypeRateLimited, Title: "Too many requests", Status: http.StatusTooManyRequests,
			Detail: "this token sends too many requests; retry after the number of seconds in Retry-After", RetryAfter: &secs}
	}
	return Caller{Admin: p.admin, Customer: p.customer, Gateway: p.gateway}, nil
}

type routeLabelKey struct{}

// Guard puts a handler of the same process (the web console) behind what
// protects the API: a request id, the access log and HTTP metrics (with
// route as their route label: a fixed string), panic recovery, the
// per-address limits, the body read whole within BodyTimeout before a
// slot is taken, and MaxInFlight. What these refuse is answered
// as the API answers it (problem+json, Retry-After).
func (a *API) Guard(route string, next http.Handler) http.Handler {
	inner := a.observe(a.recoverer(a.shed(next)))
	return assignRequestID(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		inner.ServeHTTP(w, r.WithContext(context.WithValue(r.Context(), routeLabelKey{}, route)))
	}))
}

// ReplayDeadLetter replays a dead letter as POST
// /v1/dead-letters/{id}/replay does (the caller checks it is the admin).
func (a *API) ReplayDeadLetter(ctx context.Context, id uuid.UUID) (ingest.ReplayResult, error) {
	return a.replay(ctx, id)
}
