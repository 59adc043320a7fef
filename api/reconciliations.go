package api

import (
	"errors"
	"net/http"
	"time"

	"github.com/google/uuid"

	"github.com/tally-ledger/tally/internal/ids"
	"github.com/tally-ledger/tally/periods"
	"github.com/tally-ledger/tally/reconcile"
)

// checkPeriodRef reports a period reference that is neither current,
// previous nor a date.
func checkPeriodRef(field, s string) *FieldError {
	if s == "current" || s == "previous" {
		return nil
	}
	if _, err := time.Parse(time.DateOnly, s); err == nil && len(s) == len(time.DateOnly) {
		if periods.CheckRef(s) != nil {
			return &FieldError{Field: field, Detail: quote(s) + " is " + periods.RangeText}
		}
		return nil
	}
	return &FieldError{Field: field, Detail: quote(s) + ` is not "current", "previous" or a period start date YYYY-MM-DD`}
}

func (a *API) listReconciliations(w http.ResponseWriter, r *http.Request) error {
	q, err := queryParams(r, "period", "limit", "cursor")
	if err != nil {
		return err
	}
	pr, errs := parsePage(r, q)
	period, ok := q["period"]
	if ok {
		if fe := checkPeriodRef("period", period); fe != nil {
			errs = append(errs, *fe)
		}
	}
	var after uuid.UUID
	if len(pr.After) == 1 {
		id, err := uuid.Parse(pr.After[0])
		if err != nil {
			errs = append(errs, FieldError{Field: "cursor", Detail: notACursor})
		}
		after = id
	} else if pr.After != nil {
		errs = append(errs, FieldError{Field: "cursor", Detail: notACursor})
	}
	if len(errs) > 0 {
		sortFieldErrors(errs)
		return invalid(errs...)
	}
	rows, err := reconcile.List(r.Context(), a.pool, period, after, pr.Limit+1)
	if err != nil {
		return err
	}
	writeJSON(w, http.StatusOK, NewPage(rows, pr, func(s reconcile.Summary) []string { return []string{s.ID.String()} }))
	return nil
}

func (a *API) getReconciliation(w http.ResponseWriter, r *http.Request) error {
	id, err := pathUUID(r, "id")
	if err != nil {
		return err
	}
	if _, err := queryParams(r); err != nil {
		return err
	}
	run, err := reconcile.Get(r.Context(), a.pool, id)
	if err != nil {
		return err
	}
	writeJSON(w, http.StatusOK, run)
	return nil
}

// reconcileBody is the POST /v1/reconciliations body.
type reconcileBody struct {
	Period string `json:"period"`
	// Customer left out is every customer; given, it must be a customer
	// id: an empty one ({"customer": "$C"} with C unset) is refused, not
	// read as every customer (with close, every customer's period).
	Customer *string `json:"customer"`
	Close    bool    `json:"close"`
	// Deep is refused: a deep run re-reads Kafka and belongs to the CLI.
	Deep bool `json:"deep"`
}

// runView is a finished run; CloseError says which periods a clean run
// could not close (with close: true).
type runView struct {
	*reconcile.Run
	CloseError string `json:"close_error,omitempty"`
}

// postReconciliation runs a reconciliation synchronously, under
// ReconcileTimeout rather than RequestTimeout (see limits), and answers
// 201 with the stored run. A run that failed is stored too: 201 with
// status failed and its error. Large runs belong to `tally reconcile`.
func (a *API) postReconciliation(w http.ResponseWriter, r *http.Request) error {
	ctx := r.Context()
	if _, err := queryParams(r); err != nil {
		return err
	}
	var body reconcileBody
	if err := decodeJSON(r, &body); err != nil {
		return err
	}
	var errs []FieldError
	if body.Period == "" {
		errs = append(errs, FieldError{Field: "period", Detail: `required: a period start date YYYY-MM-DD, "previous" or "current"`})
	} else if fe := checkPeriodRef("period", body.Period); fe != nil {
		errs = append(errs, *fe)
	}
	customer := ""
	if body.Customer != nil {
		customer = *body.Customer
		if !ids.Valid(customer) {
			errs = append(errs, FieldError{Field: "customer", Detail: quote(customer) + " is not 1-128 characters of A-Z a-z 0-9 . _ : -"})
		}
	}
	if body.Deep {
		errs = append(errs, FieldError{Field: "deep", Detail: "deep runs re-read Kafka and are not offered over REST: use tally reconcile --deep"})
	}
	if len(errs) > 0 {
		sortFieldErrors(errs)
		return invalid(errs...)
	}
	if customer != "" {
		// An unknown customer or a date that starts none of its periods
		// answers 404 here rather than as a stored failed run.
		if _, err := a.resolvePeriod(ctx, customer, body.Period, a.now()); err != nil {
			return err
		}
	}
	// The server's write timeout is shorter than a run may take.
	if err := http.NewResponseController(w).SetWriteDeadline(time.Now().Add(a.recTimeout + 5*time.Second)); err != nil {
		a.log.WarnContext(ctx, "reconciliation: cannot extend the write deadline; a long run may be cut off by the server's WriteTimeout",
			"err", err, "request_id", requestID(r))
	}
	rc, err := reconcile.New(reconcile.Config{Pool: a.pool, Clock: a.now, Grace: a.grace, Logger: a.log})
	if err != nil {
		return err
	}
	run, err := rc.Run(ctx, reconcile.Options{Period: body.Period, Customer: customer, Close: body.Close})
	if run == nil || (err != nil && errors.Is(err, reconcile.ErrBusy)) {
		return err
	}
	v := runView{Run: run}
	if err != nil && run.Status != reconcile.StatusFailed {
		v.CloseError = err.Error()
	}
	if err != nil {
		a.log.WarnContext(ctx, "reconciliation", "run", run.ID, "status", run.Status, "err", err, "request_id", requestID(r))
	}
	w.Header().Set("Location", "/v1/reconciliations/"+run.ID.String())
	writeJSON(w, http.StatusCreated, v)
	return nil
}
