package api

import (
	"fmt"
	"net/http/httptest"
	"slices"
	"strconv"
	"testing"
)

func TestCursorRoundTrip(t *testing.T) {
	list := listTag("/v1/tokens", map[string]string{"customer": "acme"})
	for _, key := range [][]string{{"a"}, {"2026-12-02T10:00:00Z", "0193e0a1-0000-7000-8000-000000000000"}, {"ü/\"?&=", ""}} {
		gotList, got, err := decodeCursor(encodeCursor(list, key...))
		if err != nil || gotList != list || !slices.Equal(got, key) {
			t.Errorf("round trip %q: %q %q, %v", key, gotList, got, err)
		}
	}
	for _, bad := range []string{"", "c2.", "c2.x.!!!", "c2..WyJhIl0", "c2.WyJhIl0", "c1." + encodeCursor(list, "a")[3:],
		"c1.WyJhIl0", "c2.x.bnVsbA", "c2.x.W10", "x"} {
		if _, _, err := decodeCursor(bad); err == nil {
			t.Errorf("decodeCursor(%q) accepted", bad)
		}
	}
}

// A list's tag names its path and its filters in any order, not its limit
// or cursor.
func TestListTag(t *testing.T) {
	tag := listTag("/v1/dead-letters", map[string]string{"customer": "acme", "pending": "true"})
	if got := listTag("/v1/dead-letters", map[string]string{"pending": "true", "customer": "acme", "limit": "5", "cursor": "c"}); got != tag {
		t.Errorf("limit and cursor changed the tag: %s, %s", got, tag)
	}
	for _, other := range []struct {
		path string
		q    map[string]string
	}{
		{"/v1/reconciliations", map[string]string{"customer": "acme", "pending": "true"}},
		{"/v1/dead-letters", map[string]string{"customer": "acme"}},
		{"/v1/dead-letters", map[string]string{"customer": "acme", "pending": "false"}},
		{"/v1/dead-letters", map[string]string{"customer": "acme\x00pending", "pending": "true"}},
		{"/v1/dead-letters", map[string]string{"customer": "acmepending", "true": ""}},
	} {
		if got := listTag(other.path, other.q); got == tag {
			t.Errorf("%s %v has the tag of another list", other.path, other.q)
		}
	}
}

func TestParsePageRequest(t *testing.T) {
	r := httptest.NewRequest("GET", "/v1/meters", nil)
	mine := encodeCursor(listTag("/v1/meters", nil), "k")
	tests := []struct {
		q         map[string]string
		limit     int
		after     []string
		badFields []string
	}{
		{q: map[string]string{}, limit: DefaultPageLimit},
		{q: map[string]string{"limit": "1"}, limit: 1},
		{q: map[string]string{"limit": "1000", "cursor": mine}, limit: 1000, after: []string{"k"}},
		{q: map[string]string{"limit": "0"}, badFields: []string{"limit"}},
		{q: map[string]string{"limit": "1001"}, badFields: []string{"limit"}},
		{q: map[string]string{"limit": "ten", "cursor": "nope"}, badFields: []string{"limit", "cursor"}},
		{q: map[string]string{"limit": "99999999999999999999"}, badFields: []string{"limit"}},
		{q: map[string]string{"cursor": encodeCursor(listTag("/v1/pools", nil), "k")}, badFields: []string{"cursor"}},
		{q: map[string]string{"cursor": "c1.WyJrIl0"}, badFields: []string{"cursor"}},
	}
	for _, tt := range tests {
		pr, err := ParsePageRequest(r, tt.q)
		if tt.badFields != nil {
			p, ok := err.(*Problem)
			if !ok {
				t.Errorf("%v: error %v, want a problem", tt.q, err)
				continue
			}
			var fields []string
			for _, e := range p.Errors {
				fields = append(fields, e.Field)
			}
			if !slices.Equal(fields, tt.badFields) {
				t.Errorf("%v: fields %v, want %v", tt.q, fields, tt.badFields)
			}
			continue
		}
		if err != nil || pr.Limit != tt.limit || !slices.Equal(pr.After, tt.after) {
			t.Errorf("%v: %+v, %v", tt.q, pr, err)
		}
	}
}

// TestPagingWalk pages through a list that grows while it is read: every
// item present from the start is seen exactly once, in order.
func TestPagingWalk(t *testing.T) {
	var table []int
	for i := 0; i < 25; i += 1 {
		table = append(table, i*2)
	}
	// read emulates "WHERE key > after ORDER BY key LIMIT limit+1".
	read := func(pr PageRequest) Page[int] {
		var rows []int
		for _, v := range table {
			if pr.After != nil {
				after, _ := strconv.Atoi(pr.After[0])
				if v <= after {
					continue
				}
			}
			rows = append(rows, v)
			if len(rows) == pr.Limit+1 {
				break
			}
		}
		return NewPage(rows, pr, func(v int) []string { return []string{strconv.Itoa(v)} })
	}
	var seen []int
	r := httptest.NewRequest("GET", "/v1/meters?limit=7", nil)
	pr, err := ParsePageRequest(r, map[string]string{"limit": "7"})
	if err != nil {
		t.Fatal(err)
	}
	for pages := 0; ; pages++ {
		if pages > 10 {
			t.Fatal("no end")
		}
		p := read(pr)
		seen = append(seen, p.Items...)
		table = append(table, 1000+pages) // rows arrive meanwhile
		if p.NextCursor == "" {
			break
		}
		pr, err = ParsePageRequest(r, map[string]string{"limit": "7", "cursor": p.NextCursor})
		if err != nil {
			t.Fatal(err)
		}
	}
	for i := 0; i < 25; i++ {
		if seen[i] != i*2 {
			t.Fatalf("seen %v", seen)
		}
	}
	if !slices.IsSorted(seen) || len(seen) != len(slices.Compact(slices.Clone(seen))) {
		t.Fatalf("repeats or disorder: %v", seen)
	}
	if got := fmt.Sprint(NewPage[int](nil, PageRequest{Limit: 5}, nil).Items); got != "[]" {
		t.Fatalf("empty page items = %s", got)
	}
}
