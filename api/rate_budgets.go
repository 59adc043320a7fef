package api

import (
	"net/http"

	"github.com/tally-ledger/tally/admission"
)

// listRateBudgets serves GET /v1/customers/{customer}/rate-budgets: the
// rate budgets (docs/design.md §17) the customer draws from — its own, its
// pools' and the global one — with the tokens their buckets hold now.
func (a *API) listRateBudgets(w http.ResponseWriter, r *http.Request) error {
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
	s, err := a.admissionStore()
	if err != nil {
		return err
	}
	bs, err := s.RateBudgetsOf(r.Context(), customer)
	if err != nil {
		return err
	}
	page, err := pageInMemory(r, q, bs, func(b admission.RateBudget) []string { return []string{b.Scope, b.Meter} }, nil)
	if err != nil {
		return err
	}
	writeJSON(w, http.StatusOK, page)
	return nil
}
