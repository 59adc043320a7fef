package api

import (
	"crypto/sha256"
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
//
// A cursor is bound to the list that made it: it carries a tag of the
// request's path (which names the list and, for a customer's lists, the
// customer) and of its query parameters other than limit and cursor (the
// filters). A cursor passed to another list, or to the same list under
// other filters, is refused naming cursor: read there, its key would
// silently skip or repeat items of a list it never described.

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

// cursorVersion begins every cursor: "c2." then the list's tag, a dot, and
// the key. Cursors of version c1 (the key alone, bound to no list) are
// refused like any other text that is not a cursor: accepting them would
// keep the silent skip this version ends, and a cursor lives only while a
// client pages through a list, which it can start again from its first page.
const cursorVersion = "c2."

// Texts of the problems a cursor gets.
const (
	notACursor    = "not a cursor returned by this API (pass next_cursor back unchanged)"
	otherListText = "a cursor of another list or of other filters: pass next_cursor back with the path and query parameters (other than limit) of the request that returned it"
)

// PageRequest is a parsed ?limit=&cursor=.
type PageRequest struct {
	Limit int
	// After is the sort key of the last item of the previous page; nil for
	// the first page.
	After []string
	// list is the tag of the list and filters requested (listTag): the
	// cursors of its pages carry it.
	list string
}

// ParsePageRequest reads limit and cursor from query parameters q (as
// returned by queryParams for r). A cursor made for another list or under
// other filters than r's is refused.
func ParsePageRequest(r *http.Request, q map[string]string) (PageRequest, error) {
	pr := PageRequest{Limit: DefaultPageLimit, list: listTag(r.URL.Path, q)}
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
		list, key, err := decodeCursor(s)
		switch {
		case err != nil:
			errs = append(errs, FieldError{Field: "cursor", Detail: notACursor})
		case list != pr.list:
			errs = append(errs, FieldError{Field: "cursor", Detail: otherListText})
		default:
			pr.After = key
		}
	}
	if len(errs) > 0 {
		return pr, invalid(errs...)
	}
	return pr, nil
}

// Cursor makes the cursor that reads on after key in pr's list.
func (pr PageRequest) Cursor(key ...string) string {
	return encodeCursor(pr.list, key...)
}

// listTag names a list and its filters in a few characters: a hash of the
// decoded path and of the query parameters other than limit and cursor,
// ordered by name, so that the order in which a client gives them does
// not matter. Names and values are separated by NUL, which no list accepts
// in its path or filters, so two lists it serves never share a text. The
// path is the decoded one, as handlers read it: acme and %61cme are one
// customer. Nine bytes of SHA-256 tell lists apart; a tag is no secret (a
// client may make any key anyway), only a check against mistakes.
func listTag(path string, q map[string]string) string {
	names := make([]string, 0, len(q))
	for k := range q {
		if k != "limit" && k != "cursor" {
			names = append(names, k)
		}
	}
	slices.Sort(names)
	h := sha256.New()
	h.Write([]byte(path))
	for _, k := range names {
		h.Write([]byte{0})
		h.Write([]byte(k))
		h.Write([]byte{0})
		h.Write([]byte(q[k]))
	}
	return base64.RawURLEncoding.EncodeToString(h.Sum(nil)[:9])
}

// encodeCursor makes a cursor of list's from a sort key.
func encodeCursor(list string, key ...string) string {
	b, _ := json.Marshal(key)
	return cursorVersion + list + "." + base64.RawURLEncoding.EncodeToString(b)
}

// decodeCursor reads a cursor made by encodeCursor: its list's tag and its
// key.
func decodeCursor(s string) (string, []string, error) {
	errBad := &Problem{Type: TypeInvalidRequest, Title: "Invalid cursor", Status: http.StatusBadRequest}
	if len(s) < len(cursorVersion) || s[:len(cursorVersion)] != cursorVersion || len(s) > 1024 {
		return "", nil, errBad
	}
	list, rest, ok := strings.Cut(s[len(cursorVersion):], ".")
	if !ok || list == "" {
		return "", nil, errBad
	}
	b, err := base64.RawURLEncoding.DecodeString(rest)
	if err != nil {
		return "", nil, errBad
	}
	var key []string
	if err := json.Unmarshal(b, &key); err != nil || len(key) == 0 {
		return "", nil, errBad
	}
	for _, k := range key {
		if strings.IndexByte(k, 0) >= 0 { // never made by encodeCursor: no text holds a NUL
			return "", nil, errBad
		}
	}
	return list, key, nil
}

// NewPage builds a page of pr's list from up to pr.Limit+1 rows read in
// sort order after pr's cursor: the extra row only says that there is a
// next page, whose cursor is bound to pr's list.
func NewPage[T any](rows []T, pr PageRequest, key func(T) []string) Page[T] {
	if rows == nil {
		rows = []T{}
	}
	if len(rows) <= pr.Limit {
		return Page[T]{Items: rows}
	}
	rows = rows[:pr.Limit]
	return Page[T]{Items: rows, NextCursor: pr.Cursor(key(rows[pr.Limit-1])...)}
}

// pageInMemory pages a list read whole: the lists an operator keeps
// (meters, pools, alert rules, webhooks) and a customer's rate budgets
// (one per rule, not per period) are short enough to read at once, and
// are paged here by key (unique per item) so that a client pages them as
// every other list. The page is in key order (slices.Compare), or in
// cmp's when it is not nil.
func pageInMemory[T any](r *http.Request, q map[string]string, all []T, key func(T) []string, cmp func(a, b []string) int) (Page[T], error) {
	pr, err := ParsePageRequest(r, q)
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
	return NewPage(rows, pr, key), nil
}

// parsePage is ParsePageRequest returning the field errors, for handlers
// that check more parameters and report every problem at once.
func parsePage(r *http.Request, q map[string]string) (PageRequest, []FieldError) {
	pr, err := ParsePageRequest(r, q)
	var p *Problem
	if errors.As(err, &p) {
		return pr, p.Errors
	}
	return pr, nil
}
