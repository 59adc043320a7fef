package admit_test

import (
	"context"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/tally-ledger/tally/admit"
)

// admissionSeries reads every series of tally_admit_admissions_total.
func admissionSeries(t *testing.T, reg *prometheus.Registry) map[string]float64 {
	t.Helper()
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	out := map[string]float64{}
	for _, mf := range mfs {
		if mf.GetName() != "tally_admit_admissions_total" {
			continue
		}
		for _, m := range mf.GetMetric() {
			var ls []string
			for _, l := range m.GetLabel() {
				ls = append(ls, l.GetName()+"="+l.GetValue())
			}
			out[strings.Join(ls, ",")] = m.GetCounter().GetValue()
		}
	}
	return out
}

// A scrape while budgets are forgotten sees every counter where it was or
// further: a forgotten budget's counts move to the client's own at once,
// never missing from one scrape (Prometheus reads a counter that went
// back as a restart, and a rate over it as a burst of every admission
// since the start).
func TestCountersNeverGoBackWhileBudgetsAreForgotten(t *testing.T) {
	ts := startTally(t)
	reg := prometheus.NewRegistry()
	c := newClient(t, ts, "gw1", t.TempDir(), admit.Config{Registerer: reg,
		ForgetAfter: time.Millisecond, Tick: 10 * time.Millisecond})
	defer c.Close(context.Background())
	ctx := context.Background()
	stop := make(chan struct{})
	var wg sync.WaitGroup
	wg.Go(func() {
		// Meters without a rule: each customer's second Admit is counted
		// in its budget, then forgotten a tick later.
		for i := 0; ; i++ {
			select {
			case <-stop:
				return
			default:
			}
			customer := fmt.Sprint("c-", i%400)
			for range 3 {
				if _, err := c.Admit(ctx, customer, "tokens", 1); err != nil {
					t.Error(err)
					return
				}
			}
		}
	})
	last := map[string]float64{}
	deadline := time.Now().Add(3 * time.Second)
	scrapes := 0
	for time.Now().Before(deadline) && !t.Failed() {
		now := admissionSeries(t, reg)
		for k, v := range now {
			if v < last[k] {
				t.Errorf("scrape %d: %s went back from %v to %v", scrapes, k, last[k], v)
			}
			last[k] = v
		}
		scrapes++
	}
	close(stop)
	wg.Wait()
	forgotten, err := metricValue(reg, "tally_admit_budgets_forgotten_total", "")
	if err != nil {
		t.Fatal(err)
	}
	if !t.Failed() && forgotten < 100 {
		t.Fatalf("only %v budgets forgotten: the race was not run", forgotten)
	}
	t.Logf("%d scrapes, %v budgets forgotten, %v", scrapes, forgotten, last)
}
