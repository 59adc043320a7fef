package reconcile

import (
	"encoding/csv"
	"encoding/json"
	"fmt"
	"io"
	"strings"
	"text/tabwriter"
	"time"
)

// Formats of WriteReport.
const (
	FormatText = "text"
	FormatJSON = "json"
	FormatCSV  = "csv"
)

// ValidateFormat checks a report format before anything is run.
func ValidateFormat(format string) error {
	switch format {
	case FormatText, FormatJSON, FormatCSV, "":
		return nil
	}
	return fmt.Errorf("unknown format %q (text, json or csv)", format)
}

// WriteReport writes one run for people (text), machines (json: one
// object) or spreadsheets (csv: one row per customer and meter, then one
// per finding).
func WriteReport(w io.Writer, format string, r *Run) error {
	if format == FormatJSON {
		return encodeJSON(w, r)
	}
	return WriteReports(w, format, []*Run{r})
}

// WriteReports writes runs as WriteReport writes one, except that in JSON
// they are an array however many there are: the shape of a report of
// several periods (a nightly job's) does not depend on how many were due.
func WriteReports(w io.Writer, format string, runs []*Run) error {
	switch format {
	case FormatJSON:
		if runs == nil {
			runs = []*Run{} // [], not null
		}
		return encodeJSON(w, runs)
	case FormatCSV:
		return writeCSV(w, runs)
	case FormatText, "":
		for _, r := range runs {
			if err := writeText(w, r); err != nil {
				return err
			}
		}
		return nil
	default:
		return fmt.Errorf("unknown format %q (text, json or csv)", format)
	}
}

// ReportWriter writes the reports of runs one at a time, as each ends, in
// what WriteReports writes for all of them: a nightly job holds no run
// until the last has ended. Close ends the report (the JSON array); a
// writer given no run writes nothing.
type ReportWriter struct {
	w      io.Writer
	format string
	n      int
	cw     *csv.Writer
}

// NewReportWriter returns a ReportWriter of format.
func NewReportWriter(w io.Writer, format string) (*ReportWriter, error) {
	if err := ValidateFormat(format); err != nil {
		return nil, err
	}
	return &ReportWriter{w: w, format: format}, nil
}

// Write writes the report of r.
func (rw *ReportWriter) Write(r *Run) error {
	rw.n++
	switch rw.format {
	case FormatJSON:
		// As json.Encoder with an indent of two spaces writes an array.
		b, err := json.MarshalIndent(r, "  ", "  ")
		if err != nil {
			return err
		}
		sep := ",\n  "
		if rw.n == 1 {
			sep = "[\n  "
		}
		_, err = io.WriteString(rw.w, sep+string(b))
		return err
	case FormatCSV:
		if rw.cw == nil {
			rw.cw = csv.NewWriter(rw.w)
			writeCSVHeader(rw.cw)
		}
		writeCSVRows(rw.cw, r)
		rw.cw.Flush()
		return rw.cw.Error()
	default:
		return writeText(rw.w, r)
	}
}

// Close ends the report.
func (rw *ReportWriter) Close() error {
	if rw.format == FormatJSON && rw.n > 0 {
		_, err := io.WriteString(rw.w, "\n]\n")
		return err
	}
	return nil
}

func encodeJSON(w io.Writer, v any) error {
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	return enc.Encode(v)
}

func writeText(w io.Writer, r *Run) error {
	scope := "all customers"
	if r.Customer != "" {
		scope = "customer " + r.Customer
	}
	took := ""
	if r.FinishedAt != nil {
		took = r.FinishedAt.Sub(r.StartedAt).Round(time.Millisecond).String()
	}
	fmt.Fprintf(w, "Reconciliation %s — period %s, %s\n", r.ID, r.Period, scope)
	fmt.Fprintf(w, "Status: %s   (%d discrepancies, %d notices; %d ledger entries checked in %s)\n",
		strings.ToUpper(r.Status), r.Discrepancies(), r.Notices(), r.EntriesScanned, took)
	if r.Error != "" {
		fmt.Fprintf(w, "Error: %s\n", r.Error)
	}
	if len(r.Closed) > 0 {
		fmt.Fprintf(w, "Closed: %s\n", strings.Join(r.Closed, ", "))
	}
	fmt.Fprintln(w)
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintln(tw, "CUSTOMER\tMETER\tPERIOD\tBILLED\tUSAGE\tPRIOR-PERIOD\tADJUSTMENTS\tGAPS\tGAP USAGE\tFINDINGS\t")
	// Findings per customer and meter, counted once (not once per total).
	counts := make(map[[2]string]int, len(r.Totals))
	for _, f := range r.Findings {
		counts[[2]string{f.Customer, f.Meter}]++
	}
	for _, t := range r.Totals {
		n := counts[[2]string{t.Customer, t.Meter}]
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\t%s\t%s\t%d\t%s\t%d\t\n", t.Customer, t.Meter, t.Period,
			t.Billed, t.Usage, t.PriorPeriod, t.Adjustments, t.OpenGaps, t.GapAmount, n)
	}
	if err := tw.Flush(); err != nil {
		return err
	}
	fmt.Fprintln(w, "\nChecks:")
	for _, c := range r.Checks {
		fmt.Fprintf(w, "  %-28s %-9s %s\n", c.Name, c.Status, c.Detail)
	}
	if len(r.Findings) > 0 {
		fmt.Fprintln(w, "\nFindings:")
		for _, f := range r.Findings {
			who := strings.Trim(strings.Join([]string{f.Customer, f.Meter, f.Stream}, " "), " ")
			amt := ""
			if f.Amount != nil {
				amt = " [" + f.Amount.String() + "]"
			}
			fmt.Fprintf(w, "  %-11s %-26s %s%s: %s\n", f.Severity, f.Kind, who, amt, f.Detail)
		}
	}
	fmt.Fprintln(w)
	return nil
}

func writeCSV(w io.Writer, runs []*Run) error {
	cw := csv.NewWriter(w)
	writeCSVHeader(cw)
	for _, r := range runs {
		writeCSVRows(cw, r)
	}
	cw.Flush()
	return cw.Error()
}

func writeCSVHeader(cw *csv.Writer) {
	_ = cw.Write([]string{"run", "period", "status", "row", "customer", "meter", "billed", "usage",
		"prior_period_adjustments", "adjustments", "open_gaps", "gap_usage", "severity", "kind", "stream", "amount", "detail"})
}

func writeCSVRows(cw *csv.Writer, r *Run) {
	for _, t := range r.Totals {
		_ = cw.Write([]string{r.ID.String(), t.Period, r.Status, "total", t.Customer, t.Meter, t.Billed.String(), t.Usage.String(),
			t.PriorPeriod.String(), t.Adjustments.String(), fmt.Sprint(t.OpenGaps), t.GapAmount.String(), "", "", "", "", ""})
	}
	for _, f := range r.Findings {
		amt := ""
		if f.Amount != nil {
			amt = f.Amount.String()
		}
		// The period resolved, as on the total rows; the reference
		// asked for (e.g. "current") only when the customers' periods
		// differ, or in a run loaded with Get (PeriodName is not stored).
		period := f.PeriodName
		if period == "" {
			period = r.Period
		}
		_ = cw.Write([]string{r.ID.String(), period, r.Status, "finding", f.Customer, f.Meter, "", "", "", "", "", "",
			f.Severity, f.Kind, f.Stream, amt, f.Detail})
	}
}
