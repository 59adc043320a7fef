package console

import (
	"bytes"
	"errors"
	"fmt"
	"html/template"
	"net/http"
	"strconv"
	"strings"

	"github.com/tally-ledger/tally/api"
	"github.com/tally-ledger/tally/ingest"
	"github.com/tally-ledger/tally/internal/ids"
	"github.com/tally-ledger/tally/periods"
	"github.com/tally-ledger/tally/reconcile"
)

// pageNames are the templates/*.html files that are whole pages (each is
// parsed with layout.html).
var pageNames = []string{"sign-in", "error", "overview", "customers", "customer", "statement",
	"reconciliations", "reconciliation", "dead-letters", "dead-letter", "alerts"}

func parsePages() (map[string]*template.Template, error) {
	out := map[string]*template.Template{}
	for _, name := range pageNames {
		t, err := template.New("layout.html").Funcs(funcs).ParseFS(templateFS, "templates/layout.html", "templates/"+name+".html")
		if err != nil {
			return nil, fmt.Errorf("console: template %s: %w", name, err)
		}
		out[name] = t
	}
	return out, nil
}

// page is what layout.html renders around a page's body.
type page struct {
	Title   string
	Viewer  viewer
	CSRF    string // the session's, for forms; "" when signed out
	Nav     string // the current section, for aria-current
	Refresh int    // seconds between reloads (meta refresh); 0: none
	Body    any
}

// render writes a whole page with status. name is a page template; data
// is its Body, or a page.
func (c *Console) render(w http.ResponseWriter, r *http.Request, status int, name string, data any) {
	p, ok := data.(page)
	if !ok {
		p = page{Body: data}
	}
	req := requestFrom(r.Context())
	p.Viewer, p.CSRF = req.viewer, req.csrf
	if p.Title == "" {
		p.Title = titleOf(name, data)
	}
	var b bytes.Buffer
	if err := c.pages[name].Execute(&b, p); err != nil {
		c.log.ErrorContext(r.Context(), "console: render", "page", name, "err", err)
		http.Error(w, "the console could not render this page; see the server log", http.StatusInternalServerError)
		return
	}
	w.Header().Set("Content-Type", "text/html; charset=utf-8")
	w.WriteHeader(status)
	_, _ = w.Write(b.Bytes())
}

func titleOf(name string, data any) string {
	if e, ok := data.(errorPage); ok {
		return e.Title
	}
	return strings.ToUpper(name[:1]) + strings.ReplaceAll(name[1:], "-", " ")
}

type errorPage struct {
	Title, Detail string
	Status        int
}

// notFoundError is a page that does not exist for this viewer: an unknown
// customer and another customer's look the same.
type notFoundError struct{ what string }

func (e notFoundError) Error() string { return e.what + " not found" }

// echo is request input named back on a page: quoted, and clipped to the
// longest id (ids.MaxLen characters) with an ellipsis, so that a
// 10,000-character path does not come back whole.
func echo(s string) string { return strconv.Quote(truncated(ids.MaxLen, s)) }

// errAdminOnly: a customer token asked for an admin page.
var errAdminOnly = errors.New("this page needs the admin token")

// page adapts a handler that returns an error.
func (c *Console) page(h func(http.ResponseWriter, *http.Request) error) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		if err := h(w, r); err != nil {
			c.fail(w, r, err)
		}
	}
}

// fail renders err as an error page: the console's one mapping of errors
// to statuses.
func (c *Console) fail(w http.ResponseWriter, r *http.Request, err error) {
	var nf notFoundError
	var p *api.Problem
	var badRef *periods.InvalidPeriodRefError
	var noPeriod *periods.NoSuchPeriodError
	switch {
	case errors.As(err, &nf):
		c.render(w, r, http.StatusNotFound, "error", errorPage{Title: "Not found", Detail: nf.Error() + "."})
	case errors.Is(err, errAdminOnly):
		c.render(w, r, http.StatusForbidden, "error", errorPage{Title: "Admin only",
			Detail: "This page names customers: it needs the admin token."})
	case errors.As(err, &p) && p.Status < 500:
		if p.RetryAfter != nil {
			w.Header().Set("Retry-After", strconv.FormatInt(*p.RetryAfter, 10))
		}
		c.render(w, r, p.Status, "error", errorPage{Title: p.Title, Detail: p.Detail})
	case errors.Is(err, periods.ErrUnknownCustomer):
		c.render(w, r, http.StatusNotFound, "error", errorPage{Title: "Not found", Detail: "customer not found."})
	case errors.As(err, &badRef):
		c.render(w, r, http.StatusNotFound, "error", errorPage{Title: "No such period",
			Detail: fmt.Sprintf("period %s: %v: %s", echo(badRef.Ref), periods.ErrInvalidPeriodRef, badRef.Detail)})
	case errors.As(err, &noPeriod): // its Ref is a date: nothing long to clip
		c.render(w, r, http.StatusNotFound, "error", errorPage{Title: "No such period", Detail: err.Error()})
	case errors.Is(err, ingest.ErrDeadLetterNotFound), errors.Is(err, reconcile.ErrNotFound):
		c.render(w, r, http.StatusNotFound, "error", errorPage{Title: "Not found", Detail: err.Error()})
	case errors.Is(err, ingest.ErrAlreadyReplayed):
		c.render(w, r, http.StatusConflict, "error", errorPage{Title: "Already replayed",
			Detail: "This dead letter was replayed before; its usage is booked once."})
	default:
		c.log.ErrorContext(r.Context(), "console", "method", truncated(64, r.Method), "path", truncated(256, r.URL.Path), "err", err)
		c.render(w, r, http.StatusInternalServerError, "error", errorPage{Title: "Something went wrong",
			Detail: "The console could not read this page. The server log says why."})
	}
}
