package api

import (
	"errors"
	"fmt"
	"math"
	"net/http"
	"strconv"
	"strings"
	"time"

	"github.com/go-chi/chi/v5"
	"github.com/google/uuid"

	"github.com/tally-ledger/tally/admission"
)

// Problem types of exact admission.
const (
	TypeBudgetExhausted = typePrefix + "budget-exhausted"
	TypeStaleGeneration = typePrefix + "stale-generation"
	TypeNotHolder       = typePrefix + "not-holder"
	TypeGrantEnded      = typePrefix + "grant-ended"
	TypeNotExact        = typePrefix + "not-exact"
	TypeBypassConflict  = typePrefix + "bypass-conflict"
	// TypeBudgetsChanging: a grant request whose budgets changed under
	// each attempt (503, Retry-After): about that request's budgets, not
	// Tally's load, so a gateway pauses nothing else for it.
	TypeBudgetsChanging = typePrefix + "budgets-changing"
)

// admissionStore is the API's one grant store, on its pool and clock.
func (a *API) admissionStore() (*admission.Store, error) {
	return a.admission, nil
}

// requireGrantManager lets through the admin token and gateway tokens;
// handlers check that a gateway token names its own holder.
func requireGrantManager(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if p := principalFrom(r.Context()); !p.admin && p.gateway == "" {
			writeProblemRequest(w, r, &Problem{Type: TypeForbidden, Title: "Forbidden", Status: http.StatusForbidden,
				Detail: "grants are managed by the admin token or a gateway token (tally tokens create --gateway H)"})
			return
		}
		next.ServeHTTP(w, r)
	})
}

// checkHolder refuses a gateway token acting for another holder.
func checkHolder(r *http.Request, holder string) error {
	p := principalFrom(r.Context())
	if p.admin || p.gateway == holder {
		return nil
	}
	return &Problem{Type: TypeForbidden, Title: "Forbidden", Status: http.StatusForbidden,
		Detail: fmt.Sprintf("this gateway token manages only holder %q, not %q", p.gateway, holder),
		Errors: []FieldError{{Field: "holder", Detail: "not this token's gateway"}}}
}

type grantBody struct {
	Holder     string           `json:"holder"`
	Generation int64            `json:"generation"`
	Customer   string           `json:"customer"`
	Meter      string           `json:"meter"`
	Amount     decimalInput     `json:"amount"`
	MinAmount  nullDecimalInput `json:"min_amount"`
	TTL        *durationInput   `json:"ttl"` // nil: absent or null
	Budgets    []string         `json:"budgets"`
}

type debitBody struct {
	ID         string       `json:"id"`
	Holder     string       `json:"holder"`
	Generation int64        `json:"generation"`
	Customer   string       `json:"customer"`
	Meter      string       `json:"meter"`
	Amount     decimalInput `json:"amount"`
}

type reportBody struct {
	Holder     string         `json:"holder"`
	Generation int64          `json:"generation"`
	Spent      *decimalInput  `json:"spent"` // required: nil when left out
	TTL        *durationInput `json:"ttl"`   // nil: absent or null
}

// ttlRule is the range of a grant's ttl (admission's checkTTL).
var ttlRule = admission.TTLRange

// besides is p, a problem of one field the handler checks itself, with
// the fields at fault in err, the request's own validation, after it: a
// problem names every field at fault at once.
func besides(p *Problem, err error) *Problem {
	p.Errors = append(p.Errors, fieldsOf(err)...)
	return p
}

// errSpentRequired refuses a report without spent: recording 0 would give
// every unit of the grant back, unbilled.
func errSpentRequired(field string) *Problem {
	return invalidField(field, `required: the units spent from the grant so far, a decimal string ("0" when none)`)
}

type bypassBody struct {
	Holder     string       `json:"holder"`
	Generation int64        `json:"generation"`
	ReportID   string       `json:"report_id"`
	Items      []bypassItem `json:"items"`
}

// bypassItem is admission.BypassItem as a request body gives it.
type bypassItem struct {
	Customer   string       `json:"customer"`
	Meter      string       `json:"meter"`
	Amount     decimalInput `json:"amount"`
	Admissions int64        `json:"admissions"`
	FirstAt    timeInput    `json:"first_at"`
	LastAt     timeInput    `json:"last_at"`
}

// holderRequest decodes a grant-protocol body (no query parameters),
// checks that the token may act for the body's holder, and opens the
// admission store: what every grant, report and bypass handler does first.
func holderRequest[T any](a *API, r *http.Request, holder func(*T) string) (*T, *admission.Store, error) {
	if _, err := queryParams(r); err != nil {
		return nil, nil, err
	}
	b := new(T)
	if err := decodeJSON(r, b); err != nil {
		return nil, nil, err
	}
	if err := checkHolder(r, holder(b)); err != nil {
		return nil, nil, err
	}
	s, err := a.admissionStore()
	if err != nil {
		return nil, nil, err
	}
	return b, s, nil
}

// postGrant issues a grant: 201 with the grant, or 409 budget-exhausted.
func (a *API) postGrant(w http.ResponseWriter, r *http.Request) error {
	b, s, err := holderRequest[grantBody](a, r, func(b *grantBody) string { return b.Holder })
	if err != nil {
		return err
	}
	ttl, bad := b.TTL.given("ttl", ttlRule)
	req := admission.IssueRequest{Holder: b.Holder, Generation: b.Generation,
		Customer: b.Customer, Meter: b.Meter, Amount: b.Amount.Decimal, MinAmount: b.MinAmount.NullDecimal, TTL: ttl, Budgets: b.Budgets,
		EveryBudget: !principalFrom(r.Context()).admin}
	if bad != nil {
		return besides(bad, req.Validate())
	}
	start := time.Now()
	g, err := s.Issue(r.Context(), req)
	a.grantMetrics.Issued(g, err, time.Since(start))
	if err != nil {
		return admissionProblem(w, err)
	}
	w.Header().Set("Location", "/v1/customers/"+g.Customer+"/grants?state=live")
	writeJSON(w, http.StatusCreated, g)
	return nil
}

// postDebit takes one request's cost from every exact budget that applies
// (admission.Store.Debit): 201 with the debit's record (a grant spent and
// released at once), or 409 budget-exhausted. The same id is taken once:
// sent again, it answers with the debit stored.
func (a *API) postDebit(w http.ResponseWriter, r *http.Request) error {
	b, s, err := holderRequest[debitBody](a, r, func(b *debitBody) string { return b.Holder })
	if err != nil {
		return err
	}
	if b.ID == "" {
		return invalidField("id", "required: a UUID the gateway picks, the same when the debit is sent again")
	}
	id, err := parseUUID("id", b.ID)
	if err != nil {
		return err
	}
	start := time.Now()
	g, err := s.Debit(r.Context(), admission.DebitRequest{ID: id, Holder: b.Holder, Generation: b.Generation,
		Customer: b.Customer, Meter: b.Meter, Amount: b.Amount.Decimal})
	a.grantMetrics.Debited(err, time.Since(start))
	if err != nil {
		return admissionProblem(w, err)
	}
	w.Header().Set("Location", "/v1/customers/"+g.Customer+"/grants?state=ended")
	writeJSON(w, http.StatusCreated, g)
	return nil
}

func (a *API) renewGrant(w http.ResponseWriter, r *http.Request) error   { return a.report(w, r, false) }
func (a *API) releaseGrant(w http.ResponseWriter, r *http.Request) error { return a.report(w, r, true) }

func (a *API) report(w http.ResponseWriter, r *http.Request, release bool) error {
	id, err := uuid.Parse(chi.URLParam(r, "id"))
	if err != nil {
		return invalidField("id", "%s is not a grant id", quote(chi.URLParam(r, "id")))
	}
	b, s, err := holderRequest[reportBody](a, r, func(b *reportBody) string { return b.Holder })
	if err != nil {
		return err
	}
	if b.Spent == nil {
		return errSpentRequired("spent")
	}
	ttl, bad := b.TTL.given("ttl", ttlRule)
	if release && b.TTL != nil {
		ttl, bad = 0, invalidField("ttl", "a release takes no ttl")
	}
	rep := admission.Report{Grant: id, Holder: b.Holder, Generation: b.Generation, Spent: b.Spent.Decimal, TTL: ttl}
	if bad != nil {
		return besides(bad, rep.Validate())
	}
	var g admission.Grant
	if release {
		g, err = s.Release(r.Context(), rep)
		a.grantMetrics.Released(err)
	} else {
		g, err = s.Renew(r.Context(), rep)
		a.grantMetrics.Renewed(err)
	}
	if err != nil {
		return admissionProblem(w, err)
	}
	writeJSON(w, http.StatusOK, g)
	return nil
}

// postBypasses stores a holder's report of admissions made without a grant.
func (a *API) postBypasses(w http.ResponseWriter, r *http.Request) error {
	b, s, err := holderRequest[bypassBody](a, r, func(b *bypassBody) string { return b.Holder })
	if err != nil {
		return err
	}
	items := make([]admission.BypassItem, len(b.Items))
	for i, it := range b.Items {
		items[i] = admission.BypassItem{Customer: it.Customer, Meter: it.Meter, Amount: it.Amount.Decimal,
			Admissions: it.Admissions, FirstAt: it.FirstAt.Time, LastAt: it.LastAt.Time}
	}
	rep := admission.BypassReport{Holder: b.Holder, Generation: b.Generation, ReportID: b.ReportID, Items: items}
	err = s.RecordBypasses(r.Context(), rep)
	a.grantMetrics.Bypassed(rep, err)
	if err != nil {
		return admissionProblem(w, err)
	}
	writeJSON(w, http.StatusOK, map[string]any{"report_id": b.ReportID, "items": len(b.Items)})
	return nil
}

// retireHolder serves POST /v1/holders/{holder}/retire (admin): the
// holder's live grants end, counted as fully spent, and its generation is
// forgotten (admission.Store.RetireHolder).
func (a *API) retireHolder(w http.ResponseWriter, r *http.Request) error {
	holder := chi.URLParam(r, "holder")
	if err := checkID("holder", holder); err != nil {
		return err
	}
	if _, err := queryParams(r); err != nil {
		return err
	}
	s, err := a.admissionStore()
	if err != nil {
		return err
	}
	out, err := s.RetireHolder(r.Context(), holder)
	if err != nil {
		return admissionProblem(w, err)
	}
	a.log.InfoContext(r.Context(), "holder retired", "holder", out.Holder, "previous_generation", out.PreviousGeneration,
		"grants_ended", out.GrantsEnded)
	writeJSON(w, http.StatusOK, out)
	return nil
}

// listGrants serves GET /v1/customers/{customer}/grants?state=live|ended.
func (a *API) listGrants(w http.ResponseWriter, r *http.Request) error {
	customer, err := readableCustomer(r)
	if err != nil {
		return err
	}
	q, err := queryParams(r, "state", "limit", "cursor")
	if err != nil {
		return err
	}
	if err := a.requireCustomer(r.Context(), customer); err != nil {
		return err
	}
	pr, err := ParsePageRequest(r, q)
	if err != nil {
		return err
	}
	req := admission.ListRequest{Customer: customer, State: q["state"], Limit: pr.Limit + 1}
	if len(pr.After) == 2 {
		at, err1 := time.Parse(time.RFC3339Nano, pr.After[0])
		id, err2 := uuid.Parse(pr.After[1])
		if err1 != nil || err2 != nil {
			return invalidField("cursor", notACursor)
		}
		req.AfterIssued, req.AfterID = &at, id
	} else if pr.After != nil {
		return invalidField("cursor", notACursor)
	}
	s, err := a.admissionStore()
	if err != nil {
		return err
	}
	gs, err := s.Grants(r.Context(), req)
	if err != nil {
		return admissionProblem(w, err)
	}
	page := Page[admission.Grant]{Items: gs}
	if len(gs) > pr.Limit {
		page.Items = gs[:pr.Limit]
		last := page.Items[len(page.Items)-1]
		page.NextCursor = pr.Cursor(last.IssuedAt.Format(time.RFC3339Nano), last.ID.String())
	}
	if page.Items == nil {
		page.Items = []admission.Grant{}
	}
	writeJSON(w, http.StatusOK, page)
	return nil
}

// listBudgets serves GET /v1/customers/{customer}/budgets.
func (a *API) listBudgets(w http.ResponseWriter, r *http.Request) error {
	customer, err := readableCustomer(r)
	if err != nil {
		return err
	}
	q, err := queryParams(r, "limit", "cursor")
	if err != nil {
		return err
	}
	if err := a.requireCustomer(r.Context(), customer); err != nil {
		return err
	}
	pr, err := ParsePageRequest(r, q)
	if err != nil {
		return err
	}
	// Newest period first, by meter within a period, as BudgetsPage reads
	// them; a page reads its own (a budget is kept for every period).
	req := admission.BudgetsRequest{Customer: customer, Limit: pr.Limit + 1}
	if len(pr.After) == 2 {
		at, err := time.Parse(time.RFC3339, pr.After[0])
		if err != nil {
			return invalidField("cursor", notACursor)
		}
		req.AfterStart, req.AfterMeter = &at, pr.After[1]
	} else if pr.After != nil {
		return invalidField("cursor", notACursor)
	}
	s, err := a.admissionStore()
	if err != nil {
		return err
	}
	bs, err := s.BudgetsPage(r.Context(), req)
	if err != nil {
		return err
	}
	writeJSON(w, http.StatusOK, NewPage(bs, pr, func(b admission.Budget) []string {
		return []string{b.PeriodStart.UTC().Format(time.RFC3339), b.Meter}
	}))
	return nil
}

// admissionProblem maps admission's typed errors to problems, copying
// their data; anything else goes on to writeError's mapping.
func admissionProblem(w http.ResponseWriter, err error) error {
	if ex, ok := errors.AsType[*admission.BudgetExhaustedError](err); ok {
		p := &Problem{Type: TypeBudgetExhausted, Title: "Budget exhausted", Status: http.StatusConflict,
			Detail: ex.Error(), Binding: ex.Binding, Available: ex.Available.String(), Held: ex.Held.String()}
		if ex.Burst.Valid {
			// More than a rate bucket's burst: no time to come back after.
			p.Burst = ex.Burst.Decimal.String()
			return p
		}
		secs := int64(math.Ceil(ex.RetryAfter.Seconds()))
		ms := (ex.RetryAfter + time.Millisecond - 1).Milliseconds()
		w.Header().Set("Retry-After", strconv.FormatInt(secs, 10))
		p.RetryAfter, p.RetryAfterMS = &secs, &ms
		return p
	}
	if se, ok := errors.AsType[*admission.StaleGenerationError](err); ok {
		return &Problem{Type: TypeStaleGeneration, Title: "Older generation", Status: http.StatusConflict, Detail: se.Error(),
			CurrentGeneration: &se.Current, NextGeneration: &se.Next}
	}
	if be, ok := errors.AsType[*admission.BypassConflictError](err); ok {
		return &Problem{Type: TypeBypassConflict, Title: "Report id used for other bypasses", Status: http.StatusConflict, Detail: be.Error()}
	}
	if fe, ok := errors.AsType[*admission.FencedError](err); ok {
		return &Problem{Type: TypeNotHolder, Title: "Not the grant's holder", Status: http.StatusConflict, Detail: fe.Error()}
	}
	if ge, ok := errors.AsType[*admission.GrantEndedError](err); ok {
		return &Problem{Type: TypeGrantEnded, Title: "Grant ended", Status: http.StatusConflict, Detail: ge.Error()}
	}
	if oe, ok := errors.AsType[*admission.OmittedBudgetError](err); ok {
		return &Problem{Type: TypeForbidden, Title: "Forbidden", Status: http.StatusForbidden, Detail: oe.Error(),
			Errors: []FieldError{{Field: "budgets", Detail: "leaves out " + strings.Join(oe.Omitted, ", ") +
				": only the admin token may name a subset of the budgets that apply"}}}
	}
	if ne, ok := errors.AsType[*admission.NotExactError](err); ok {
		adm := ne.Admission
		if adm == "" {
			adm = "none"
		}
		return &Problem{Type: TypeNotExact, Title: "No exact rule", Status: http.StatusConflict, Detail: ne.Error(), Admission: adm}
	}
	if sp, ok := errors.AsType[*admission.SpentError](err); ok {
		return invalidField("spent", "%s must be between the last reported %s and the amount %s", sp.Spent, sp.Previous, sp.Amount)
	}
	if ge, ok := errors.AsType[*admission.GenerationJumpError](err); ok {
		return invalidField("generation", "%d is more than %d above the holder's generation %d: move forward from it",
			ge.Generation, admission.MaxGenerationStep, ge.Current)
	}
	if errors.Is(err, admission.ErrKeptChanging) {
		// Contention on this request's budgets, not a fault nor load: the
		// request may be sent again after Retry-After; other requests are
		// unaffected.
		return &Problem{Type: TypeBudgetsChanging, Title: "Budgets changing", Status: http.StatusServiceUnavailable,
			Detail: err.Error()}
	}
	return err
}
