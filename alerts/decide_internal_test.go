package alerts

import (
	"testing"
	"time"

	"github.com/shopspring/decimal"
	"pgregory.net/rapid"

	"github.com/tally-ledger/tally/periods"
	"github.com/tally-ledger/tally/quota"
)

// TestStateMachineProperty: over any sequence of readings (usage up and
// down, the limit in force raised, lowered or gone), one (rule, subject,
// threshold, period) alternates triggered and resolved, starting with
// triggered; it triggers only at or past the threshold and resolves only
// below threshold × (1 − hysteresis) or without a limit; transitions are
// numbered 1, 2, 3…, each with its own id; a resolution says the
// threshold.value its trigger said.
func TestStateMachineProperty(t *testing.T) {
	rapid.Check(t, func(t *rapid.T) {
		percent := rapid.Bool().Draw(t, "percent")
		th := Threshold{}
		if percent {
			p := decimal.NewFromInt(rapid.Int64Range(1, 150).Draw(t, "pct"))
			th.Percent = &p
		} else {
			v := decimal.NewFromInt(rapid.Int64Range(1, 1000).Draw(t, "value"))
			th.Value = &v
		}
		h := decimal.NewFromInt(rapid.Int64Range(0, 50).Draw(t, "hysteresis"))
		r := Rule{Name: "r", Version: 1, Subject: "customer:c", Meter: "m", Thresholds: []Threshold{th},
			NotifyOn: []string{Triggered, Resolved}, HysteresisPercent: h}
		p := periods.Period{Start: time.Date(2026, 12, 1, 0, 0, 0, 0, time.UTC), End: time.Date(2027, 1, 1, 0, 0, 0, 0, time.UTC), Name: "2026-12-01"}
		s := state{stateKey: stateKey{rule: "r", subject: "customer:c", threshold: th.Key(), periodStart: p.Start}, period: p.Name, meter: "m", state: "ok"}
		ids := map[string]bool{}
		last := ""
		var crossed decimal.Decimal // the trigger's threshold.value
		now := p.Start.Add(time.Hour)
		for i, n := 0, rapid.IntRange(1, 60).Draw(t, "steps"); i < n; i++ {
			used := decimal.NewFromInt(rapid.Int64Range(-100, 1500).Draw(t, "used"))
			var limit *decimal.Decimal
			if rapid.IntRange(0, 9).Draw(t, "hasLimit") > 0 {
				l := decimal.NewFromInt(rapid.Int64Range(0, 1000).Draw(t, "limit"))
				limit = &l
			}
			u := quota.SubjectUsage{Subject: quota.Subject{Scope: "customer:c", Meter: "m"}, Period: p, Used: used, Limit: limit}
			now = now.Add(time.Second)
			tr, ok := decide(r, th, s, u, now)
			at, has := th.At(limit)
			if !ok {
				if s.state == Triggered && (!has || used.LessThan(at.Mul(decimal.NewFromInt(1).Sub(h.Div(decimal.NewFromInt(100)))))) {
					t.Fatalf("step %d: triggered with used %s, threshold %s, hysteresis %s%%: not resolved", i, used, at, h)
				}
				if s.state != Triggered && has && used.GreaterThanOrEqual(at) {
					t.Fatalf("step %d: ok with used %s ≥ threshold %s: not triggered", i, used, at)
				}
				continue
			}
			ev := tr.event
			if ev == nil || tr.s.transitions != s.transitions+1 {
				t.Fatalf("step %d: transition %+v", i, tr)
			}
			switch ev.Type {
			case TypeTriggered:
				if last == TypeTriggered || !has || used.LessThan(at) {
					t.Fatalf("step %d: triggered after %q with used %s, threshold %s (%v)", i, last, used, at, has)
				}
				crossed = ev.Threshold.Value
			case TypeResolved:
				if last != TypeTriggered {
					t.Fatalf("step %d: resolved after %q", i, last)
				}
				if has && !used.LessThan(at.Mul(decimal.NewFromInt(1).Sub(h.Div(decimal.NewFromInt(100))))) {
					t.Fatalf("step %d: resolved at used %s, threshold %s, hysteresis %s%%", i, used, at, h)
				}
				if !ev.Threshold.Value.Equal(crossed) {
					t.Fatalf("step %d: resolved with threshold.value %s, triggered with %s", i, ev.Threshold.Value, crossed)
				}
			}
			if ids[ev.ID.String()] || ev.ID != EventID("r", "customer:c", th.Key(), p.Name, tr.s.transitions) {
				t.Fatalf("step %d: id %s repeated or not derived", i, ev.ID)
			}
			ids[ev.ID.String()] = true
			last, s = ev.Type, tr.s
		}
	})
}
