package api

import (
	"fmt"
	"slices"
	"strconv"
	"testing"
)

func TestCursorRoundTrip(t *testing.T) {
	for _, key := range [][]string{{"a"}, {"2026-12-02T10:00:00Z", "0193e0a1-0000-7000-8000-000000000000"}, {"ü/\"?&=", ""}} {
		got, err := DecodeCursor(EncodeCursor(key...))
		if err != nil || !slices.Equal(got, key) {
			t.Errorf("round trip %q: %q, %v", key, got, err)
		}
	}
	for _, bad := range []string{"", "c1.", "c1.!!!", "c2." + EncodeCursor("a")[3:], "c1.bnVsbA", "c1.W10", "x"} {
		if _, err := DecodeCursor(bad); err == nil {
			t.Errorf("DecodeCursor(%q) accepted", bad)
		}
	}
}

func TestParsePageRequest(t *testing.T) {
	tests := []struct {
		q         map[string]string
		limit     int
		after     []string
		badFields []string
	}{
		{q: map[string]string{}, limit: DefaultPageLimit},
		{q: map[string]string{"limit": "1"}, limit: 1},
		{q: map[string]string{"limit": "1000", "cursor": EncodeCursor("k")}, limit: 1000, after: []string{"k"}},
		{q: map[string]string{"limit": "0"}, badFields: []string{"limit"}},
		{q: map[string]string{"limit": "1001"}, badFields: []string{"limit"}},
		{q: map[string]string{"limit": "ten", "cursor": "nope"}, badFields: []string{"limit", "cursor"}},
		{q: map[string]string{"limit": "99999999999999999999"}, badFields: []string{"limit"}},
	}
	for _, tt := range tests {
		pr, err := ParsePageRequest(tt.q)
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
		return NewPage(rows, pr.Limit, func(v int) []string { return []string{strconv.Itoa(v)} })
	}
	var seen []int
	pr := PageRequest{Limit: 7}
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
		var err error
		pr, err = ParsePageRequest(map[string]string{"limit": "7", "cursor": p.NextCursor})
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
	if got := fmt.Sprint(NewPage[int](nil, 5, nil).Items); got != "[]" {
		t.Fatalf("empty page items = %s", got)
	}
}
