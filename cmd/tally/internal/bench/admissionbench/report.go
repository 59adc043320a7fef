package admissionbench

import (
	"fmt"
	"io"
	"strings"
	"text/tabwriter"
	"time"
)

// Report writes the figures as a table (Markdown, aligned), then each
// regime against the targets of docs/design.md §10.
func (r Result) Report(w io.Writer) {
	o := r.Options
	fmt.Fprintf(w, "tally bench admission: %d gateways × %d customers, %d requests of cost 1 in %s per regime (%d/s, Zipf %.2g, bursts ×%.2g), limit %d per customer for the period\n",
		o.Gateways, o.Customers, r.Requests, o.Duration, o.Rate, o.Skew, o.Burst, o.Limit)
	fmt.Fprintf(w, "demand over the period: %d customers over the limit, %d at 95–100%% of it, %d at most 95%%\n", r.Over, r.Near, r.Below)
	fmt.Fprintf(w, "first requests of a customer at a gateway: %d (%s of requests; after the warm-up %d, %s of those): under grants each waits for a grant request%s\n\n",
		r.Firsts, percent(r.Firsts, r.Requests), r.FirstsSteady, percent(r.FirstsSteady, r.Steady), callFloor(r.Firsts, r.Requests))
	tw := tabwriter.NewWriter(w, 0, 0, 1, ' ', 0)
	fmt.Fprintln(tw, "| regime\t| admitted ÷ limit (worst)\t| over limit\t| stranded at end (of Σ limits)\t| false denials (of requests)\t| false denials, demand ≤ 95%\t| central calls / 1,000 admissions: all (steady)\t| p50\t| p99: all (steady)\t|")
	fmt.Fprintln(tw, "| ---\t| ---\t| ---\t| ---\t| ---\t| ---\t| ---\t| ---\t| ---\t|")
	limits := o.Limit * int64(o.Customers)
	for _, row := range r.Rows {
		if row.Skipped != "" {
			fmt.Fprintf(tw, "| %s\t| %s\t|\t|\t|\t|\t|\t|\t|\t|\n", row.Regime, row.Skipped)
			continue
		}
		fmt.Fprintf(tw, "| %s\t| %.3f\t| %d\t| %d (%s)\t| %d (%s)\t| %s of %d\t| %s (%s)\t| %s\t| %s (%s)\t|\n",
			row.Regime, float64(row.WorstAdmitted)/float64(o.Limit), row.OverLimit, row.Stranded, percent(row.Stranded, limits),
			row.FalseDenials, percent(row.FalseDenials, row.Requests),
			percent(row.Below95False, row.Below95), row.Below95,
			perThousand(row.CentralCalls, row.Admitted), perThousand(row.SteadyCalls, row.SteadyAdmitted), dur(row.P50), dur(row.P99), dur(row.SteadyP99))
	}
	_ = tw.Flush()

	fmt.Fprintf(w, "\ntargets (docs/design.md §10) for exact admission: overshoot 0; ≤ 10 grant calls per 1,000 admissions at steady demand; ≤ 1%% false denials while demand ≤ 95%% of the limit\n")
	for _, row := range r.Rows {
		switch {
		case row.Skipped != "":
			fmt.Fprintf(w, "  %-26s %s\n", row.Regime, row.Skipped)
		case row.Key == "fixed" || row.Key == "sized":
			fmt.Fprintf(w, "  %-26s overshoot %d units: %s; grant calls at steady demand %s per 1,000 admissions (all calls %s): %s; false denials at demand ≤ 95%%: %s: %s\n",
				row.Regime, row.OverLimit, met(row.OverLimit == 0),
				perThousand(row.SteadyGrantCalls, row.SteadyAdmitted), perThousand(row.SteadyCalls, row.SteadyAdmitted),
				met(row.SteadyGrantCalls*100 <= row.SteadyAdmitted),
				percent(row.Below95False, row.Below95), met(row.Below95False*100 <= row.Below95))
			fmt.Fprintf(w, "  %-26s %s; the replay took %s%s\n", "", row.CallDetail, row.Elapsed.Round(10*time.Millisecond), row.cpu())
		case row.Key == "lagged" && row.DecisionLag == [2]time.Duration{}:
			fmt.Fprintf(w, "  %-26s overshoot %d units; no customer reached the limit\n", row.Regime, row.OverLimit)
		case row.Key == "lagged":
			fmt.Fprintf(w, "  %-26s overshoot %d units (not exact); decision lag, limit reached → blocked: p50 %s, p99 %s (decision every %s, usage metered every %s)\n",
				row.Regime, row.OverLimit, dur(row.DecisionLag[0]), dur(row.DecisionLag[1]), o.LagInterval, o.LagFlush)
		default:
			fmt.Fprintf(w, "  %-26s overshoot %d units; one central call per request (%s per 1,000 admissions); the replay took %s%s\n",
				row.Regime, row.OverLimit, perThousand(row.CentralCalls, row.Admitted), row.Elapsed.Round(10*time.Millisecond), row.cpu())
		}
		for _, p := range row.Problems {
			fmt.Fprintf(w, "  %-26s PROBLEM: %s\n", "", p)
		}
	}
}

func met(ok bool) string {
	if ok {
		return "met"
	}
	return "NOT met"
}

func percent(n, of int64) string {
	if of == 0 {
		return "–"
	}
	return fmt.Sprintf("%.2f%%", 100*float64(n)/float64(of))
}

// callFloor says which quantile of grant-request latency bounds the p99
// of admission from below when a share n/of of requests must each wait
// for one: the slowest 1% of admissions are at least the slowest
// 1/(100·share) of those requests. Empty when the share is at most 1%.
func callFloor(n, of int64) string {
	if of == 0 || 100*n <= of {
		return ""
	}
	q := 100 - float64(of)/float64(n)
	return fmt.Sprintf(", so the p99 of admission is at least about the p%.0f of a grant request", q)
}

func perThousand(n, of int64) string {
	if of == 0 {
		return "–"
	}
	return fmt.Sprintf("%.1f", 1000*float64(n)/float64(of))
}

func dur(d time.Duration) string {
	switch {
	case d < time.Microsecond:
		return fmt.Sprintf("%d ns", d.Nanoseconds())
	case d < time.Millisecond:
		return fmt.Sprintf("%.1f µs", float64(d)/float64(time.Microsecond))
	default:
		return fmt.Sprintf("%.2f ms", float64(d)/float64(time.Millisecond))
	}
}

// HotTarget is the §10 target of the hot key: grants per second with 50
// concurrent holders.
const HotTarget = 2000

// Report writes the hot-key figures as a table, the baseline ratio, the
// target and the refusal phase.
func (r HotResult) Report(w io.Writer) {
	o := r.Options
	fmt.Fprintf(w, "tally bench admission --budgets %s: %d concurrent holders, one customer each, all in one pool; every grant of 1 draws on %s and is released at once, spent; %s per row; API pool %d connections\n\n",
		strings.Join(o.Budgets, ","), o.Holders, strings.Join(o.Budgets, ", "), o.Duration, o.APIPoolSize)
	var base float64
	for _, row := range r.Rows {
		if strings.HasPrefix(row.Name, "central counter") {
			base = row.PerSecond()
		}
	}
	tw := tabwriter.NewWriter(w, 0, 0, 1, ' ', 0)
	fmt.Fprintln(tw, "| way\t| grants\t| grants/s\t| ÷ central counter\t| grant p50\t| grant p99\t|")
	fmt.Fprintln(tw, "| ---\t| ---\t| ---\t| ---\t| ---\t| ---\t|")
	for _, row := range r.Rows {
		ratio := "–"
		if base > 0 {
			ratio = fmt.Sprintf("%.2f", row.PerSecond()/base)
		}
		fmt.Fprintf(tw, "| %s\t| %d\t| %.0f\t| %s\t| %s\t| %s\t|\n", row.Name, row.Grants, row.PerSecond(), ratio, dur(row.P50), dur(row.P99))
	}
	_ = tw.Flush()
	fmt.Fprintf(w, "\ntarget (docs/design.md §10): ≥ %d grants/s with 50 concurrent holders\n", HotTarget)
	for _, row := range r.Rows {
		if !strings.HasPrefix(row.Name, "central counter") {
			fmt.Fprintf(w, "  %-66s %.0f grants/s: %s\n", row.Name, row.PerSecond(), met(row.PerSecond() >= HotTarget))
		}
		for _, p := range row.Problems {
			fmt.Fprintf(w, "  %-66s PROBLEM: %s\n", "", p)
		}
	}
	f := r.Refusal
	if f.Skipped != "" {
		fmt.Fprintf(w, "\nrefusal by global: %s\n", f.Skipped)
		return
	}
	fmt.Fprintf(w, "\nrefusal by global (limit set to what it consumed, every holder asks once through the API): %d of %d refused by global; budgets unchanged: %s\n",
		f.Refused, f.Requests, met(len(f.Problems) == 0))
	for i, b := range f.Before {
		if i >= 2 && i < len(f.Before)-2 { // the first customers, the pool and global
			continue
		}
		a := f.After[i]
		fmt.Fprintf(w, "  %-40s consumed %s → %s, live %s → %s\n", b.Budget, b.Consumed, a.Consumed, b.Live, a.Live)
	}
	for _, p := range f.Problems {
		fmt.Fprintf(w, "  PROBLEM: %s\n", p)
	}
}

// cpu says how busy the host was during the replay: the share of its
// cores and the CPU time per request.
func (row Row) cpu() string {
	if row.CPUBusy <= 0 || row.Cores == 0 || row.Elapsed <= 0 || row.Requests == 0 {
		return ""
	}
	return fmt.Sprintf(", the host's %d cores %.0f%% busy (%s of CPU per request: gateways, API and Postgres together)",
		row.Cores, 100*row.CPUBusy.Seconds()/(row.Elapsed.Seconds()*float64(row.Cores)), dur(row.CPUBusy/time.Duration(row.Requests)))
}
