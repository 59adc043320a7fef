package reconcile_test

import (
	"bytes"
	"context"
	"testing"

	"github.com/tally-ledger/tally/reconcile"
)

// TestReportWriterWritesWhatWriteReportsWrites: the reports of runs
// written one at a time are those of WriteReports, in every format.
func TestReportWriterWritesWhatWriteReportsWrites(t *testing.T) {
	e := newEnv(t)
	e.apply(rec("gw", 1, "acme", 1, "10", "", nov), rec("gw", 1, "acme", 3, "25", "", nov), rec("gw", 1, "globex", 1, "7.5", "", nov))
	var runs []*reconcile.Run
	for _, opt := range []reconcile.Options{{Period: "2026-11-01"}, {Period: "2026-11-01", Customer: "acme"}, {Period: "2026-10-01"}} {
		r, err := e.rc.Run(context.Background(), opt)
		if err != nil && r == nil {
			t.Fatal(err)
		}
		runs = append(runs, r)
	}
	if len(runs[0].Totals) == 0 || len(runs[0].Findings) == 0 {
		t.Fatalf("want a run with totals and findings (acme's gap): %+v", runs[0])
	}
	for _, format := range []string{"json", "csv", "text", ""} {
		for n := 1; n <= len(runs); n++ {
			var want, got bytes.Buffer
			if err := reconcile.WriteReports(&want, format, runs[:n]); err != nil {
				t.Fatal(err)
			}
			rw, err := reconcile.NewReportWriter(&got, format)
			if err != nil {
				t.Fatal(err)
			}
			for _, r := range runs[:n] {
				if err := rw.Write(r); err != nil {
					t.Fatal(err)
				}
			}
			if err := rw.Close(); err != nil {
				t.Fatal(err)
			}
			if got.String() != want.String() {
				t.Errorf("format %q, %d runs: written one at a time\n%s\nwant\n%s", format, n, got.String(), want.String())
			}
		}
	}
	if _, err := reconcile.NewReportWriter(&bytes.Buffer{}, "xml"); err == nil {
		t.Error("a report writer of format xml: want an error")
	}
}
