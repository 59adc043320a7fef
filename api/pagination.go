package api

import (
	"encoding/base64"
	"encoding/json"
	"errors"
	"net/http"
	"slices"
	"strconv"
	"strings"
)

// Lists return Page and take ?limit= and ?cursor= (docs/design.md §7). Cursors are
// keyset cursors: the sort key of the last item returned, so a page never
// repeats or skips an item when rows are added meanwhile (as an offset
// would), and reading on from a cursor later gives the same next item. They
// are opaque to clients (versioned base64url JSON), so the key can change.

// Page is one page of a list.
type Page[T any] struct {
	Items []T `json:"items"`
	// NextCursor is empty on the last page.
	NextCursor string `json:"next_cursor"`
}

// Limits of ?limit=.
const (
	DefaultPageLimit = 100
	MaxPageLimit     = 1000
)

const cursorVersion = "c1."

// PageRequest is a parsed ?limit=&cursor=.
type PageRequest struct {
	Limit int
	// After is the sort key of the last item of the previous page; nil for
	// the first page.
	After []string
}

// ParsePageRequest reads limit and cursor from query parameters (as
// returned by queryParams).
func ParsePageRequest(q map[string]string) (PageRequest, error) {
	pr := PageRequest{Limit: DefaultPageLimit}
	var errs []FieldError
	if s, ok := q["limit"]; ok {
		n, err := strconv.Atoi(s)
		if err != nil || n < 1 || n > MaxPageLimit {
			errs = append(errs, FieldError{Field: "limit", Detail: quote(s) + " is not an integer from 1 to " + strconv.Itoa(MaxPageLimit)})
		} else {
			pr.Limit = n
		}
	}
	if s, ok := q["cursor"]; ok {
		key, err := DecodeCursor(s)
		if err != nil {
			errs = append(errs, FieldError{Field: "cursor", Detail: "not a cursor returned by this API (pass next_cursor back unchanged)"})
		} else {
			pr.After = key
		}
	}
	if len(errs) > 0 {
		return pr, invalid(errs...)
	}
	return pr, nil
}

// EncodeCursor makes a cursor from a sort key.
func EncodeCursor(key ...string) string {
	b, _ := json.Marshal(key)
	return cursorVersion + base64.RawURLEncoding.EncodeToString(b)
}

// DecodeCursor reads a cursor made by EncodeCursor.
func DecodeCursor(s string) ([]string, error) {
	errBad := &Problem{Type: TypeInvalidRequest, Title: "Invalid cursor", Status: http.StatusBadRequest}
	if len(s) < len(cursorVersion) || s[:len(cursorVersion)] != cursorVersion || len(s) > 1024 {
		return nil, errBad
	}
	b, err := base64.RawURLEncoding.DecodeString(s[len(cursorVersion):])
	if err != nil {
		return nil, errBad
	}
	var key []string
	if err := json.Unmarshal(b, &key); err != nil || len(key) == 0 {
		return nil, errBad
	}
	for _, k := range key {
		if strings.IndexByte(k, 0) >= 0 { // never made by EncodeCursor: no text holds a NUL
			return nil, errBad
		}
	}
	return key, nil
}

// NewPage builds a page from up to limit+1 rows read in sort order after
// the request's cursor: the extra row only says that there is a next page.
func NewPage[T any](rows []T, limit int, key func(T) []string) Page[T] {
	if rows == nil {
		rows = []T{}
	}
	if len(rows) <= limit {
		return Page[T]{Items: rows}
	}
	rows = rows[:limit]
	return Page[T]{Items: rows, NextCursor: EncodeCursor(key(rows[limit-1])...)}
}

// pageInMemory pages a list read whole: the lists an operator keeps
// (meters, pools, alert rules, webhooks) and a customer's budgets
// are short enough to read at once, and are paged here by key (unique per
// item) so that a client pages them as every other list. The page is in
// key order (slices.Compare), or in cmp's when it is not nil.
func pageInMemory[T any](q map[string]string, all []T, key func(T) []string, cmp func(a, b []string) int) (Page[T], error) {
	pr, err := ParsePageRequest(q)
	if err != nil {
		return Page[T]{}, err
	}
	if cmp == nil {
		cmp = slices.Compare[[]string]
	}
	all = slices.Clone(all)
	slices.SortFunc(all, func(a, b T) int { return cmp(key(a), key(b)) })
	rows := all
	if pr.After != nil {
		i, _ := slices.BinarySearchFunc(all, pr.After, func(t T, after []string) int {
			if cmp(key(t), after) <= 0 {
				return -1
			}
			return 1
		})
		rows = all[i:]
	}
	if len(rows) > pr.Limit+1 {
		rows = rows[:pr.Limit+1]
	}
	return NewPage(rows, pr.Limit, key), nil
}

// parsePage is ParsePageRequest returning the field errors, for handlers
// that check more parameters and report every problem at once.
func parsePage(q map[string]string) (PageRequest, []FieldError) {
	pr, err := ParsePageRequest(q)
	var p *Problem
	if errors.As(err, &p) {
		return pr, p.Errors
	}
	return pr, nil
}
