package api

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"unicode/utf8"

	"github.com/go-chi/chi/v5"

	"github.com/tally-ledger/tally/internal/ids"
	"github.com/tally-ledger/tally/quota"
)

// requireCustomer answers a customer Tally does not know with the 404 of
// every route under /v1/customers/{c}.
func (a *API) requireCustomer(ctx context.Context, customer string) error {
	var exists bool
	if err := a.pool.QueryRow(ctx, qCustomerExists, customer).Scan(&exists); err != nil {
		return fmt.Errorf("customer %q: %w", customer, err)
	}
	if !exists {
		return customerNotFound(customer)
	}
	return nil
}

func (a *API) getQuotas(w http.ResponseWriter, r *http.Request) error {
	ctx := r.Context()
	customer, err := readableCustomer(r)
	if err != nil {
		return err
	}
	if _, err := queryParams(r); err != nil {
		return err
	}
	if err := a.requireCustomer(ctx, customer); err != nil {
		return err
	}
	items, err := quota.StatusWith(ctx, a.pool, customer, quota.StatusOptions{Now: a.now(), IngestTopic: a.topic})
	if err != nil {
		return err
	}
	rates, err := rateRules(ctx, a, customer)
	if err != nil {
		return err
	}
	// Every quota of the customer at once: a customer has one per meter.
	if principalFrom(ctx).admin {
		writeJSON(w, http.StatusOK, quotaPage[quota.MeterStatus, quota.Rule]{Items: items, RateRules: rates})
		return nil
	}
	views := make([]customerQuota, len(items))
	for i, it := range items {
		views[i] = customerQuota{MeterStatus: it, Rule: customerRule{Rule: it.Rule}}
		if it.Decision != nil {
			views[i].Decision = &customerDecision{Decision: *it.Decision}
		}
	}
	rateViews := make([]customerRule, len(rates))
	for i, r := range rates {
		rateViews[i] = customerRule{Rule: r}
	}
	writeJSON(w, http.StatusOK, quotaPage[customerQuota, customerRule]{Items: views, RateRules: rateViews})
	return nil
}

// quotaPage is a customer's quotas: its period quotas with their usage
// (items), and its rate rules in force (docs/design.md §17), whose
// buckets GET /v1/customers/{customer}/rate-budgets shows.
type quotaPage[Q, R any] struct {
	Items      []Q    `json:"items"`
	RateRules  []R    `json:"rate_rules"`
	NextCursor string `json:"next_cursor"`
}

// rateRules is the customer's own rate rules in force now, by meter.
func rateRules(ctx context.Context, a *API, customer string) ([]quota.Rule, error) {
	rules, err := quota.RulesAt(ctx, a.pool, customer, a.now())
	if err != nil {
		return nil, err
	}
	rates := []quota.Rule{}
	for _, r := range rules {
		if r.Rate != nil {
			rates = append(rates, r)
		}
	}
	return rates, nil
}

// What a customer token sees of its quotas: its limits, usage and the
// state gateways act on. Not the operator's policy and notes: the mode
// (shadow says the quota is not enforced), on_stale, stale_after and
// on_unreachable (when a gateway admits usage it cannot check), and who changed the rule and
// why. Each hidden field is shadowed by a shallower field of the same
// JSON name that is always empty, which encoding/json prefers and omits.
type customerQuota struct {
	quota.MeterStatus
	Rule     customerRule      `json:"rule"`
	Decision *customerDecision `json:"decision"`
}

type customerRule struct {
	quota.Rule
	Mode       *struct{} `json:"mode,omitempty"`
	OnStale    *struct{} `json:"on_stale,omitempty"`
	StaleAfter *struct{} `json:"stale_after,omitempty"`
	Actor      *struct{} `json:"actor,omitempty"`
	Reason     *struct{} `json:"reason,omitempty"`
	// What a gateway does when it cannot reach Tally: policy, like on_stale.
	OnUnreachable *struct{} `json:"on_unreachable,omitempty"`
	LocalAmount   *struct{} `json:"local_amount,omitempty"`
	LocalEvery    *struct{} `json:"local_every,omitempty"`
}

type customerDecision struct {
	quota.Decision
	Mode       *struct{} `json:"mode,omitempty"`
	OnStale    *struct{} `json:"on_stale,omitempty"`
	StaleAfter *struct{} `json:"stale_after,omitempty"`
}

// quotaBody checks the shape of a PUT body the API's way (content type,
// syntax, unknown fields, trailing data) before quota decodes its values.
// Value fields stay raw: quota reports their problems, all at once.
type quotaBody struct {
	Limit       json.RawMessage `json:"limit"`
	WarnAt      json.RawMessage `json:"warn_at"`
	Mode        json.RawMessage `json:"mode"`
	OnStale     json.RawMessage `json:"on_stale"`
	StaleAfter  json.RawMessage `json:"stale_after"`
	EffectiveAt json.RawMessage `json:"effective_at"`
	Reason      json.RawMessage `json:"reason"`
	// Exact admission settings, checked by quota like the rest.
	Admission     json.RawMessage `json:"admission"`
	OnUnreachable json.RawMessage `json:"on_unreachable"`
	LocalAmount   json.RawMessage `json:"local_amount"`
	LocalEvery    json.RawMessage `json:"local_every"`
	// A rate rule (docs/design.md §17): "rate" instead of "limit".
	Rate    json.RawMessage `json:"rate"`
	MaxSkew json.RawMessage `json:"max_skew"`
	// Actor is who makes the change; default "admin" (the token's principal).
	Actor *string `json:"actor"`
}

// putQuota stores a new version of the customer's rule for meter (docs/design.md §5).
// The customer need not exist yet: a rule may come before the first usage.
func (a *API) putQuota(w http.ResponseWriter, r *http.Request) error {
	customer, meter := chi.URLParam(r, "customer"), chi.URLParam(r, "meter")
	var errs []FieldError
	for _, p := range []struct{ field, v string }{{"customer", customer}, {"meter", meter}} {
		if !ids.Valid(p.v) {
			errs = append(errs, FieldError{Field: p.field, Detail: quote(p.v) + " is not 1-128 characters of A-Z a-z 0-9 . _ : -"})
		}
	}
	if len(errs) > 0 {
		return invalid(errs...)
	}
	if _, err := queryParams(r); err != nil {
		return err
	}
	var body quotaBody
	if err := decodeJSON(r, &body); err != nil {
		return err
	}
	actor := "admin"
	if body.Actor != nil {
		actor = *body.Actor
		if actor == "" || utf8.RuneCountInString(actor) > 200 {
			return invalidField("actor", "1-200 characters, or leave it out for \"admin\"")
		}
	}
	// The body's values stay raw until here so that a value of a wrong JSON
	// type is one field error among all the others, not the first and only
	// one. Decimals stay raw: quota reads them.
	p := quota.PutRequest{Limit: body.Limit, WarnAt: body.WarnAt, LocalAmount: body.LocalAmount, Rate: body.Rate}
	const (
		aString  = "a string"
		duration = `whole seconds or a duration such as "5m"`
	)
	for _, f := range []struct {
		name string
		raw  json.RawMessage
		set  func(json.RawMessage) error
		want string
	}{
		{"mode", body.Mode, into(&p.Mode), aString},
		{"on_stale", body.OnStale, into(&p.OnStale), aString},
		{"reason", body.Reason, into(&p.Reason), aString},
		{"admission", body.Admission, into(&p.Admission), aString},
		{"on_unreachable", body.OnUnreachable, into(&p.OnUnreachable), aString},
		{"stale_after", body.StaleAfter, intoPtr(&p.StaleAfter), duration},
		{"local_every", body.LocalEvery, intoPtr(&p.LocalEvery), duration},
		{"max_skew", body.MaxSkew, intoPtr(&p.MaxSkew), duration},
		{"effective_at", body.EffectiveAt, intoPtr(&p.EffectiveAt), "an RFC 3339 time such as 2026-12-01T00:00:00Z"},
	} {
		if f.raw != nil && f.set(f.raw) != nil {
			errs = append(errs, FieldError{Field: f.name, Detail: "must be " + f.want + ", not " + quote(string(f.raw))})
		}
	}
	in, err := p.Input(customer, meter, actor)
	if err != nil && !errors.Is(err, quota.ErrInvalid) {
		return err
	}
	if err != nil || len(errs) > 0 {
		errs = append(errs, fieldsOf(err)...)
		sortFieldErrors(errs)
		return invalid(errs...)
	}
	// The API's clock, like every other "now" here; read once the rule's
	// lock is held, so a version without effective_at takes effect after
	// any version it waited for.
	rule, err := quota.PutRuleDBClock(r.Context(), a.pool, in, a.now)
	if err != nil {
		return err
	}
	status := http.StatusOK
	if rule.Version == 1 {
		status = http.StatusCreated
		w.Header().Set("Location", "/v1/customers/"+customer+"/quotas")
	}
	writeJSON(w, status, rule)
	return nil
}

// into returns a function that decodes a JSON value into *dst, leaving
// *dst as it was when the value does not decode.
func into[T any](dst *T) func(json.RawMessage) error {
	return func(raw json.RawMessage) error {
		var v T
		if err := json.Unmarshal(raw, &v); err != nil {
			return err
		}
		*dst = v
		return nil
	}
}

// intoPtr is into for an optional field: the value is decoded as a T and
// *dst points to it; null is the field left out (*dst stays nil), as it
// is for the string fields and on a pool's or the global rule.
func intoPtr[T any](dst **T) func(json.RawMessage) error {
	return func(raw json.RawMessage) error {
		if string(bytes.TrimSpace(raw)) == "null" {
			return nil // left out, as the other optional fields and a pool's rule read null
		}
		var v T
		if err := json.Unmarshal(raw, &v); err != nil {
			return err
		}
		*dst = &v
		return nil
	}
}
