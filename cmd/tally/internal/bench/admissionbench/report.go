package admissionbench

import (
	"cmp"
	"fmt"
	"io"
	"slices"
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
			fmt.Fprintf(tw, "| %s\t| %s\t|\t|\t|\t|\t|\t|\t|\t|\n", r.name(row), row.Skipped)
			continue
		}
		fmt.Fprintf(tw, "| %s\t| %.3f\t| %d\t| %d (%s)\t| %d (%s)\t| %s of %d\t| %s (%s)\t| %s\t| %s (%s)\t|\n",
			r.name(row), float64(row.WorstAdmitted)/float64(o.Limit), row.OverLimit, row.Stranded, percent(row.Stranded, limits),
			row.FalseDenials, percent(row.FalseDenials, row.Requests),
			percent(row.Below95False, row.Below95), row.Below95,
			perThousand(row.CentralCalls, row.Admitted), perThousand(row.SteadyCalls, row.SteadyAdmitted), dur(row.P50), dur(row.P99), dur(row.SteadyP99))
	}
	_ = tw.Flush()

	fmt.Fprintf(w, "\ntargets (docs/design.md §10) for exact admission: overshoot 0; ≤ 10 grant calls per 1,000 admissions at steady demand; ≤ 1%% false denials while demand ≤ 95%% of the limit\n")
	for _, row := range r.Rows {
		switch {
		case row.Skipped != "":
			fmt.Fprintf(w, "  %-26s %s\n", r.name(row), row.Skipped)
		case row.Key == "fixed" || row.Key == "sized":
			fmt.Fprintf(w, "  %-26s overshoot %d units: %s; grant calls at steady demand %s per 1,000 admissions (all calls %s): %s; false denials at demand ≤ 95%%: %s: %s\n",
				r.name(row), row.OverLimit, met(row.OverLimit == 0),
				perThousand(row.SteadyGrantCalls, row.SteadyAdmitted), perThousand(row.SteadyCalls, row.SteadyAdmitted),
				met(row.SteadyGrantCalls*100 <= row.SteadyAdmitted),
				percent(row.Below95False, row.Below95), met(row.Below95False*100 <= row.Below95))
			fmt.Fprintf(w, "  %-26s %s; the replay took %s%s\n", "", row.CallDetail, row.Elapsed.Round(10*time.Millisecond), row.cpu())
		case row.Key == "lagged" && row.DecisionLag == [2]time.Duration{}:
			fmt.Fprintf(w, "  %-26s overshoot %d units; no customer reached the limit\n", r.name(row), row.OverLimit)
		case row.Key == "lagged":
			fmt.Fprintf(w, "  %-26s overshoot %d units (not exact); decision lag, limit reached → blocked: p50 %s, p99 %s (decision every %s, usage metered every %s)\n",
				r.name(row), row.OverLimit, dur(row.DecisionLag[0]), dur(row.DecisionLag[1]), o.LagInterval, o.LagFlush)
		default:
			fmt.Fprintf(w, "  %-26s overshoot %d units; one central call per request (%s per 1,000 admissions); the replay took %s%s\n",
				r.name(row), row.OverLimit, perThousand(row.CentralCalls, row.Admitted), row.Elapsed.Round(10*time.Millisecond), row.cpu())
		}
		for _, p := range row.Problems {
			fmt.Fprintf(w, "  %-26s PROBLEM: %s\n", "", p)
		}
	}
	if o.Rounds > 1 {
		r.medians(w)
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
	s := fmt.Sprintf(", the host's %d cores %.0f%% busy (%s of CPU per request: gateways, API and Postgres together",
		row.Cores, 100*row.CPUBusy.Seconds()/(row.Elapsed.Seconds()*float64(row.Cores)), dur(row.CPUBusy/time.Duration(row.Requests)))
	if row.CPUProcess > 0 && row.CPUProcess <= row.CPUBusy {
		s += fmt.Sprintf("; this process %s, the rest of the host, mostly Postgres, %s",
			dur(row.CPUProcess/time.Duration(row.Requests)), dur((row.CPUBusy-row.CPUProcess)/time.Duration(row.Requests)))
	}
	return s + ")"
}

// name is row's regime, with its round when there are several.
func (r Result) name(row Row) string {
	if r.Options.Rounds > 1 {
		return fmt.Sprintf("%s (round %d)", row.Regime, row.Round)
	}
	return row.Regime
}

// medians writes, for each regime that ran, the median (and range) over
// the rounds of its p99 and CPU per request, and of those as multiples of
// the Postgres counter's in the same round: what a noisy machine moves
// least.
func (r Result) medians(w io.Writer) {
	counter := map[int]Row{}
	for _, row := range r.Rows {
		if row.Key == "postgres" && row.Skipped == "" {
			counter[row.Round] = row
		}
	}
	fmt.Fprintf(w, "\nover %d rounds, alternating: median (lowest–highest)\n", r.Options.Rounds)
	tw := tabwriter.NewWriter(w, 0, 0, 1, ' ', 0)
	fmt.Fprintln(tw, "| regime\t| p99: all\t| p99: steady\t| p99 ÷ the Postgres counter's\t| CPU per request\t| CPU per request ÷ the counter's\t| central calls / 1,000 admissions\t| false denials, demand ≤ 95%\t|")
	fmt.Fprintln(tw, "| ---\t| ---\t| ---\t| ---\t| ---\t| ---\t| ---\t| ---\t|")
	for _, key := range RegimeKeys {
		var p99, steady, cpu []time.Duration
		var p99x, cpux, calls, denials []float64
		name := ""
		for _, row := range r.Rows {
			if row.Key != key || row.Skipped != "" {
				continue
			}
			name = row.Regime
			p99, steady = append(p99, row.P99), append(steady, row.SteadyP99)
			calls = append(calls, 1000*float64(row.CentralCalls)/float64(max(row.Admitted, 1)))
			denials = append(denials, 100*float64(row.Below95False)/float64(max(row.Below95, 1)))
			perReq := row.CPUBusy / time.Duration(max(row.Requests, 1))
			if row.CPUBusy > 0 {
				cpu = append(cpu, perReq)
			}
			if c, ok := counter[row.Round]; ok {
				p99x = append(p99x, float64(row.P99)/float64(max(c.P99, 1)))
				if c.CPUBusy > 0 && row.CPUBusy > 0 {
					cpux = append(cpux, float64(row.CPUBusy)/float64(c.CPUBusy))
				}
			}
		}
		if name == "" {
			continue
		}
		fmt.Fprintf(tw, "| %s\t| %s\t| %s\t| %s\t| %s\t| %s\t| %s\t| %s\t|\n", name,
			spread(p99, dur), spread(steady, dur), spread(p99x, times), spread(cpu, dur), spread(cpux, times),
			spread(calls, func(v float64) string { return fmt.Sprintf("%.1f", v) }),
			spread(denials, func(v float64) string { return fmt.Sprintf("%.2f%%", v) }))
	}
	_ = tw.Flush()
}

func times(v float64) string { return fmt.Sprintf("%.2f ×", v) }

// spread is the median of vs and their range, each as f writes it ("–"
// when there are none).
func spread[T cmp.Ordered](vs []T, f func(T) string) string {
	if len(vs) == 0 {
		return "–"
	}
	s := slices.Sorted(slices.Values(vs))
	m := s[len(s)/2]
	if len(s)%2 == 0 {
		// The lower of the two middle values: an observed one, not a mean.
		m = s[len(s)/2-1]
	}
	if len(s) == 1 {
		return f(m)
	}
	return fmt.Sprintf("%s (%s–%s)", f(m), f(s[0]), f(s[len(s)-1]))
}
