package api

import (
	"errors"
	"fmt"
	"net/http"
	"net/http/httptest"
	"testing"

	"github.com/tally-ledger/tally/admission"
)

// A grant request whose budgets kept changing is answered 503 with a
// problem type of its own, which tells a gateway it concerns that
// request's budgets (not Tally's load: nothing else is to pause).
func TestBudgetsChangingHasItsOwnProblemType(t *testing.T) {
	err := admissionProblem(httptest.NewRecorder(), fmt.Errorf("issue: %w (acme/tokens); try again", admission.ErrKeptChanging))
	var p *Problem
	if !errors.As(err, &p) || p.Type != TypeBudgetsChanging || p.Status != http.StatusServiceUnavailable {
		t.Fatalf("got %#v, want a 503 %s problem", err, TypeBudgetsChanging)
	}
}
