package api

import (
	"context"
	"errors"
	"fmt"
	"net/http"

	"github.com/go-chi/chi/v5"
	"github.com/jackc/pgx/v5"

	"github.com/tally-ledger/tally/internal/ids"
	"github.com/tally-ledger/tally/ledger"
	"github.com/tally-ledger/tally/quota"
)

// TypeMeterKindInUse: a meter's kind cannot change once it has usage.
const TypeMeterKindInUse = typePrefix + "meter-kind-in-use"

// TypeMeterHasQuotaRules: a meter named by quota rules stays a counter.
const TypeMeterHasQuotaRules = typePrefix + "meter-has-quota-rules"

var errMeterHasRules = errors.New("api: meter has quota rules")

// refuseIfRuled fails a declaration of a gauge or unique meter that quota
// rules name. A declaration that changes the kind holds locks.MeterKinds
// exclusively from DeclareMeter on, and rules are written under it shared,
// so no rule slips in between this read and the commit.
func refuseIfRuled(ctx context.Context, tx pgx.Tx, meter string) error {
	ruled, err := quota.MeterHasRules(ctx, tx, meter)
	if err != nil {
		return err
	}
	if ruled {
		return errMeterHasRules
	}
	return nil
}

// meterBody is PUT /v1/meters/{meter}'s body (docs/design.md §16).
type meterBody struct {
	Kind        ledger.MeterKind `json:"kind"`
	Unit        string           `json:"unit"`
	Description string           `json:"description"`
}

func (a *API) listMeters(w http.ResponseWriter, r *http.Request) error {
	q, err := queryParams(r, "limit", "cursor")
	if err != nil {
		return err
	}
	ms, err := ledger.Meters(r.Context(), a.pool)
	if err != nil {
		return err
	}
	page, err := pageInMemory(r, q, ms, func(m ledger.Meter) []string { return []string{m.Meter} }, nil)
	if err != nil {
		return err
	}
	writeJSON(w, http.StatusOK, page)
	return nil
}

// getMeter answers any valid meter id: an undeclared meter is a counter.
func (a *API) getMeter(w http.ResponseWriter, r *http.Request) error {
	if _, err := queryParams(r); err != nil {
		return err
	}
	meter := chi.URLParam(r, "meter")
	if !ids.Valid(meter) {
		return invalidField("meter", "%s is not 1-128 characters of A-Z a-z 0-9 . _ : -", quote(meter))
	}
	m, err := ledger.MeterByName(r.Context(), a.pool, meter)
	if err != nil {
		return err
	}
	writeJSON(w, http.StatusOK, m)
	return nil
}

func (a *API) putMeter(w http.ResponseWriter, r *http.Request) error {
	if _, err := queryParams(r); err != nil {
		return err
	}
	var b meterBody
	if err := decodeJSON(r, &b); err != nil {
		return err
	}
	var m ledger.Meter
	err := pgx.BeginFunc(r.Context(), a.pool, func(tx pgx.Tx) error {
		prev, err := ledger.MeterByName(r.Context(), tx, chi.URLParam(r, "meter"))
		if err != nil {
			return err
		}
		m, err = ledger.DeclareMeter(r.Context(), tx, ledger.Meter{Meter: chi.URLParam(r, "meter"), Kind: b.Kind,
			Unit: b.Unit, Description: b.Description}, a.now())
		if err != nil || m.Kind == prev.Kind || m.Kind == ledger.Counter {
			return err
		}
		return refuseIfRuled(r.Context(), tx, m.Meter)
	})
	if errors.Is(err, errMeterHasRules) {
		return &Problem{Type: TypeMeterHasQuotaRules, Title: "Meter has quota rules", Status: http.StatusConflict,
			Detail: fmt.Sprintf("meter %q has quota rules, written against its running total (docs/design.md §16); it stays a counter", m.Meter),
			Errors: []FieldError{{Field: "kind", Detail: "a meter with quota rules cannot become a " + string(b.Kind)}}}
	}
	var inUse ledger.KindInUseError
	if errors.As(err, &inUse) {
		return &Problem{Type: TypeMeterKindInUse, Title: "Meter kind in use", Status: http.StatusConflict,
			Detail: inUse.Error(), Errors: []FieldError{{Field: "kind", Detail: "the meter is a " + string(inUse.Kind) + " with usage; its kind cannot change"}}}
	}
	if err != nil {
		return err
	}
	a.forgetUsage("")
	writeJSON(w, http.StatusOK, m)
	return nil
}
