package api

import (
	"errors"
	"fmt"
	"net/http"
	"strconv"
	"strings"
	"time"
	"unicode/utf8"

	"github.com/go-chi/chi/v5"
	"github.com/google/uuid"

	"github.com/tally-ledger/tally/alerts"
)

// Alerts (docs/design.md §15), admin only: rules, webhooks, events.

type alertBody struct {
	Subject           string           `json:"subject"`
	Meter             string           `json:"meter"`
	Thresholds        []thresholdInput `json:"thresholds"`
	NotifyOn          []string         `json:"notify_on"`
	HysteresisPercent *decimalInput    `json:"hysteresis_percent"`
	Endpoints         []string         `json:"endpoints"`
	Actor             *string          `json:"actor"`
}

// thresholdInput is alerts.Threshold as a request body gives it.
type thresholdInput struct {
	Value   *decimalInput `json:"value"`
	Percent *decimalInput `json:"percent"`
}

// alertView is a rule with the state of each subject × threshold.
type alertView struct {
	alerts.Rule
	States []alerts.SubjectState `json:"states"`
}

// TypeWebhookInUse: a webhook that live alert rules name is not deleted.
const TypeWebhookInUse = typePrefix + "webhook-in-use"

// alertsProblem maps the package's errors to problems.
func alertsProblem(err error) error {
	var inUse *alerts.WebhookInUseError
	if errors.As(err, &inUse) {
		return &Problem{Type: TypeWebhookInUse, Title: "Webhook in use", Status: http.StatusConflict,
			Detail: fmt.Sprintf("alert rules %s name webhook %s among their endpoints; change or delete them first",
				strings.Join(inUse.Rules, ", "), quote(inUse.Webhook))}
	}
	return err // a missing rule, webhook or event (validation.NotFoundError) is writeError's
}

func (a *API) putAlert(w http.ResponseWriter, r *http.Request) error {
	name := chi.URLParam(r, "name")
	if _, err := queryParams(r); err != nil {
		return err
	}
	var b alertBody
	if err := decodeJSON(r, &b); err != nil {
		return err
	}
	actor := "admin"
	if b.Actor != nil {
		if actor = *b.Actor; actor == "" || utf8.RuneCountInString(actor) > 200 {
			return invalidField("actor", "1-200 characters, or leave it out for \"admin\"")
		}
	}
	thresholds := make([]alerts.Threshold, len(b.Thresholds))
	for i, t := range b.Thresholds {
		thresholds[i] = alerts.Threshold{Value: t.Value.ptr(), Percent: t.Percent.ptr()}
	}
	rule, created, err := alerts.PutRule(r.Context(), a.pool, alerts.RuleInput{Name: name, Subject: b.Subject, Meter: b.Meter,
		Thresholds: thresholds, NotifyOn: b.NotifyOn, HysteresisPercent: b.HysteresisPercent.ptr(), Endpoints: b.Endpoints,
		Actor: actor}, a.now())
	if err != nil {
		return err
	}
	v, err := a.alertView(r, rule)
	if err != nil {
		return err
	}
	status := http.StatusOK
	if created {
		status = http.StatusCreated
		w.Header().Set("Location", "/v1/alerts/"+name)
	}
	writeJSON(w, status, v)
	return nil
}

func (a *API) alertView(r *http.Request, rule alerts.Rule) (alertView, error) {
	st, err := alerts.Status(r.Context(), a.pool, rule, a.topic, a.now())
	if err != nil {
		return alertView{}, err
	}
	return alertView{Rule: rule, States: st}, nil
}

func (a *API) getAlert(w http.ResponseWriter, r *http.Request) error {
	if _, err := queryParams(r); err != nil {
		return err
	}
	rule, err := alerts.GetRule(r.Context(), a.pool, chi.URLParam(r, "name"))
	if err != nil {
		return alertsProblem(err)
	}
	v, err := a.alertView(r, rule)
	if err != nil {
		return err
	}
	writeJSON(w, http.StatusOK, v)
	return nil
}

func (a *API) listAlerts(w http.ResponseWriter, r *http.Request) error {
	q, err := queryParams(r, "limit", "cursor")
	if err != nil {
		return err
	}
	rs, err := alerts.Rules(r.Context(), a.pool)
	if err != nil {
		return err
	}
	page, err := pageInMemory(r, q, rs, func(r alerts.Rule) []string { return []string{r.Name} }, nil)
	if err != nil {
		return err
	}
	writeJSON(w, http.StatusOK, page)
	return nil
}

func (a *API) deleteAlert(w http.ResponseWriter, r *http.Request) error {
	if _, err := queryParams(r); err != nil {
		return err
	}
	if err := alerts.DeleteRule(r.Context(), a.pool, chi.URLParam(r, "name"), "admin", a.now()); err != nil {
		return alertsProblem(err)
	}
	w.WriteHeader(http.StatusNoContent)
	return nil
}

type webhookBody struct {
	URL    string   `json:"url"`
	Events []string `json:"events"`
}

// webhookCreated is a webhook with its secret, shown once.
type webhookCreated struct {
	alerts.Webhook
	Secret string `json:"secret"`
}

func (a *API) putWebhook(w http.ResponseWriter, r *http.Request) error {
	name := chi.URLParam(r, "name")
	if _, err := queryParams(r); err != nil {
		return err
	}
	var b webhookBody
	if err := decodeJSON(r, &b); err != nil {
		return err
	}
	hook, secret, created, err := alerts.PutWebhook(r.Context(), a.pool, alerts.WebhookInput{Name: name, URL: b.URL,
		Events: b.Events, AllowPrivate: a.webhookAllowPrivate}, a.now())
	if err != nil {
		return err
	}
	if created {
		w.Header().Set("Location", "/v1/webhooks/"+name)
		writeJSON(w, http.StatusCreated, webhookCreated{Webhook: hook, Secret: secret})
		return nil
	}
	writeJSON(w, http.StatusOK, hook)
	return nil
}

func (a *API) getWebhook(w http.ResponseWriter, r *http.Request) error {
	if _, err := queryParams(r); err != nil {
		return err
	}
	hook, err := alerts.GetWebhook(r.Context(), a.pool, chi.URLParam(r, "name"))
	if err != nil {
		return alertsProblem(err)
	}
	writeJSON(w, http.StatusOK, hook)
	return nil
}

func (a *API) deleteWebhook(w http.ResponseWriter, r *http.Request) error {
	if _, err := queryParams(r); err != nil {
		return err
	}
	if err := alerts.DeleteWebhook(r.Context(), a.pool, chi.URLParam(r, "name")); err != nil {
		return alertsProblem(err)
	}
	w.WriteHeader(http.StatusNoContent)
	return nil
}

func (a *API) listWebhooks(w http.ResponseWriter, r *http.Request) error {
	q, err := queryParams(r, "limit", "cursor")
	if err != nil {
		return err
	}
	hs, err := alerts.Webhooks(r.Context(), a.pool)
	if err != nil {
		return err
	}
	page, err := pageInMemory(r, q, hs, func(h alerts.Webhook) []string { return []string{h.Name} }, nil)
	if err != nil {
		return err
	}
	writeJSON(w, http.StatusOK, page)
	return nil
}

// rotateBody is POST /v1/webhooks/{name}/rotate-secret's optional body.
type rotateBody struct {
	// KeepPreviousFor is how long the secret replaced keeps signing beside
	// the new one (none by default).
	KeepPreviousFor durationInput `json:"keep_previous_for"`
}

func (a *API) rotateWebhookSecret(w http.ResponseWriter, r *http.Request) error {
	name := chi.URLParam(r, "name")
	if _, err := queryParams(r); err != nil {
		return err
	}
	var in rotateBody
	if err := decodeOptionalJSON(r, &in); err != nil {
		return err
	}
	secret, err := alerts.RotateSecret(r.Context(), a.pool, name, time.Duration(in.KeepPreviousFor.Duration))
	if err != nil {
		return alertsProblem(err)
	}
	hook, err := alerts.GetWebhook(r.Context(), a.pool, name)
	if err != nil {
		return alertsProblem(err)
	}
	writeJSON(w, http.StatusOK, webhookCreated{Webhook: hook, Secret: secret})
	return nil
}

func (a *API) listAlertEvents(w http.ResponseWriter, r *http.Request) error {
	q, err := queryParams(r, "state", "alert", "limit", "cursor")
	if err != nil {
		return err
	}
	pr, errs := parsePage(r, q)
	f := alerts.EventFilter{Rule: q["alert"], State: q["state"], Limit: pr.Limit + 1}
	switch f.State {
	case "", "pending", "delivered", "failed":
	default:
		errs = append(errs, FieldError{Field: "state", Detail: quote(f.State) + ` must be "pending", "delivered" or "failed"`})
	}
	if strings.IndexByte(f.Rule, 0) >= 0 { // the one query parameter that reaches SQL unchecked
		errs = append(errs, FieldError{Field: "alert", Detail: nulDetail})
	}
	if len(pr.After) == 1 {
		if f.Before, err = strconv.ParseInt(pr.After[0], 10, 64); err != nil {
			errs = append(errs, FieldError{Field: "cursor", Detail: notACursor})
		}
	}
	if len(errs) > 0 {
		sortFieldErrors(errs)
		return invalid(errs...)
	}
	evs, err := alerts.Events(r.Context(), a.pool, f)
	if err != nil {
		return err
	}
	writeJSON(w, http.StatusOK, NewPage(evs, pr, func(e alerts.StoredEvent) []string {
		return []string{strconv.FormatInt(e.Seq, 10)}
	}))
	return nil
}

func (a *API) redeliverAlertEvent(w http.ResponseWriter, r *http.Request) error {
	if _, err := queryParams(r); err != nil {
		return err
	}
	id, err := uuid.Parse(chi.URLParam(r, "id"))
	if err != nil {
		return notFound("no alert event " + quote(chi.URLParam(r, "id")))
	}
	n, err := alerts.Redeliver(r.Context(), a.pool, id, alerts.DefaultRetryFor)
	if err != nil {
		return alertsProblem(err)
	}
	writeJSON(w, http.StatusOK, map[string]any{"id": id, "deliveries_requeued": n})
	return nil
}
