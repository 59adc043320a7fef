package api

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"strings"
	"syscall"

	"github.com/go-chi/chi/v5/middleware"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/tally-ledger/tally/ingest"
	"github.com/tally-ledger/tally/ledger"
	"github.com/tally-ledger/tally/periods"
	"github.com/tally-ledger/tally/reconcile"
	"github.com/tally-ledger/tally/validation"
)

// Problem is an RFC 9457 problem detail. Handlers return it (or a typed
// error of another package) and writeError turns it into the response.
type Problem struct {
	Type   string       `json:"type"`
	Title  string       `json:"title"`
	Status int          `json:"status"`
	Detail string       `json:"detail,omitempty"`
	Errors []FieldError `json:"errors,omitempty"`
	// ContainingPeriod names the period that contains a date that is not a
	// period start (period-not-found only).
	ContainingPeriod string `json:"containing_period,omitempty"`
	// Binding, Available, Held and RetryAfter (whole seconds) explain a
	// budget-exhausted refusal.
	Binding    string `json:"binding,omitempty"`
	Available  string `json:"available,omitempty"`
	Held       string `json:"held,omitempty"`
	RetryAfter *int64 `json:"retry_after,omitempty"`
	// RetryAfterMS is RetryAfter in milliseconds (budget-exhausted): a
	// rate budget refills in milliseconds, which whole seconds round up
	// to a second of refusals.
	RetryAfterMS *int64 `json:"retry_after_ms,omitempty"`
	// Burst is a rate bucket's burst when the request asked for more than
	// it (budget-exhausted without retry_after: no refill holds that).
	Burst string `json:"burst,omitempty"`
	// Admission says why a grant was refused as not-exact: the rule in
	// force is "lagged", or there is "none".
	Admission string `json:"admission,omitempty"`
	// CurrentGeneration and NextGeneration explain a stale-generation
	// refusal: the holder's newest generation, and the one a holder that
	// lost its state recovers with (docs/gateways-exact.md).
	CurrentGeneration *int64 `json:"current_generation,omitempty"`
	NextGeneration    *int64 `json:"next_generation,omitempty"`
	// RequestID lets a caller quote the request to an operator.
	RequestID string `json:"request_id,omitempty"`
}

// FieldError is one problem with one input field. Field is a JSON field of
// the body, a query parameter or a path parameter, as documented.
type FieldError struct {
	Field  string `json:"field"`
	Detail string `json:"detail"`
}

func (p *Problem) Error() string {
	s := p.Title
	if p.Detail != "" {
		s += ": " + p.Detail
	}
	for _, e := range p.Errors {
		s += "; " + e.Field + ": " + e.Detail
	}
	return s
}

// The problem types. They are URNs: stable identifiers to switch on, not
// links. openapi.json lists them.
const (
	typePrefix          = "urn:tally:problem:"
	TypeUnauthorized    = typePrefix + "unauthorized"
	TypeForbidden       = typePrefix + "forbidden"
	TypeNotFound        = typePrefix + "not-found"
	TypePeriodNotFound  = typePrefix + "period-not-found"
	TypeInvalidRequest  = typePrefix + "invalid-request"
	TypeMalformedJSON   = typePrefix + "malformed-json"
	TypeBodyTooLarge    = typePrefix + "body-too-large"
	TypeURITooLong      = typePrefix + "uri-too-long"
	TypeHeadersTooLarge = typePrefix + "headers-too-large"
	TypeUnsupportedType = typePrefix + "unsupported-media-type"
	TypeMethod          = typePrefix + "method-not-allowed"
	TypeConflict        = typePrefix + "idempotency-conflict"
	TypeAlreadyReplayed = typePrefix + "already-replayed"
	TypePeriodOpen      = typePrefix + "period-open"
	TypeNotReconciled   = typePrefix + "not-reconciled"
	TypeInconsistent    = typePrefix + "inconsistent"
	TypeBusy            = typePrefix + "busy"
	TypeNotReady        = typePrefix + "not-ready"
	TypeUnavailable     = typePrefix + "unavailable"
	TypeRateLimited     = typePrefix + "rate-limited"
	TypeBodyTimeout     = typePrefix + "body-timeout"
	TypeOverloaded      = typePrefix + "overloaded"
	TypeInternal        = typePrefix + "internal"
)

func invalid(errs ...FieldError) *Problem {
	return &Problem{Type: TypeInvalidRequest, Title: "Invalid request", Status: http.StatusBadRequest,
		Detail: "the request has invalid fields; see errors", Errors: errs}
}

func invalidField(field, format string, args ...any) *Problem {
	return invalid(FieldError{Field: field, Detail: fmt.Sprintf(format, args...)})
}

func notFound(detail string) *Problem {
	return &Problem{Type: TypeNotFound, Title: "Not found", Status: http.StatusNotFound, Detail: detail}
}

func customerNotFound(customer string) *Problem {
	return notFound(fmt.Sprintf("customer %q not found", customer))
}

func malformed(detail string) *Problem {
	return &Problem{Type: TypeMalformedJSON, Title: "Malformed JSON body", Status: http.StatusBadRequest, Detail: detail}
}

// fieldsOf is every validation.FieldError in err, as the problem's field
// errors.
func fieldsOf(err error) []FieldError {
	fes := validation.Fields(err)
	out := make([]FieldError, len(fes))
	for i, fe := range fes {
		out[i] = FieldError{Field: fe.Field, Detail: fe.Detail}
	}
	return out
}

// writeError is the one place that maps errors to problem+json.
func (a *API) writeError(w http.ResponseWriter, r *http.Request, err error) {
	p := a.problemFor(r, err)
	p.RequestID = middleware.GetReqID(r.Context())
	if p.Status == http.StatusUnauthorized {
		challenge := `Bearer realm="tally"`
		if r.Header.Get("Authorization") != "" {
			challenge += `, error="invalid_token"` // RFC 6750: a token was sent and refused
		}
		w.Header().Set("WWW-Authenticate", challenge)
	}
	if p.Status == http.StatusServiceUnavailable && w.Header().Get("Retry-After") == "" {
		// Something this process depends on is gone for now: clients and
		// load balancers back off instead of treating it as a bug.
		w.Header().Set("Retry-After", "1")
	}
	writeProblem(w, p)
}

// databaseUnavailable reports whether err says Postgres could not be
// reached or is going away (connection refused, reset or lost, a connect
// timeout, a server shutting down or refusing connections), not that it
// refused the request.
func databaseUnavailable(err error) bool {
	var pe *pgconn.PgError
	if errors.As(err, &pe) {
		switch pe.Code {
		case "57P01", "57P02", "57P03", // admin shutdown, crash shutdown, cannot connect now
			"53300": // too many connections
			return true
		}
		return strings.HasPrefix(pe.Code, "08") // connection exception
	}
	var ce *pgconn.ConnectError
	var ne net.Error
	return errors.As(err, &ce) || errors.As(err, &ne) || pgconn.Timeout(err) ||
		errors.Is(err, io.EOF) || errors.Is(err, io.ErrUnexpectedEOF) || errors.Is(err, net.ErrClosed) ||
		errors.Is(err, syscall.ECONNRESET) || errors.Is(err, syscall.ECONNREFUSED) || errors.Is(err, syscall.EPIPE)
}

func (a *API) problemFor(r *http.Request, err error) *Problem {
	var p *Problem
	var maxBytes *http.MaxBytesError
	var badRef *periods.InvalidPeriodRefError
	var noSuchPeriod *periods.NoSuchPeriodError
	var field *validation.FieldError
	var unknown *periods.UnknownCustomerError
	var missing *validation.NotFoundError
	switch {
	case errors.As(err, &p):
		cp := *p
		return &cp
	case errors.As(err, &maxBytes):
		return &Problem{Type: TypeBodyTooLarge, Title: "Request body too large", Status: http.StatusRequestEntityTooLarge,
			Detail: fmt.Sprintf("the body must be at most %d bytes", maxBytes.Limit)}
	case errors.Is(err, ledger.ErrAdjustmentConflict):
		return &Problem{Type: TypeConflict, Title: "Idempotency conflict", Status: http.StatusConflict,
			Detail: "operation_id was already used for an adjustment with a different body; use a new operation_id",
			Errors: []FieldError{{Field: "operation_id", Detail: "already used with a different body"}}}
	case errors.As(err, &badRef):
		return invalidField("period", "%s: %v: %s", quote(badRef.Ref), periods.ErrInvalidPeriodRef, badRef.Detail)
	case errors.As(err, &noSuchPeriod):
		return &Problem{Type: TypePeriodNotFound, Title: "Period not found", Status: http.StatusNotFound,
			Detail: err.Error(), Errors: []FieldError{{Field: "period", Detail: "not the start date of a period"}},
			ContainingPeriod: noSuchPeriod.Containing.Name}
	case errors.As(err, &field):
		return invalid(fieldsOf(err)...)
	case errors.As(err, &unknown):
		return customerNotFound(unknown.Customer) // the 404 of every route under /v1/customers/{c}
	case errors.As(err, &missing):
		// Worded for the caller; the error's own text starts with its
		// package's name, for logs.
		return notFound(missing.Detail)
	case errors.Is(err, ingest.ErrDeadLetterNotFound):
		return notFound(err.Error())
	case errors.Is(err, reconcile.ErrNotFound):
		return notFound(err.Error())
	case errors.Is(err, ingest.ErrAlreadyReplayed):
		return &Problem{Type: TypeAlreadyReplayed, Title: "Already replayed", Status: http.StatusConflict,
			Detail: "the dead letter was replayed before; its usage is in the ledger (see replayed_at and replay_outcome)"}
	case errors.Is(err, periods.ErrPeriodOpen):
		return &Problem{Type: TypePeriodOpen, Title: "Period not ended", Status: http.StatusConflict,
			Detail: err.Error() + "; close it after its end"}
	case errors.Is(err, periods.ErrInGrace):
		return &Problem{Type: TypePeriodOpen, Title: "Period in grace", Status: http.StatusConflict,
			Detail: err.Error()}
	case errors.Is(err, periods.ErrNotReconciled):
		return &Problem{Type: TypeNotReconciled, Title: "Period not reconciled", Status: http.StatusConflict,
			Detail: err.Error() + `; reconcile it (POST /v1/reconciliations or tally reconcile) or close with {"force": true, "reason": "..."}`}
	case errors.Is(err, periods.ErrInconsistent):
		return &Problem{Type: TypeInconsistent, Title: "Rollups disagree with the ledger", Status: http.StatusConflict,
			Detail: err.Error() + "; reconcile the period to see the findings"}
	case errors.Is(err, reconcile.ErrBusy):
		return &Problem{Type: TypeBusy, Title: "Reconciliation running", Status: http.StatusConflict,
			Detail: err.Error() + "; try again when it has finished"}
	case errors.Is(err, context.DeadlineExceeded):
		a.log.ErrorContext(r.Context(), "request timed out", "err", err, "request_id", middleware.GetReqID(r.Context()))
		return &Problem{Type: TypeUnavailable, Title: "Timed out", Status: http.StatusServiceUnavailable,
			Detail: "the request took too long; try again"}
	case errors.Is(err, context.Canceled) && r.Context().Err() != nil:
		// The client went away; nobody reads this.
		return &Problem{Type: TypeUnavailable, Title: "Client closed request", Status: 499}
	case databaseUnavailable(err):
		a.log.WarnContext(r.Context(), "request failed: the database is unavailable", "err", err,
			"request_id", middleware.GetReqID(r.Context()))
		return &Problem{Type: TypeUnavailable, Title: "Database unavailable", Status: http.StatusServiceUnavailable,
			Detail: "the database is unreachable or restarting; retry after the number of seconds in Retry-After"}
	}
	a.log.ErrorContext(r.Context(), "request failed", "err", err, "method", clip(r.Method, logClip), "path", clip(r.URL.Path, logClip),
		"request_id", middleware.GetReqID(r.Context()))
	return &Problem{Type: TypeInternal, Title: "Internal error", Status: http.StatusInternalServerError,
		Detail: "the server failed; the error is logged with this request_id"}
}

func writeProblem(w http.ResponseWriter, p *Problem) {
	// Details quote what the client sent (a path, a method, an id): they
	// are encoded with HTML escaping on, so no markup leaves raw even if a
	// browser ignores the content type.
	b, err := json.Marshal(p)
	b = append(b, '\n')
	if err != nil {
		b = []byte(`{"type":"` + TypeInternal + `","title":"Internal error","status":500}` + "\n")
	}
	h := w.Header()
	h.Set("Content-Type", "application/problem+json")
	h.Set("Cache-Control", "no-store")
	h.Del("Content-Length")
	w.WriteHeader(p.Status)
	_, _ = w.Write(b)
}
