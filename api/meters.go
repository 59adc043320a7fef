package api

import (
	"errors"
	"net/http"

	"github.com/go-chi/chi/v5"
	"github.com/jackc/pgx/v5"

	"github.com/tally-ledger/tally/ledger"
)

// TypeMeterKindInUse: a meter's kind cannot change once it has usage.
const TypeMeterKindInUse = typePrefix + "meter-kind-in-use"

// meterBody is PUT /v1/meters/{meter}'s body (docs/design.md §16).
type meterBody struct {
	Kind        ledger.MeterKind `json:"kind"`
	Unit        string           `json:"unit"`
	Description string           `json:"description"`
}

type meterList struct {
	Items []ledger.Meter `json:"items"`
}

func (a *API) listMeters(w http.ResponseWriter, r *http.Request) error {
	if _, err := queryParams(r); err != nil {
		return err
	}
	ms, err := ledger.Meters(r.Context(), a.pool)
	if err != nil {
		return err
	}
	if ms == nil {
		ms = []ledger.Meter{}
	}
	writeJSON(w, http.StatusOK, meterList{Items: ms})
	return nil
}

// getMeter answers any valid meter id: an undeclared meter is a counter.
func (a *API) getMeter(w http.ResponseWriter, r *http.Request) error {
	if _, err := queryParams(r); err != nil {
		return err
	}
	meter := chi.URLParam(r, "meter")
	if !validID(meter) {
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
		var err error
		m, err = ledger.DeclareMeter(r.Context(), tx, ledger.Meter{Meter: chi.URLParam(r, "meter"), Kind: b.Kind,
			Unit: b.Unit, Description: b.Description}, a.now())
		return err
	})
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
