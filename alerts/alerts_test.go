package alerts_test

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/shopspring/decimal"

	"github.com/tally-ledger/tally/alerts"
	"github.com/tally-ledger/tally/amount"
	"github.com/tally-ledger/tally/ledger"
	"github.com/tally-ledger/tally/periods"
	"github.com/tally-ledger/tally/pools"
	"github.com/tally-ledger/tally/quota"
)

// check asserts what a webhook consumer relies on: every stored event was
// delivered, each delivery verifies with secret, a repeated id carries
// the same body, events arrive in order per subject, and per (subject,
// threshold, period) triggered and resolved alternate, starting with
// triggered.
func check(t *testing.T, e *env, r *receiver, secret string) []alerts.Event {
	t.Helper()
	stored := e.stored()
	got := r.delivered()
	bodies := map[string]string{}
	for _, q := range r.all() { // answered or not: every request the receiver saw
		if err := alerts.Verify(secret, q.sig, q.body, q.at, time.Minute); err != nil {
			t.Errorf("event %s: %v", q.id, err)
		}
		if b, ok := bodies[q.id]; ok && b != string(q.body) {
			t.Errorf("event %s sent twice with different bodies:\n%s\n%s", q.id, b, q.body)
		}
		bodies[q.id] = string(q.body)
	}
	delivered := map[string]bool{}
	for _, q := range got {
		delivered[q.id] = true
	}
	events := eventsOf(t, got)
	perSubject := map[string][]string{}
	for _, ev := range events {
		s := perSubject[ev.Subject]
		if n := len(s); n == 0 || s[n-1] != ev.ID.String() {
			perSubject[ev.Subject] = append(s, ev.ID.String())
		}
	}
	want := map[string][]string{}
	for _, ev := range stored {
		want[ev.Subject] = append(want[ev.Subject], ev.ID.String())
		if !delivered[ev.ID.String()] {
			t.Errorf("event %s (%s %s %s) never delivered", ev.ID, ev.Type, ev.Subject, ev.Threshold.Value)
		}
	}
	for s, ids := range want {
		if !slices.Equal(perSubject[s], ids) {
			t.Errorf("subject %s: delivered in order %v, stored %v", s, perSubject[s], ids)
		}
	}
	last := map[string]string{}
	for _, ev := range stored {
		k := fmt.Sprintf("%s|%s|%s|%s", ev.Alert, ev.Subject, ev.Threshold.Value, ev.Period)
		if ev.Threshold.Percent != nil {
			k = fmt.Sprintf("%s|%s|p%s|%s", ev.Alert, ev.Subject, ev.Threshold.Percent, ev.Period)
		}
		if last[k] == ev.Type || last[k] == "" && ev.Type != alerts.TypeTriggered {
			t.Errorf("%s: %s after %q", k, ev.Type, last[k])
		}
		last[k] = ev.Type
	}
	return stored
}

func types(evs []alerts.Event) []string {
	var out []string
	for _, ev := range evs {
		th := "v" + ev.Threshold.Value.String()
		if ev.Threshold.Percent != nil {
			th = "p" + ev.Threshold.Percent.String()
		}
		s := ev.Type[len("alert."):] + " " + th
		if ev.Reason != "" {
			s += " " + ev.Reason
		}
		out = append(out, s)
	}
	return out
}

// TestTriggeredThenResolvedByACredit: 80% and 100% of the quota limit in
// force trigger in order, a credit resolves both (100% first), each event delivered
// signed to the webhook and to Kafka with its stable id.
func TestTriggeredThenResolvedByACredit(t *testing.T) {
	e := newEnv(t)
	rec := newReceiver(t)
	secret := e.webhook("billing", rec.url())
	e.quota("acme", "calls", 100)
	e.rule("acme-calls", `{"subject":"customer:acme","meter":"calls","thresholds":[{"percent":"100"},{"percent":"80"}],"endpoints":["billing"]}`)
	tl := e.start(startOptions{})
	e.use("acme", "calls", 85)
	waitFor(t, 5*time.Second, "80% triggered", func() bool { return len(rec.delivered()) >= 1 })
	e.use("acme", "calls", 20)
	waitFor(t, 5*time.Second, "100% triggered", func() bool { return len(rec.delivered()) >= 2 })
	e.adjust("acme", "calls", -60, time.Time{})
	waitFor(t, 5*time.Second, "both resolved", func() bool { return len(rec.delivered()) >= 4 })
	stored := check(t, e, rec, secret)
	// Resolved in one evaluation: 100% first, the reverse of how they were crossed.
	want := []string{"triggered p80", "triggered p100", "resolved p100 usage_decreased", "resolved p80 usage_decreased"}
	if got := types(stored); !slices.Equal(got, want) {
		t.Fatalf("events %v, want %v", got, want)
	}
	ev := stored[0]
	if ev.Customer != "acme" || ev.Period == "" || !ev.Used.Equal(decimal.NewFromInt(85)) || ev.Limit == nil ||
		!ev.Limit.Equal(decimal.NewFromInt(100)) || !ev.Threshold.Value.Equal(decimal.NewFromInt(80)) || ev.AsOf == nil || ev.LagSeconds == nil {
		t.Fatalf("first event %+v", ev)
	}
	if want := alerts.EventID("acme-calls", "customer:acme", "percent:80", ev.Period, 1); ev.ID != want {
		t.Fatalf("id %s, want the derived %s", ev.ID, want)
	}
	// The oldest-undelivered gauge is set once per dispatcher round, so
	// it reads 0 from the round after the last delivery: wait for all.
	wantMetrics := map[string]float64{
		`tally_alert_deliveries_total{kind="kafka",outcome="delivered"}`:   4,
		`tally_alert_events_total{type="alert.triggered"}`:                 2,
		`tally_alert_events_total{type="alert.resolved"}`:                  2,
		`tally_alert_deliveries_total{kind="webhook",outcome="delivered"}`: 4,
		`tally_alert_oldest_undelivered_seconds`:                           0,
	}
	for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(20 * time.Millisecond) {
		var off []string
		for name, want := range wantMetrics {
			if got := metric(tl.reg, name); got != want {
				off = append(off, fmt.Sprintf("%s = %v, want %v", name, got, want))
			}
		}
		if len(off) == 0 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("metrics after 10 s: %s", strings.Join(off, "; "))
		}
	}
	msgs := e.readKafka(t, len(stored))
	for i, m := range msgs {
		if string(m.Key) != "customer:acme/calls" || string(m.Value) != e.body(stored[i].ID.String()) {
			t.Fatalf("kafka message %d: key %q value %s", i, m.Key, m.Value)
		}
	}
}

// TestSeveralThresholdsAtOnceInOrder: thresholds crossed in one
// evaluation trigger lowest first; a credit taking usage below all of
// them resolves them highest first, the reverse of how they were crossed,
// and so does the end of their period (period_ended), whatever the order
// of the rule's thresholds or of their keys ("value:10" sorts before
// "value:8"). Deleting a rule resolves its thresholds in the same order.
func TestSeveralThresholdsAtOnceInOrder(t *testing.T) {
	e := newEnv(t)
	rec := newReceiver(t)
	secret := e.webhook("billing", rec.url())
	ctx := context.Background()
	e.daily("acme")
	e.rule("acme-calls", `{"subject":"customer:acme","meter":"calls","thresholds":[{"value":"9"},{"value":"10"},{"value":"8"}],"endpoints":["billing"]}`)
	// Yesterday, as in TestLateUsageIntoAClosedPeriodFiresNothingForIt.
	yesterday := e.clock().UTC().AddDate(0, 0, -1)
	e.streams.Use(t, "acme", "calls", yesterday, decimal.NewFromInt(12))
	e.skew.Store(int64(-24 * time.Hour)) // the evaluator looks at yesterday
	e.start(startOptions{})
	waitFor(t, 5*time.Second, "three triggered", func() bool { return len(e.stored()) == 3 })
	e.adjust("acme", "calls", -10, yesterday.Add(time.Minute))
	waitFor(t, 5*time.Second, "three resolved", func() bool { return len(e.stored()) == 6 })
	e.adjust("acme", "calls", 10, yesterday.Add(2*time.Minute))
	waitFor(t, 5*time.Second, "three triggered again", func() bool { return len(e.stored()) == 9 })
	e.skew.Store(0)
	waitFor(t, 5*time.Second, "period ended", func() bool { return len(e.stored()) == 12 })
	e.use("acme", "calls", 12) // today's period
	waitFor(t, 5*time.Second, "three triggered today", func() bool { return len(e.stored()) == 15 })
	if err := alerts.DeleteRule(ctx, e.pool, "acme-calls", "test", e.clock()); err != nil {
		t.Fatal(err)
	}
	waitFor(t, 5*time.Second, "resolved by the deletion", func() bool { return len(rec.delivered()) == 18 })
	stored := check(t, e, rec, secret)
	up := []string{"triggered v8", "triggered v9", "triggered v10"}
	want := slices.Concat(up,
		[]string{"resolved v10 usage_decreased", "resolved v9 usage_decreased", "resolved v8 usage_decreased"}, up,
		[]string{"resolved v10 period_ended", "resolved v9 period_ended", "resolved v8 period_ended"}, up,
		[]string{"resolved v10 rule_deleted", "resolved v9 rule_deleted", "resolved v8 rule_deleted"})
	if got := types(stored); !slices.Equal(got, want) {
		t.Fatalf("events\n%v\nwant\n%v", got, want)
	}
}

// TestPercentFollowsTheQuotaVersion: raising the limit resolves
// (limit_raised); lowering it again triggers anew; an alert rule version
// that moves the threshold resolves the old one (rule_changed).
func TestPercentFollowsTheQuotaVersion(t *testing.T) {
	e := newEnv(t)
	rec := newReceiver(t)
	secret := e.webhook("billing", rec.url())
	e.quota("acme", "calls", 100)
	e.rule("acme-calls", `{"subject":"customer:acme","meter":"calls","thresholds":[{"percent":"80"}],"endpoints":["billing"]}`)
	e.start(startOptions{})
	e.use("acme", "calls", 85)
	waitFor(t, 5*time.Second, "triggered", func() bool { return len(rec.delivered()) >= 1 })
	e.quota("acme", "calls", 200)
	waitFor(t, 5*time.Second, "resolved", func() bool { return len(rec.delivered()) >= 2 })
	e.quota("acme", "calls", 100)
	waitFor(t, 5*time.Second, "triggered again", func() bool { return len(rec.delivered()) >= 3 })
	e.rule("acme-calls", `{"subject":"customer:acme","meter":"calls","thresholds":[{"percent":"90"}],"endpoints":["billing"]}`)
	waitFor(t, 5*time.Second, "moved", func() bool { return len(rec.delivered()) >= 4 })
	stored := check(t, e, rec, secret)
	want := []string{"triggered p80", "resolved p80 limit_raised", "triggered p80", "resolved p80 rule_changed"}
	if got := types(stored); !slices.Equal(got, want) {
		t.Fatalf("events %v, want %v", got, want)
	}
	if stored[2].ID != alerts.EventID("acme-calls", "customer:acme", "percent:80", stored[2].Period, 3) {
		t.Fatalf("third event id %s is not transition 3's", stored[2].ID)
	}
	// The limit_raised resolution says the usage the threshold stood for
	// when it was crossed (80% of 100), as its trigger did, beside the
	// limit in force now.
	trig, res := stored[0], stored[1]
	if !trig.Threshold.Value.Equal(decimal.NewFromInt(80)) || !res.Threshold.Value.Equal(trig.Threshold.Value) {
		t.Errorf("threshold.value %s when triggered, %s when resolved; want 80 both (80%% of the limit it was crossed under)",
			trig.Threshold.Value, res.Threshold.Value)
	}
	if res.Limit == nil || !res.Limit.Equal(decimal.NewFromInt(200)) {
		t.Errorf("resolution's limit %v, want the 200 in force", res.Limit)
	}
	// 85 < 90: the new threshold stays ok.
	time.Sleep(500 * time.Millisecond)
	if n := len(e.stored()); n != 4 {
		t.Fatalf("%d events after the rule change, want 4", n)
	}
	// Without a quota rule in force, the GET status says so.
	r, err := alerts.GetRule(context.Background(), e.pool, "acme-calls")
	if err != nil {
		t.Fatal(err)
	}
	st, err := alerts.Status(context.Background(), e.pool, r, ingestTopic, e.clock())
	if err != nil || len(st) != 1 || st[0].State != "ok" || st[0].At == nil || !st[0].At.Equal(decimal.NewFromInt(90)) {
		t.Fatalf("status %+v, %v", st, err)
	}
}

// TestRapidCrossingNeverTriggersTwice: usage crossing a threshold up and
// down faster than the evaluator looks gives alternating events, never two
// triggered in a row; hysteresis keeps a dip just below from resolving.
func TestRapidCrossingNeverTriggersTwice(t *testing.T) {
	e := newEnv(t)
	rec := newReceiver(t)
	secret := e.webhook("billing", rec.url())
	e.rule("flap", `{"subject":"customers","meter":"calls","thresholds":[{"value":"100"}],"hysteresis_percent":"10","endpoints":["billing"]}`)
	e.start(startOptions{})
	// One crossing each way at the evaluator's pace first: under load the
	// evaluator may see none of the flapping's states below the threshold,
	// and the check below needs at least a trigger and a resolution.
	e.use("acme", "calls", 100)
	waitFor(t, 10*time.Second, "triggered", func() bool { return len(e.stored()) == 1 })
	e.adjust("acme", "calls", -95, time.Time{}) // 5
	waitFor(t, 10*time.Second, "resolved", func() bool { return len(e.stored()) == 2 })
	for i := 0; i < 30; i++ {
		e.use("acme", "calls", 100)
		if i%3 == 0 {
			time.Sleep(120 * time.Millisecond)
		}
		e.adjust("acme", "calls", -95, time.Time{}) // 5 left: below 90
		e.use("globex", "calls", 100)
		e.adjust("globex", "calls", -5, time.Time{}) // 95: within the hysteresis
		e.adjust("globex", "calls", -95, time.Time{})
	}
	time.Sleep(time.Second)
	waitFor(t, 10*time.Second, "deliveries", func() bool { return len(rec.delivered()) >= len(e.stored()) })
	stored := check(t, e, rec, secret)
	if len(stored) < 2 {
		t.Fatalf("only %d events: %v", len(stored), types(stored))
	}
	// Slowly, for one customer: a dip to 95 stays within the hysteresis
	// (resolves below 90); 85 resolves.
	before := len(stored)
	e.use("initech", "calls", 100)
	waitFor(t, 5*time.Second, "triggered", func() bool { return len(e.stored()) == before+1 })
	e.adjust("initech", "calls", -5, time.Time{})
	time.Sleep(600 * time.Millisecond)
	if n := len(e.stored()); n != before+1 {
		t.Fatalf("a dip within the hysteresis resolved: %v", types(e.stored()[before:]))
	}
	e.adjust("initech", "calls", -10, time.Time{})
	waitFor(t, 5*time.Second, "resolved", func() bool { return len(e.stored()) == before+2 })
	last := e.stored()[before+1]
	if last.Type != alerts.TypeResolved || !last.Used.Equal(decimal.NewFromInt(85)) || last.Reason != alerts.ReasonCredited {
		t.Fatalf("resolution %+v", last)
	}
}

// TestReceiverTroubleLosesNothing: the receiver refuses connections,
// answers 500, and hangs past the timeout while transitions keep coming:
// every event arrives, in order per subject, signed, duplicates only with
// the same id; then a failed delivery is redelivered on request.
func TestReceiverTroubleLosesNothing(t *testing.T) {
	e := newEnv(t)
	rec := newReceiver(t)
	secret := e.webhook("billing", rec.url())
	e.rule("calls", `{"subject":"customers","meter":"calls","thresholds":[{"value":"10"},{"value":"20"}],"endpoints":["billing"]}`)
	e.start(startOptions{})
	step := func() {
		for _, c := range []string{"acme", "globex"} {
			e.use(c, "calls", 25)
			time.Sleep(150 * time.Millisecond)
			e.adjust(c, "calls", -25, time.Time{})
			time.Sleep(150 * time.Millisecond)
		}
	}
	rec.down()
	step()
	time.Sleep(500 * time.Millisecond)
	rec.up()
	rec.mode.Store("500")
	step()
	time.Sleep(500 * time.Millisecond)
	// While every request hangs past the timeout, transitions are still
	// written as they happen: the evaluator never waits for a receiver.
	rec.mode.Store("hang")
	before := len(e.stored())
	e.use("acme", "calls", 25)
	waitFor(t, 2*time.Second, "transitions while the receiver hangs", func() bool { return len(e.stored()) >= before+2 })
	e.adjust("acme", "calls", -25, time.Time{})
	waitFor(t, 2*time.Second, "resolutions while the receiver hangs", func() bool { return len(e.stored()) >= before+4 })
	step()
	time.Sleep(time.Second)
	rec.mode.Store("ok")
	waitFor(t, 20*time.Second, "every event delivered", func() bool {
		seen := map[string]bool{}
		for _, q := range rec.delivered() {
			seen[q.id] = true
		}
		return len(seen) == len(e.stored())
	})
	stored := check(t, e, rec, secret)
	if len(stored) < 8 {
		t.Fatalf("%d events", len(stored))
	}
	failures := 0
	for _, q := range rec.all() {
		if q.status < 200 || q.status > 299 {
			failures++
		}
	}
	if failures == 0 {
		t.Fatal("the receiver never refused a request: the test proves nothing")
	}
}

// TestCrashBetweenCommitAndDelivery: transitions committed by a process
// that dies before delivering are delivered by the next leader, once
// each, with the ids the first derived; the next leader repeats no
// transition.
func TestCrashBetweenCommitAndDelivery(t *testing.T) {
	e := newEnv(t)
	rec := newReceiver(t)
	secret := e.webhook("billing", rec.url())
	e.quota("acme", "calls", 100)
	e.rule("acme-calls", `{"subject":"customer:acme","meter":"calls","thresholds":[{"percent":"80"},{"percent":"100"}],"endpoints":["billing"]}`)
	first := e.start(startOptions{noDispatcher: true, holder: "first"})
	e.use("acme", "calls", 120)
	waitFor(t, 5*time.Second, "two transitions", func() bool { return len(e.stored()) == 2 })
	first.stop()
	if n := len(rec.all()); n != 0 {
		t.Fatalf("%d requests before any dispatcher ran", n)
	}
	e.start(startOptions{holder: "second"})
	waitFor(t, 10*time.Second, "delivered", func() bool { return len(rec.delivered()) >= 2 })
	time.Sleep(time.Second)
	stored := check(t, e, rec, secret)
	if got := types(stored); !slices.Equal(got, []string{"triggered p80", "triggered p100"}) {
		t.Fatalf("events %v", got)
	}
	if n := len(rec.delivered()); n != 2 {
		t.Fatalf("%d deliveries, want 2", n)
	}
}

// TestFailedDeliveryIsListedAndRedelivered: a receiver that answers 500
// past the retry window leaves the delivery failed; redelivery sends the
// same event again, with the same id.
func TestFailedDeliveryIsListedAndRedelivered(t *testing.T) {
	e := newEnv(t)
	rec := newReceiver(t)
	secret := e.webhook("billing", rec.url())
	e.rule("big", `{"subject":"customer:acme","meter":"calls","thresholds":[{"value":"10"}],"notify_on":["triggered"],"endpoints":["billing"]}`)
	rec.mode.Store("500")
	e.start(startOptions{retryFor: time.Second})
	e.use("acme", "calls", 11)
	ctx := context.Background()
	var failed []alerts.StoredEvent
	waitFor(t, 10*time.Second, "failed", func() bool {
		var err error
		failed, err = alerts.Events(ctx, e.pool, alerts.EventFilter{State: "failed", Limit: 10})
		return err == nil && len(failed) == 1 && len(failed[0].Deliveries) == 2 &&
			slices.ContainsFunc(failed[0].Deliveries, func(d alerts.Delivery) bool { return d.Endpoint == "billing" && d.State == "failed" })
	})
	attempts := len(rec.all())
	if attempts < 2 {
		t.Fatalf("%d attempts before failing", attempts)
	}
	rec.mode.Store("ok")
	stored := e.stored()
	n, err := alerts.Redeliver(ctx, e.pool, stored[0].ID, time.Hour)
	if err != nil || n != 1 {
		t.Fatalf("redeliver: %d, %v", n, err)
	}
	waitFor(t, 5*time.Second, "redelivered", func() bool { return len(rec.delivered()) == 1 })
	check(t, e, rec, secret)
	if _, err := alerts.Redeliver(ctx, e.pool, uuid.New(), time.Hour); !errors.Is(err, alerts.ErrNotFound) {
		t.Fatalf("redeliver of an unknown event: %v", err)
	}
}

// TestRedeliveryStartsTheBackoffAgain: a delivery redelivered after it
// failed for good is retried after 1 s, 2 s, 4 s … again, not after the
// hour its attempts before had reached, while its attempts still count
// every attempt made.
func TestRedeliveryStartsTheBackoffAgain(t *testing.T) {
	e := newEnv(t)
	rec := newReceiver(t)
	e.webhook("billing", rec.url())
	e.rule("big", `{"subject":"customer:acme","meter":"calls","thresholds":[{"value":"10"}],"notify_on":["triggered"],"endpoints":["billing"]}`)
	rec.mode.Store("500")
	e.start(startOptions{noDispatcher: true, retryFor: time.Second})
	// Fast retries until the second's window ends: many attempts.
	fast := e.dispatch(alerts.DispatcherConfig{Timeout: 500 * time.Millisecond, Claim: 2 * time.Second,
		Poll: 20 * time.Millisecond, BackoffBase: 5 * time.Millisecond, BackoffMax: time.Hour})
	e.use("acme", "calls", 11)
	ctx := context.Background()
	billing := func() alerts.Delivery {
		evs, err := alerts.Events(ctx, e.pool, alerts.EventFilter{Limit: 10})
		if err != nil || len(evs) != 1 {
			t.Fatalf("events %v: %v", evs, err)
		}
		i := slices.IndexFunc(evs[0].Deliveries, func(d alerts.Delivery) bool { return d.Endpoint == "billing" })
		return evs[0].Deliveries[i]
	}
	waitFor(t, 10*time.Second, "an event", func() bool { return len(e.stored()) == 1 })
	waitFor(t, 10*time.Second, "failed", func() bool { return billing().State == "failed" })
	fast()
	before := billing().Attempts
	if before < 6 {
		t.Fatalf("%d attempts before failing: the test proves nothing", before)
	}
	// The receiver is still broken: the redelivery's first attempt fails,
	// under the operator's schedule (1 s, at most 1 h).
	if n, err := alerts.Redeliver(ctx, e.pool, e.stored()[0].ID, time.Hour); err != nil || n != 1 {
		t.Fatalf("redeliver: %d, %v", n, err)
	}
	e.dispatch(alerts.DispatcherConfig{Timeout: 500 * time.Millisecond, Claim: 2 * time.Second, Poll: 20 * time.Millisecond})
	var d alerts.Delivery
	waitFor(t, 10*time.Second, "the redelivery's first attempt", func() bool { d = billing(); return d.Attempts > before })
	if d.State != "pending" || d.Attempts != before+1 || d.NextAttemptAt == nil || d.LastAttemptAt == nil {
		t.Fatalf("after the redelivery's first attempt (%d before): %+v", before, d)
	}
	if wait := d.NextAttemptAt.Sub(*d.LastAttemptAt); wait < alerts.DefaultBackoffBase/2 || wait > alerts.DefaultBackoffBase {
		t.Fatalf("the redelivery's second attempt is due %v after its first, want 0.5–1 s (the backoff from the start)", wait)
	}
}

// TestLateUsageIntoAClosedPeriodFiresNothingForIt: a daily customer's
// period that ended resolves (period_ended) and never fires again; late
// usage for it, booked into the open period once it is closed, counts
// there.
func TestLateUsageIntoAClosedPeriodFiresNothingForIt(t *testing.T) {
	e := newEnv(t)
	rec := newReceiver(t)
	secret := e.webhook("billing", rec.url())
	ctx := context.Background()
	e.daily("acme")
	e.rule("daily", `{"subject":"customer:acme","meter":"calls","thresholds":[{"value":"10"}],"endpoints":["billing"]}`)
	// Yesterday at this time of day, so that the evaluator, set a day
	// back, sees it as now; the test's usage goes up to two minutes later,
	// still yesterday (Tally's clock is at noon: env.shift).
	yesterday := e.clock().UTC().AddDate(0, 0, -1)
	e.streams.Use(t, "acme", "calls", yesterday, decimal.NewFromInt(11))
	e.skew.Store(int64(-24 * time.Hour)) // the evaluator looks at yesterday
	e.start(startOptions{})
	waitFor(t, 5*time.Second, "triggered yesterday", func() bool { return len(rec.delivered()) == 1 })
	e.streams.Use(t, "acme", "calls", yesterday.Add(30*time.Second), decimal.NewFromInt(3)) // still triggered: no event
	time.Sleep(300 * time.Millisecond)
	e.skew.Store(0)
	waitFor(t, 5*time.Second, "period ended", func() bool { return len(rec.delivered()) == 2 })
	if ended := e.stored()[1]; !ended.Used.Equal(decimal.NewFromInt(14)) || ended.AsOf == nil {
		t.Fatalf("period_ended event: used %s (want the ended period's 14), as_of %v", ended.Used, ended.AsOf)
	}
	// Late usage while yesterday is in grace stays in yesterday: nothing fires.
	e.streams.Use(t, "acme", "calls", yesterday.Add(time.Minute), decimal.NewFromInt(5))
	time.Sleep(time.Second)
	if n := len(e.stored()); n != 2 {
		t.Fatalf("%d events after late usage in grace, want 2: %v", n, types(e.stored()))
	}
	// Closed, it is absorbed by today's period, where it counts.
	err := pgx.BeginFunc(ctx, e.pool, func(tx pgx.Tx) error {
		_, err := e.periods().Close(ctx, tx, periods.CloseRequest{Customer: "acme", Period: "previous", Force: true, Reason: "test", Actor: "test"})
		return err
	})
	if err != nil {
		t.Fatal(err)
	}
	res := e.adjust("acme", "calls", 12, yesterday.Add(2*time.Minute))
	if res.PriorPeriod == nil {
		t.Fatalf("the late adjustment was not a prior-period adjustment: %+v", res)
	}
	waitFor(t, 5*time.Second, "today's trigger", func() bool { return len(rec.delivered()) == 3 })
	stored := check(t, e, rec, secret)
	today := e.clock().UTC().Format(time.DateOnly)
	if got := types(stored); !slices.Equal(got, []string{"triggered v10", "resolved v10 period_ended", "triggered v10"}) ||
		stored[0].Period == today || stored[1].Period != stored[0].Period || stored[2].Period != today {
		t.Fatalf("events %v in periods %s %s %s", got, stored[0].Period, stored[1].Period, stored[2].Period)
	}
}

// TestPoolAndGlobalSubjects: a pool's usage is its members' (as the
// enforcer counts it), the global scope's everyone's, and a pool's
// percent threshold follows the pool's rule in force.
func TestPoolAndGlobalSubjects(t *testing.T) {
	e := newEnv(t)
	rec := newReceiver(t)
	secret := e.webhook("billing", rec.url())
	ctx := context.Background()
	err := pgx.BeginFunc(ctx, e.pool, func(tx pgx.Tx) error {
		_, err := pools.PutTx(ctx, tx, pools.PutInput{Name: "team", Members: []string{"acme", "globex"}, Actor: "t"}, e.clock().Add(-time.Hour))
		return err
	})
	if err != nil {
		t.Fatal(err)
	}
	err = pgx.BeginFunc(ctx, e.pool, func(tx pgx.Tx) error {
		_, err := quota.PutScopeRuleAt(ctx, tx, quota.ScopeRuleInput{Scope: "pool:team", Meter: "calls", Limit: decimal.NewFromInt(100), Actor: "t"}, e.clock())
		return err
	})
	if err != nil {
		t.Fatal(err)
	}
	e.rule("team", `{"subject":"pool:team","meter":"calls","thresholds":[{"percent":"50"}],"endpoints":["billing"]}`)
	e.rule("all", `{"subject":"global","meter":"calls","thresholds":[{"value":"70"}],"endpoints":["billing"]}`)
	e.start(startOptions{})
	e.use("acme", "calls", 30)
	e.use("initech", "calls", 30) // not in the pool
	time.Sleep(500 * time.Millisecond)
	if n := len(e.stored()); n != 0 {
		t.Fatalf("%d events at 30 in the pool and 60 in all: %v", n, types(e.stored()))
	}
	e.use("globex", "calls", 25) // the pool: 55 ≥ 50; everyone: 85 ≥ 70
	waitFor(t, 5*time.Second, "both triggered", func() bool { return len(rec.delivered()) == 2 })
	stored := check(t, e, rec, secret)
	subjects := []string{stored[0].Subject + " " + stored[0].Used.String(), stored[1].Subject + " " + stored[1].Used.String()}
	slices.Sort(subjects)
	if !slices.Equal(subjects, []string{"global 85", "pool:team 55"}) {
		t.Fatalf("events for %v", subjects)
	}
}

// TestPercentOfAGaugeRule: a percent threshold of a lagged rule on a gauge
// is of the rule's limit on the period's max level (docs/design.md §16),
// read through quota.UsageOf like a counter's.
func TestPercentOfAGaugeRule(t *testing.T) {
	e := newEnv(t)
	ctx := context.Background()
	rec := newReceiver(t)
	e.webhook("billing", rec.url())
	if err := pgx.BeginFunc(ctx, e.pool, func(tx pgx.Tx) error {
		_, err := ledger.DeclareMeter(ctx, tx, ledger.Meter{Meter: "seats", Kind: ledger.Gauge}, e.clock())
		return err
	}); err != nil {
		t.Fatal(err)
	}
	e.quota("acme", "seats", 10)
	e.rule("acme-seats", `{"subject":"customer:acme","meter":"seats","thresholds":[{"percent":"80"}],"endpoints":["billing"]}`)
	e.start(startOptions{})
	for i, v := range []string{"5", "9", "2"} {
		r := ledger.Record{OperationID: uuid.New(), Seq: int64(i + 1), OccurredAt: e.clock().Add(-time.Second),
			Stream: ledger.StreamKey{Producer: "p", Epoch: 1, Customer: "acme", Meter: "seats"}, Shape: ledger.Gauge, Level: amount.MustParse(v)}
		if err := pgx.BeginFunc(ctx, e.pool, func(tx pgx.Tx) error {
			_, err := e.led.Apply(ctx, tx, []ledger.Record{r})
			return err
		}); err != nil {
			t.Fatal(err)
		}
		if i == 0 {
			time.Sleep(300 * time.Millisecond)
			if n := len(rec.delivered()); n != 0 {
				t.Fatalf("%d events at 5 of 10 seats", n)
			}
		}
	}
	waitFor(t, 5*time.Second, "triggered at a peak of 9", func() bool { return len(rec.delivered()) >= 1 })
	ev := eventsOf(t, rec.delivered())[0]
	if ev.Type != "alert.triggered" || !ev.Used.Equal(decimal.NewFromInt(9)) || ev.Limit == nil || !ev.Limit.Equal(decimal.NewFromInt(10)) {
		t.Fatalf("event %+v", ev)
	}
	// The level fell to 2, the period's peak stays 9: no resolved event.
	time.Sleep(300 * time.Millisecond)
	if n := len(rec.delivered()); n != 1 {
		t.Fatalf("%d events after the level fell", n)
	}
}

// A resolution says what the threshold stood for and the usage when it was
// decided: a threshold resolved because a rule version moved it carries
// the usage of that evaluation (with its as_of), and one resolved because
// no limit is in force any more (the quota became a rate) the usage its
// percent stood for under the limit it was crossed at, not 0.
func TestResolutionsSayWhatTheyStoodFor(t *testing.T) {
	e := newEnv(t)
	rec := newReceiver(t)
	e.webhook("billing", rec.url())
	e.quota("acme", "calls", 100)
	e.rule("acme-calls", `{"subject":"customer:acme","meter":"calls","thresholds":[{"percent":"75"}],"endpoints":["billing"]}`)
	e.start(startOptions{})
	e.use("acme", "calls", 80)
	waitFor(t, 5*time.Second, "triggered", func() bool { return len(rec.delivered()) >= 1 })
	e.use("acme", "calls", 10)
	time.Sleep(300 * time.Millisecond) // evaluated at 90
	e.rule("acme-calls", `{"subject":"customer:acme","meter":"calls","thresholds":[{"percent":"50"}],"endpoints":["billing"]}`)
	waitFor(t, 5*time.Second, "moved", func() bool { return len(rec.delivered()) >= 3 })
	if _, err := quota.PutRuleDBClock(context.Background(), e.pool, quota.RuleInput{Customer: "acme", Meter: "calls", Actor: "test",
		Rate:      &quota.Rate{Amount: decimal.NewFromInt(100), Per: quota.DurationText(time.Second), Burst: decimal.NewFromInt(200)},
		Admission: quota.Exact}, e.clock); err != nil {
		t.Fatal(err)
	}
	waitFor(t, 5*time.Second, "no limit", func() bool { return len(rec.delivered()) >= 4 })
	evs := eventsOf(t, rec.delivered())
	if got := types(evs); !slices.Equal(got, []string{"triggered p75", "resolved p75 rule_changed", "triggered p50", "resolved p50 no_limit_in_force"}) {
		t.Fatalf("events %v", got)
	}
	if ev := evs[1]; !ev.Used.Equal(decimal.NewFromInt(90)) || ev.AsOf == nil {
		t.Errorf("resolved by the rule change: used %s, as_of %v; want 90 and the evaluation's as_of", ev.Used, ev.AsOf)
	}
	if ev := evs[3]; !ev.Threshold.Value.Equal(decimal.NewFromInt(50)) {
		t.Errorf("resolved with no limit in force: threshold %+v, want value 50 (50%% of 100)", ev.Threshold)
	}
}

// TestMeterChangeWhileTriggeredFiresOnce: a rule version that moves a
// triggered threshold to another meter resolves it on the old meter
// (rule_changed) and triggers it once on the new one, which stays
// triggered while its usage does; deleting the rule then resolves it on
// the meter it was triggered on.
func TestMeterChangeWhileTriggeredFiresOnce(t *testing.T) {
	e := newEnv(t)
	rec := newReceiver(t)
	secret := e.webhook("billing", rec.url())
	e.rule("acme-usage", `{"subject":"customer:acme","meter":"calls","thresholds":[{"value":"10"}],"endpoints":["billing"]}`)
	e.start(startOptions{})
	e.use("acme", "calls", 20)
	e.use("acme", "bytes", 20)
	waitFor(t, 5*time.Second, "triggered on calls", func() bool { return len(e.stored()) == 1 })
	e.rule("acme-usage", `{"subject":"customer:acme","meter":"bytes","thresholds":[{"value":"10"}],"endpoints":["billing"]}`)
	waitFor(t, 5*time.Second, "moved to bytes", func() bool { return len(e.stored()) >= 3 })
	time.Sleep(time.Second) // evaluated again and again at 20 bytes
	if got := types(e.stored()); !slices.Equal(got, []string{"triggered v10", "resolved v10 rule_changed", "triggered v10"}) {
		t.Fatalf("events after the meter changed, with usage steady: %v", got)
	}
	if err := alerts.DeleteRule(context.Background(), e.pool, "acme-usage", "test", e.clock()); err != nil {
		t.Fatal(err)
	}
	waitFor(t, 5*time.Second, "resolved by the deletion", func() bool { return len(rec.delivered()) == 4 })
	stored := check(t, e, rec, secret)
	var meters []string
	for _, ev := range stored {
		meters = append(meters, ev.Meter)
	}
	if want := []string{"calls", "calls", "bytes", "bytes"}; !slices.Equal(meters, want) {
		t.Fatalf("events %v on meters %v, want %v", types(stored), meters, want)
	}
}

// TestDeliveryTimesAreTheDatabases: an evaluator whose clock is an hour
// ahead of the database's writes deliveries the dispatcher attempts at
// once, each given up RetryFor after the database wrote it, their latency
// measured by the database's clock; the event occurred at the evaluator's
// instant.
func TestDeliveryTimesAreTheDatabases(t *testing.T) {
	e := newEnv(t)
	rec := newReceiver(t)
	secret := e.webhook("billing", rec.url())
	ctx := context.Background()
	// A month from an anchor two weeks away: Tally's noon and the
	// evaluator's hour ahead of the machine fall in one period whatever
	// the day.
	anchor := (time.Now().UTC().Day()+13)%28 + 1
	if _, _, err := e.periods().SetCalendar(ctx, e.pool, "acme", periods.Calendar{Cadence: periods.Monthly, AnchorDay: anchor}); err != nil {
		t.Fatal(err)
	}
	e.rule("big", `{"subject":"customer:acme","meter":"calls","thresholds":[{"value":"10"}],"notify_on":["triggered"],"endpoints":["billing"]}`)
	e.skew.Store(int64(-e.shift + time.Hour)) // the machine's clock, an hour ahead
	before := e.dbNow()
	tl := e.start(startOptions{})
	e.use("acme", "calls", 11)
	waitFor(t, 10*time.Second, "the event delivered to the webhook", func() bool { return len(rec.delivered()) == 1 })
	waitFor(t, 10*time.Second, "both deliveries recorded", func() bool {
		n, _, _ := histogram(tl.reg, "tally_alert_delivery_seconds")
		return n == 2
	})
	after := e.dbNow()
	if _, sum, _ := histogram(tl.reg, "tally_alert_delivery_seconds"); sum < 0 || sum > 2*after.Sub(before).Seconds() {
		t.Errorf("tally_alert_delivery_seconds: %v s in all for two deliveries made within %v", sum, after.Sub(before))
	}
	check(t, e, rec, secret)
	if ev := e.stored()[0]; ev.OccurredAt.Before(before.Add(time.Hour)) {
		t.Errorf("the event occurred at %v, before the evaluator's instant (an hour after %v)", ev.OccurredAt, before)
	}
	rows, err := e.pool.Query(ctx, `SELECT endpoint, created_at, next_attempt_at, give_up_at FROM alert_deliveries ORDER BY endpoint`)
	if err != nil {
		t.Fatal(err)
	}
	type times struct{ created, next, giveUp time.Time }
	got := map[string]times{}
	for rows.Next() {
		var endpoint string
		var d times
		if err := rows.Scan(&endpoint, &d.created, &d.next, &d.giveUp); err != nil {
			t.Fatal(err)
		}
		got[endpoint] = d
	}
	if err := rows.Err(); err != nil {
		t.Fatal(err)
	}
	if len(got) != 2 {
		t.Fatalf("deliveries %v, want billing's and kafka's", got)
	}
	for endpoint, d := range got {
		if d.created.Before(before) || d.created.After(after) || !d.next.Equal(d.created) || !d.giveUp.Equal(d.created.Add(alerts.DefaultRetryFor)) {
			t.Errorf("%s: created %v, next attempt %v, given up %v; want created by the database's clock (%v to %v), due then, given up %v later",
				endpoint, d.created, d.next, d.giveUp, before, after, alerts.DefaultRetryFor)
		}
	}
}
