package api

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"time"
	"unicode/utf8"

	"github.com/go-chi/chi/v5"

	"github.com/tally-ledger/tally/quota"
)

func (a *API) getQuotas(w http.ResponseWriter, r *http.Request) error {
	ctx := r.Context()
	customer, err := readableCustomer(r)
	if err != nil {
		return err
	}
	if _, err := queryParams(r); err != nil {
		return err
	}
	var exists bool
	if err := a.pool.QueryRow(ctx, qCustomerExists, customer).Scan(&exists); err != nil {
		return fmt.Errorf("customer %q: %w", customer, err)
	}
	if !exists {
		return customerNotFound(customer)
	}
	items, err := quota.StatusWith(ctx, a.pool, customer, quota.StatusOptions{Now: a.now(), IngestTopic: a.topic})
	if err != nil {
		return err
	}
	// Every quota of the customer at once: a customer has one per meter.
	if principalFrom(ctx).admin {
		writeJSON(w, http.StatusOK, Page[quota.MeterStatus]{Items: items})
		return nil
	}
	views := make([]customerQuota, len(items))
	for i, it := range items {
		views[i] = customerQuota{MeterStatus: it, Rule: customerRule{Rule: it.Rule}}
		if it.Decision != nil {
			views[i].Decision = &customerDecision{Decision: *it.Decision}
		}
	}
	writeJSON(w, http.StatusOK, Page[customerQuota]{Items: views})
	return nil
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
	// Actor is who makes the change; default "admin" (the token's principal).
	Actor *string `json:"actor"`
}

// putQuota stores a new version of the customer's rule for meter (docs/design.md §5).
// The customer need not exist yet: a rule may come before the first usage.
func (a *API) putQuota(w http.ResponseWriter, r *http.Request) error {
	customer, meter := chi.URLParam(r, "customer"), chi.URLParam(r, "meter")
	var errs []FieldError
	for _, p := range []struct{ field, v string }{{"customer", customer}, {"meter", meter}} {
		if !validID(p.v) {
			errs = append(errs, FieldError{Field: p.field, Detail: quote(p.v) + " is not 1-128 characters of A-Z a-z 0-9 . _ : -"})
		}
	}
	if len(errs) > 0 {
		return invalid(errs...)
	}
	if _, err := queryParams(r); err != nil {
		return err
	}
	raw, err := io.ReadAll(r.Body)
	if err != nil {
		return err
	}
	r.Body = io.NopCloser(bytes.NewReader(raw))
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
	// quota's decoder stops at the first value of a wrong JSON type and
	// reports it as "body"; check those here, leave them out, and let quota
	// check the rest, so every problem is reported at once.
	var fields map[string]json.RawMessage
	if err := json.Unmarshal(raw, &fields); err != nil {
		return malformed(err.Error())
	}
	delete(fields, "actor")
	for name, v := range fields {
		var dest any
		want := "a string"
		switch name {
		case "mode", "on_stale", "reason", "admission", "on_unreachable":
			dest = new(string)
		case "stale_after", "local_every":
			dest, want = new(quota.Duration), `whole seconds or a duration such as "5m"`
		case "effective_at":
			dest, want = new(time.Time), "an RFC 3339 time such as 2026-12-01T00:00:00Z"
		default:
			continue
		}
		if json.Unmarshal(v, dest) != nil {
			errs = append(errs, FieldError{Field: name, Detail: "must be " + want + ", not " + quote(string(v))})
			delete(fields, name)
		}
	}
	rest, err := json.Marshal(fields)
	if err != nil {
		return err
	}
	in, err := quota.DecodePutRequest(bytes.NewReader(rest), customer, meter, actor)
	if err != nil && !errors.Is(err, quota.ErrInvalid) {
		return err
	}
	if err != nil || len(errs) > 0 {
		if err != nil {
			errs = append(errs, quotaFieldErrors(err)...)
		}
		sortFieldErrors(errs)
		return invalid(errs...)
	}
	if in.EffectiveAt.IsZero() {
		in.EffectiveAt = a.now() // the API's clock, like every other "now" here
	}
	rule, err := quota.PutRuleDB(r.Context(), a.pool, in)
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
