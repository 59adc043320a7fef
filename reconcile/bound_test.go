package reconcile_test

import (
	"bytes"
	"context"
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/google/uuid"

	"github.com/tally-ledger/tally/reconcile"
)

// TestFindingsAreBoundedPerKind: a ledger broken systematically makes a
// finding per stream, gap or record, millions of them; a run keeps,
// stores and reports at most Config.MaxFindings of each kind and one
// summary finding per kind saying how many more it found, while its
// status, its counts, its checks and every customer's verdict still rest
// on every finding, listed or not.
func TestFindingsAreBoundedPerKind(t *testing.T) {
	e := newEnv(t)
	var err error
	clock := func() time.Time { return e.now }
	if e.rc, err = reconcile.New(reconcile.Config{Pool: e.pool, Clock: clock, MaxFindings: 3}); err != nil {
		t.Fatal(err)
	}
	oct := time.Date(2026, 10, 10, 0, 0, 0, 0, time.UTC)
	// c0..c5: one stream each whose last total is tampered (6 discrepancies);
	// c6..c9: one stream each with a gap at seq 2 (4 notices), clean.
	var tampered, gapped []string
	for i := range 10 {
		c := fmt.Sprintf("c%d", i)
		if i < 6 {
			tampered = append(tampered, c)
			e.apply(rec("gw", 1, c, 1, "10", "10", oct))
		} else {
			gapped = append(gapped, c)
			e.apply(rec("gw", 1, c, 1, "10", "10", oct), rec("gw", 1, c, 3, "15", "", oct))
		}
	}
	e.exec(`UPDATE streams SET last_total = last_total + 1 WHERE customer = ANY($1)`, tampered)

	e.now = time.Date(2026, 11, 20, 12, 0, 0, 0, time.UTC) // October's grace has ended
	r, err := e.rc.Run(context.Background(), reconcile.Options{Period: "2026-10-01", Close: true})
	if err != nil {
		t.Fatal(err)
	}
	check := func(what string, r *reconcile.Run) {
		t.Helper()
		if r.Status != reconcile.StatusDiscrepancies || r.Discrepancies() != 6 {
			t.Errorf("%s: status %s, %d discrepancies; want discrepancies, 6", what, r.Status, r.Discrepancies())
		}
		listed, omitted := map[string]int{}, map[string]int{}
		for _, f := range r.Findings {
			if f.Omitted > 0 {
				omitted[f.Kind+"/"+f.Severity] += f.Omitted
				if !strings.Contains(f.Detail, fmt.Sprintf("%d more %s findings", f.Omitted, f.Kind)) {
					t.Errorf("%s: summary finding %+v", what, f)
				}
			} else {
				listed[f.Kind+"/"+f.Severity]++
			}
		}
		wantListed := map[string]int{"stream_total_mismatch/discrepancy": 3, "open_gap/notice": 3}
		wantOmitted := map[string]int{"stream_total_mismatch/discrepancy": 3, "open_gap/notice": 1}
		if fmt.Sprint(listed) != fmt.Sprint(wantListed) || fmt.Sprint(omitted) != fmt.Sprint(wantOmitted) {
			t.Errorf("%s: listed %v, omitted %v; want %v and %v", what, listed, omitted, wantListed, wantOmitted)
		}
		if len(r.Findings) != 8 {
			t.Errorf("%s: %d findings listed, want 8 (3 and a summary per kind)", what, len(r.Findings))
		}
		for _, c := range r.Checks {
			if c.Name == reconcile.CheckStreams && (c.Status != "findings" || c.Detail != "10 findings") {
				t.Errorf("%s: check %+v, want 10 findings", what, c)
			}
		}
		var text bytes.Buffer
		if err := reconcile.WriteReport(&text, reconcile.FormatText, r); err != nil {
			t.Fatal(err)
		}
		if !strings.Contains(text.String(), "(6 discrepancies, 4 notices;") {
			t.Errorf("%s: text report:\n%s", what, text.String())
		}
	}
	check("run", r)
	// Every customer with a discrepancy, listed or not, stays open; the
	// clean ones close.
	if !slices.Equal(r.Closed, gapped) {
		t.Errorf("closed %v, want %v", r.Closed, gapped)
	}
	var closed []string
	if err := e.pool.QueryRow(context.Background(),
		`SELECT coalesce(array_agg(customer ORDER BY customer), '{}') FROM period_closes`).Scan(&closed); err != nil {
		t.Fatal(err)
	}
	if !slices.Equal(closed, gapped) {
		t.Errorf("periods closed %v, want %v", closed, gapped)
	}
	var dirty []string
	if err := e.pool.QueryRow(context.Background(),
		`SELECT coalesce(array_agg(customer ORDER BY customer), '{}') FROM reconciliation_verdicts WHERE run_id = $1 AND NOT clean`, r.ID).Scan(&dirty); err != nil {
		t.Fatal(err)
	}
	if !slices.Equal(dirty, tampered) {
		t.Errorf("verdicts not clean %v, want %v", dirty, tampered)
	}

	stored, err := reconcile.Get(context.Background(), e.pool, r.ID)
	if err != nil {
		t.Fatal(err)
	}
	check("stored", stored)
	for i := range r.Findings {
		a, b := r.Findings[i], stored.Findings[i]
		if a.Kind != b.Kind || a.Severity != b.Severity || a.Omitted != b.Omitted || a.Detail != b.Detail || a.Customer != b.Customer {
			t.Errorf("finding %d: run %+v, stored %+v", i, a, b)
		}
	}
	list, err := reconcile.List(context.Background(), e.pool, "2026-10-01", uuid.Nil, 10)
	if err != nil {
		t.Fatal(err)
	}
	if len(list) != 1 || list[0].Findings != 10 || list[0].Discrepancies != 6 {
		t.Errorf("list: %+v, want 10 findings, 6 discrepancies", list)
	}
}
