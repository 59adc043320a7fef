package api

import (
	"errors"
	"net/http"
	"time"

	"github.com/go-chi/chi/v5"
	"github.com/google/uuid"

	"github.com/tally-ledger/tally/tokens"
)

// Customer and gateway tokens, managed by the admin (package tokens does
// the work; `tally tokens` does the same with direct database access).

type tokenBody struct {
	Customer    *string `json:"customer"`
	Gateway     *string `json:"gateway"`
	Description string  `json:"description"`
}

// createdToken is a new token with its secret, shown this once.
type createdToken struct {
	tokens.Token
	Secret string `json:"secret"`
}

// createToken creates a customer token ({"customer": C}) or a gateway
// token ({"gateway": H}).
func (a *API) createToken(w http.ResponseWriter, r *http.Request) error {
	if _, err := queryParams(r); err != nil {
		return err
	}
	var b tokenBody
	if err := decodeJSON(r, &b); err != nil {
		return err
	}
	var (
		t      tokens.Token
		secret string
		err    error
	)
	switch {
	case (b.Customer == nil) == (b.Gateway == nil):
		return invalid(FieldError{Field: "customer", Detail: "give either customer (a customer token) or gateway (a gateway token)"},
			FieldError{Field: "gateway", Detail: "give either customer (a customer token) or gateway (a gateway token)"})
	case b.Customer != nil:
		t, secret, err = tokens.Create(r.Context(), a.pool, *b.Customer, b.Description, a.now())
	default:
		t, secret, err = tokens.CreateGateway(r.Context(), a.pool, *b.Gateway, b.Description, a.now())
	}
	if err != nil {
		return err
	}
	w.Header().Set("Location", "/v1/tokens")
	writeJSON(w, http.StatusCreated, createdToken{Token: t, Secret: secret})
	return nil
}

func (a *API) listTokens(w http.ResponseWriter, r *http.Request) error {
	q, err := queryParams(r, "customer", "limit", "cursor")
	if err != nil {
		return err
	}
	customer, ok := q["customer"]
	if ok {
		if err := checkID("customer", customer); err != nil {
			return err
		}
	}
	pr, err := ParsePageRequest(r, q)
	if err != nil {
		return err
	}
	req := tokens.PageRequest{Customer: customer, Limit: pr.Limit + 1}
	if pr.After != nil {
		// The key of the last token of the page before: created_at, id.
		err1, err2 := errors.New("not two keys"), error(nil)
		if len(pr.After) == 2 {
			req.AfterCreated, err1 = time.Parse(time.RFC3339Nano, pr.After[0])
			req.AfterID, err2 = uuid.Parse(pr.After[1])
		}
		if err1 != nil || err2 != nil {
			return invalidField("cursor", notACursor)
		}
	}
	ts, err := tokens.Page(r.Context(), a.pool, req)
	if err != nil {
		return err
	}
	// Oldest first, as tokens.Page reads them.
	writeJSON(w, http.StatusOK, NewPage(ts, pr, func(t tokens.Token) []string {
		return []string{t.CreatedAt.UTC().Format("2006-01-02T15:04:05.000000Z"), t.ID.String()}
	}))
	return nil
}

func (a *API) revokeToken(w http.ResponseWriter, r *http.Request) error {
	if _, err := queryParams(r); err != nil {
		return err
	}
	id, err := uuid.Parse(chi.URLParam(r, "id"))
	if err != nil {
		return invalidField("id", "%s is not a token id (see GET /v1/tokens)", quote(chi.URLParam(r, "id")))
	}
	t, err := tokens.Revoke(r.Context(), a.pool, id, a.now())
	if errors.Is(err, tokens.ErrNotFound) {
		return notFound("no token " + id.String() + " (see GET /v1/tokens)")
	}
	if err != nil {
		return err
	}
	writeJSON(w, http.StatusOK, t)
	return nil
}
