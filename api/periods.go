package api

import (
	"bytes"
	"io"
	"net/http"
	"time"
	"unicode/utf8"

	"github.com/go-chi/chi/v5"
	"github.com/jackc/pgx/v5"

	"github.com/tally-ledger/tally/ledger"
	"github.com/tally-ledger/tally/periods"
	"github.com/tally-ledger/tally/reconcile"
)

// periodStore is the periods store on the API's clock and grace; closes
// need a clean reconciliation run unless forced.
func (a *API) periodStore() periods.Store {
	return periods.Store{Grace: a.grace, Clock: a.now, Gate: reconcile.Gate, Kinds: ledger.StatementKinds}
}

// listPeriods: the customer's periods newest first (every period with usage
// or a close record, and the current one), paged by start.
func (a *API) listPeriods(w http.ResponseWriter, r *http.Request) error {
	ctx := r.Context()
	customer, err := readableCustomer(r)
	if err != nil {
		return err
	}
	q, err := queryParams(r, "limit", "cursor")
	if err != nil {
		return err
	}
	pr, errs := parsePage(r, q)
	var after time.Time
	if len(pr.After) == 1 {
		t, err := time.Parse(time.RFC3339, pr.After[0])
		if err != nil {
			errs = append(errs, FieldError{Field: "cursor", Detail: notACursor})
		}
		after = t
	} else if pr.After != nil {
		errs = append(errs, FieldError{Field: "cursor", Detail: notACursor})
	}
	if len(errs) > 0 {
		return invalid(errs...)
	}
	all, err := a.periodStore().List(ctx, a.pool, customer)
	if err != nil {
		return err
	}
	// A customer has few periods (a year of daily ones is 366): page in
	// memory, keyed by start, newest first.
	rows := all
	if !after.IsZero() {
		rows = rows[:0:0]
		for _, s := range all {
			if s.Start.Before(after) {
				rows = append(rows, s)
			}
		}
	}
	if len(rows) > pr.Limit+1 {
		rows = rows[:pr.Limit+1]
	}
	writeJSON(w, http.StatusOK, NewPage(rows, pr, func(s periods.Summary) []string {
		return []string{s.Start.UTC().Format(time.RFC3339)}
	}))
	return nil
}

func (a *API) getStatement(w http.ResponseWriter, r *http.Request) error {
	ctx := r.Context()
	customer, err := readableCustomer(r)
	if err != nil {
		return err
	}
	if _, err := queryParams(r); err != nil {
		return err
	}
	st, err := a.periodStore().Statement(ctx, a.pool, customer, chi.URLParam(r, "period"))
	if err != nil {
		return err
	}
	if !principalFrom(ctx).admin {
		st = customerStatement(st)
	}
	writeJSON(w, http.StatusOK, st)
	return nil
}

// closeBody is the optional POST .../close body.
type closeBody struct {
	Force  bool   `json:"force"`
	Reason string `json:"reason"`
	Actor  string `json:"actor"`
}

// closePeriod closes a period and freezes its statement. 200 with the
// frozen statement, also when it was closed before (nothing changes then).
func (a *API) closePeriod(w http.ResponseWriter, r *http.Request) error {
	ctx := r.Context()
	customer := chi.URLParam(r, "customer")
	if err := checkID("customer", customer); err != nil {
		return err
	}
	if _, err := queryParams(r); err != nil {
		return err
	}
	var body closeBody
	if err := decodeOptionalJSON(r, &body); err != nil {
		return err
	}
	var errs []FieldError
	if body.Force && body.Reason == "" {
		errs = append(errs, FieldError{Field: "reason", Detail: "required with force: why the period is closed without a clean reconciliation"})
	}
	for _, f := range []struct{ name, v string }{{"reason", body.Reason}, {"actor", body.Actor}} {
		if utf8.RuneCountInString(f.v) > 500 {
			errs = append(errs, FieldError{Field: f.name, Detail: "at most 500 characters"})
		}
	}
	if len(errs) > 0 {
		return invalid(errs...)
	}
	if body.Actor == "" {
		body.Actor = "admin"
	}
	req := periods.CloseRequest{Customer: customer, Period: chi.URLParam(r, "period"),
		Force: body.Force, Reason: body.Reason, Actor: body.Actor}
	var st periods.Statement
	err := pgx.BeginFunc(ctx, a.pool, func(tx pgx.Tx) error {
		var err error
		st, err = a.periodStore().Close(ctx, tx, req)
		return err
	})
	a.forgetUsage(customer)
	if err != nil {
		return err
	}
	writeJSON(w, http.StatusOK, st)
	return nil
}

// decodeOptionalJSON is decodeJSON for a body that may be left out: an
// empty body leaves v as it is.
func decodeOptionalJSON(r *http.Request, v any) error {
	raw, err := io.ReadAll(r.Body)
	if err != nil {
		return err
	}
	if len(bytes.TrimSpace(raw)) == 0 {
		return nil
	}
	r.Body = io.NopCloser(bytes.NewReader(raw))
	return decodeJSON(r, v)
}

// customerStatement is what a customer token sees of a statement: what it
// is billed and whether that is final. How the period was closed (forced,
// the reason, who closed it, the reconciliation run) is the operator's
// audit trail, for the admin token only.
func customerStatement(st periods.Statement) periods.Statement {
	st.Forced, st.Reason, st.Actor, st.ReconciliationID = false, "", "", nil
	return st
}
