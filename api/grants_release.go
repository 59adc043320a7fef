package api

import (
	"fmt"
	"net/http"

	"github.com/google/uuid"

	"github.com/tally-ledger/tally/admission"
)

// maxReleases bounds the releases of one POST /v1/grants/release: one
// shared transaction's worth (admission.DefaultMaxBatch).
const maxReleases = admission.DefaultMaxBatch

type releaseItem struct {
	Grant      string        `json:"grant"` // a grant id, checked by releaseGrants (the field at fault named)
	Generation int64         `json:"generation"`
	Spent      *decimalInput `json:"spent"` // required: nil when left out
}

type releasesBody struct {
	Holder   string        `json:"holder"`
	Releases []releaseItem `json:"releases"`
}

// releaseAnswer is one release's outcome: the grant, or the problem a
// POST /v1/grants/{id}/release of it alone would have answered.
type releaseAnswer struct {
	Status  int              `json:"status"`
	Grant   *admission.Grant `json:"grant,omitempty"`
	Problem *Problem         `json:"problem,omitempty"`
}

// releaseGrants serves POST /v1/grants/release: a holder gives back
// several grants at once, in one shared transaction (admission.Store
// ReleaseAll). Each release is fenced by the holder and its own generation
// and decided all or nothing on its own, exactly as the single release
// route decides it; the 200 answer lists every outcome in the request's
// order, after the commit.
func (a *API) releaseGrants(w http.ResponseWriter, r *http.Request) error {
	b, s, err := holderRequest[releasesBody](a, r, func(b *releasesBody) string { return b.Holder })
	if err != nil {
		return err
	}
	if len(b.Releases) == 0 || len(b.Releases) > maxReleases {
		return invalidField("releases", "%d releases: send 1 to %d", len(b.Releases), maxReleases)
	}
	reps := make([]admission.Report, len(b.Releases))
	var bad []FieldError
	for i, it := range b.Releases {
		id, err := uuid.Parse(it.Grant)
		if err != nil {
			bad = append(bad, FieldError{Field: fmt.Sprintf("releases[%d].grant", i), Detail: quote(it.Grant) + " is not a grant id"})
			continue
		}
		if it.Spent == nil {
			bad = append(bad, errSpentRequired(fmt.Sprintf("releases[%d].spent", i)).Errors...)
			continue
		}
		reps[i] = admission.Report{Grant: id, Holder: b.Holder, Generation: it.Generation, Spent: it.Spent.Decimal}
	}
	if len(bad) > 0 {
		return invalid(bad...)
	}
	gs, errs := s.ReleaseAll(r.Context(), reps)
	out := make([]releaseAnswer, len(reps))
	for i, err := range errs {
		a.grantMetrics.Released(err)
		if err == nil {
			out[i] = releaseAnswer{Status: http.StatusOK, Grant: &gs[i]}
			continue
		}
		if ctxErr := r.Context().Err(); ctxErr != nil {
			return ctxErr // the request's bound passed: nothing to answer
		}
		p := a.problemFor(r, admissionProblem(w, err))
		if p.Status >= 500 {
			return fmt.Errorf("release %d of %d: %w", i+1, len(reps), err)
		}
		out[i] = releaseAnswer{Status: p.Status, Problem: p}
	}
	writeJSON(w, http.StatusOK, map[string]any{"items": out})
	return nil
}
