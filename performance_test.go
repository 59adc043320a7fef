package tally_test

import (
	"os"
	"strings"
	"testing"
)

// TestPerformanceTablesAgree: the README's performance table is
// docs/performance.md's summary, row for row (what, figure, baseline,
// target), so a figure changed in one place is changed in both.
func TestPerformanceTablesAgree(t *testing.T) {
	doc := tableAfter(t, "docs/performance.md", "## Summary")
	readme := tableAfter(t, "README.md", "## Performance")
	if len(doc) < 10 {
		t.Fatalf("docs/performance.md's summary has %d rows", len(doc))
	}
	if len(readme) != len(doc) {
		t.Errorf("README's performance table has %d rows, docs/performance.md's summary %d", len(readme), len(doc))
	}
	for i := range min(len(doc), len(readme)) {
		if len(doc[i]) < 4 || len(readme[i]) < 4 {
			t.Errorf("row %d: too few cells", i+1)
			continue
		}
		if got, want := strings.Join(readme[i][:4], " | "), strings.Join(doc[i][:4], " | "); got != want {
			t.Errorf("row %d differs:\nREADME:              %s\ndocs/performance.md: %s", i+1, got, want)
		}
	}
}

// tableAfter returns the cells of the rows of the first table after the
// heading (its header and separator rows left out).
func tableAfter(t *testing.T, file, heading string) [][]string {
	t.Helper()
	b, err := os.ReadFile(file)
	if err != nil {
		t.Fatal(err)
	}
	_, rest, ok := strings.Cut(string(b), "\n"+heading+"\n")
	if !ok {
		t.Fatalf("%s has no %q", file, heading)
	}
	var rows [][]string
	for line := range strings.SplitSeq(rest, "\n") {
		if !strings.HasPrefix(line, "|") {
			if len(rows) > 0 {
				break
			}
			continue
		}
		rows = append(rows, splitRow(line))
	}
	if len(rows) < 2 {
		t.Fatalf("%s: no table after %q", file, heading)
	}
	return rows[2:]
}

// splitRow splits a Markdown table row into its cells. A `|` inside
// backticks (a command's regular expression) belongs to the cell.
func splitRow(line string) []string {
	line = strings.TrimSpace(line)
	line = strings.TrimSuffix(strings.TrimPrefix(line, "|"), "|")
	var cells []string
	var cell strings.Builder
	code := false
	for _, r := range line {
		switch {
		case r == '`':
			code = !code
		case r == '|' && !code:
			cells = append(cells, strings.TrimSpace(cell.String()))
			cell.Reset()
			continue
		}
		cell.WriteRune(r)
	}
	return append(cells, strings.TrimSpace(cell.String()))
}
