package quota_test

import (
	"context"
	"slices"
	"testing"
	"time"

	"github.com/tally-ledger/tally/quota"
)

// The decision's fields, exactly.
var decisionFields = []string{"customer", "meter", "period", "state", "used", "limit", "remaining", "as_of",
	"lag_seconds", "projected", "rule_version", "mode", "on_stale", "stale_after", "decided_at", "leader_epoch", "seq"}

func TestEnforcerAcrossWarnAndLimit(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	e.follow()
	e.put(quota.RuleInput{Customer: "acme", Meter: "api_calls", Limit: dec("100")})
	e.use("acme", "api_calls", 50)
	rd := e.reader()
	enf := e.start(e.config("a"))

	d := rd.until(10*time.Second, "ok at 50", func(d received) bool { return d.State == quota.OK })
	if d.key != "acme/api_calls" || !d.Used.Equal(dec("50")) || !d.Remaining.Equal(dec("50")) || !d.Limit.Equal(dec("100")) ||
		d.RuleVersion != 1 || d.Mode != quota.Enforce || d.OnStale != quota.Allow || time.Duration(d.StaleAfter) != 5*time.Minute {
		t.Fatalf("first decision: %+v", d.Decision)
	}
	var keys []string
	for k := range d.fields {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	want := slices.Clone(decisionFields)
	slices.Sort(want)
	if !slices.Equal(keys, want) {
		t.Errorf("decision fields %v, want %v", keys, want)
	}
	if string(d.fields["used"]) != `"50"` || string(d.fields["limit"]) != `"100"` {
		t.Errorf("quantities are not decimal strings: used=%s limit=%s", d.fields["used"], d.fields["limit"])
	}
	if d.AsOf == nil || d.LagSeconds == nil || d.LagSeconds.Duration() > 2*time.Second || d.Stale(e.now()) {
		t.Errorf("fresh decision has as_of %v lag %v", d.AsOf, d.LagSeconds)
	}

	e.use("acme", "api_calls", 30) // 80 = warn_at 0.8 × 100
	d = rd.until(10*time.Second, "warning at 80", func(d received) bool { return d.State != quota.OK })
	if d.State != quota.Warning || !d.Used.Equal(dec("80")) || !d.Remaining.Equal(dec("20")) {
		t.Fatalf("after 80: %+v", d.Decision)
	}
	e.use("acme", "api_calls", 25) // 105 > 100
	d = rd.until(10*time.Second, "exceeded at 105", func(d received) bool { return d.State != quota.Warning })
	if d.State != quota.Exceeded || !d.Used.Equal(dec("105")) || !d.Remaining.IsZero() || !d.Blocks(e.now()) {
		t.Fatalf("after 105: %+v", d.Decision)
	}
	// Unchanged state is republished every Republish (2s here), not every loop.
	d2 := rd.until(5*time.Second, "republish", func(received) bool { return true })
	if d2.State != quota.Exceeded || d2.DecidedAt.Sub(d.DecidedAt) < 2*time.Second-100*time.Millisecond {
		t.Errorf("republished %s after %v", d2.State, d2.DecidedAt.Sub(d.DecidedAt))
	}

	// REST view: live usage and the last published decision.
	st, err := quota.StatusWith(context.Background(), e.pool, "acme", quota.StatusOptions{Now: e.clock()})
	if err != nil {
		t.Fatal(err)
	}
	if len(st) != 1 || st[0].State != quota.Exceeded || !st[0].Used.Equal(dec("105")) || st[0].Decision == nil ||
		st[0].Decision.State != quota.Exceeded || st[0].AsOf == nil {
		t.Fatalf("status: %+v", st)
	}
	// The count goes up once Kafka has acknowledged the write, which may be
	// after the reader above has the decision.
	for deadline := time.Now().Add(5 * time.Second); enf.Metric("tally_quota_decisions_published_total", nil) < 4 && time.Now().Before(deadline); {
		time.Sleep(20 * time.Millisecond)
	}
	if enf.Metric("tally_quota_leader", nil) != 1 || enf.Metric("tally_quota_decisions_published_total", nil) < 4 {
		t.Errorf("metrics: leader %v published %v", enf.Metric("tally_quota_leader", nil), enf.Metric("tally_quota_decisions_published_total", nil))
	}
	// Usage admitted after the exceeded decision is overage.
	e.use("acme", "api_calls", 7)
	rd.until(5*time.Second, "used 112", func(d received) bool { return d.Used.Equal(dec("112")) })
	waitOverage(t, e, "acme", func(o quota.Overage) bool { return o.WhileExceeded.Equal(dec("7")) && o.OverLimit.Equal(dec("12")) })
}

func waitOverage(t *testing.T, e *env, customer string, ok func(quota.Overage) bool) quota.Overage {
	t.Helper()
	st, err := quota.StatusWith(context.Background(), e.pool, customer, quota.StatusOptions{Now: e.clock()})
	if err != nil || len(st) == 0 {
		t.Fatalf("status: %v %v", st, err)
	}
	var last []quota.Overage
	for deadline := time.Now().Add(5 * time.Second); time.Now().Before(deadline); time.Sleep(50 * time.Millisecond) {
		last, err = quota.Overages(context.Background(), e.pool, st[0].PeriodStart, customer)
		if err != nil {
			t.Fatal(err)
		}
		for _, o := range last {
			if ok(o) {
				return o
			}
		}
	}
	t.Fatalf("overage not as expected: %+v", last)
	return quota.Overage{}
}

func TestRuleChangesMidPeriod(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	e.follow()
	e.put(quota.RuleInput{Customer: "acme", Meter: "api_calls", Limit: dec("100")})
	e.use("acme", "api_calls", 60)
	rd := e.reader()
	e.start(e.config("a"))
	rd.until(10*time.Second, "ok v1", func(d received) bool { return d.State == quota.OK && d.RuleVersion == 1 })

	// Raise: still ok, published at once because the rule changed; usage not reset.
	e.put(quota.RuleInput{Customer: "acme", Meter: "api_calls", Limit: dec("200")})
	d := rd.until(5*time.Second, "v2", func(d received) bool { return d.RuleVersion == 2 })
	if d.State != quota.OK || !d.Used.Equal(dec("60")) || !d.Remaining.Equal(dec("140")) {
		t.Fatalf("raised: %+v", d.Decision)
	}
	// Lower below usage: exceeded at once, no fresh allowance.
	e.put(quota.RuleInput{Customer: "acme", Meter: "api_calls", Limit: dec("50")})
	d = rd.until(5*time.Second, "v3", func(d received) bool { return d.RuleVersion == 3 })
	if d.State != quota.Exceeded || !d.Used.Equal(dec("60")) || !d.Remaining.IsZero() {
		t.Fatalf("lowered below usage: %+v", d.Decision)
	}
	// Shadow: same state, says it would block but does not ask to.
	e.put(quota.RuleInput{Customer: "acme", Meter: "api_calls", Limit: dec("50"), Mode: quota.Shadow})
	d = rd.until(5*time.Second, "v4", func(d received) bool { return d.RuleVersion == 4 })
	if d.State != quota.Exceeded || d.Mode != quota.Shadow || d.Blocks(e.now()) {
		t.Fatalf("shadow: %+v", d.Decision)
	}
	e.use("acme", "api_calls", 5) // admitted under shadow: not enforcement overage
	rd.until(5*time.Second, "used 65", func(d received) bool { return d.Used.Equal(dec("65")) })
	// Shadow → enforce.
	e.put(quota.RuleInput{Customer: "acme", Meter: "api_calls", Limit: dec("50"), Mode: quota.Enforce})
	d = rd.until(5*time.Second, "v5", func(d received) bool { return d.RuleVersion == 5 })
	if d.State != quota.Exceeded || d.Mode != quota.Enforce || !d.Blocks(e.now()) || !d.Used.Equal(dec("65")) {
		t.Fatalf("enforce: %+v", d.Decision)
	}
	o := waitOverage(t, e, "acme", func(o quota.Overage) bool { return o.OverLimit.Equal(dec("15")) })
	if !o.WhileExceeded.IsZero() {
		t.Errorf("usage admitted in shadow mode counted as enforcement overage: %+v", o)
	}
}

func TestStalledIngestAndUnreadableLedger(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	e.put(quota.RuleInput{Customer: "acme", Meter: "api_calls", Limit: dec("1000"), StaleAfter: 30 * time.Second, OnStale: quota.Deny})
	e.position(e.now())
	// A steady 10 units per second of as_of time, then ingest stalls.
	rd := e.reader()
	enf := e.start(e.config("a"))
	var lastPosition time.Time
	for i := 0; i < 4; i++ {
		e.use("acme", "api_calls", 10)
		e.advance(time.Second)
		lastPosition = e.now()
		e.position(lastPosition)
		time.Sleep(120 * time.Millisecond)
	}
	// The decision that saw both the last usage and the last position: one
	// evaluated between them has used 40 and an older as_of, which the
	// stalled decisions below would then seem to move.
	first := rd.until(5*time.Second, "used 40 as of the last position", func(d received) bool {
		return d.Used.Equal(dec("40")) && d.AsOf != nil && !d.AsOf.Before(lastPosition.Truncate(time.Microsecond))
	})
	stalledAt := *first.AsOf

	// Ingest stalls: applied_through stops; time goes on. Lag grows, usage
	// never looks lower, projected adds rate × lag.
	var lags []time.Duration
	for i := 0; i < 3; i++ {
		e.advance(10 * time.Second) // past Republish: a decision is due
		d := rd.until(5*time.Second, "republish during stall", func(d received) bool { return d.DecidedAt.After(first.DecidedAt) })
		first = d
		if !d.AsOf.Equal(stalledAt) || !d.Used.Equal(dec("40")) {
			t.Fatalf("stalled decision moved as_of or usage: %+v", d.Decision)
		}
		lags = append(lags, d.LagSeconds.Duration())
		if !d.Projected.GreaterThan(d.Used) {
			t.Errorf("projected %s not above used %s with lag %v", d.Projected, d.Used, d.LagSeconds)
		}
	}
	if !(lags[0] < lags[1] && lags[1] < lags[2]) {
		t.Errorf("lag did not grow: %v", lags)
	}
	if !first.Stale(first.DecidedAt) || !first.Blocks(first.DecidedAt) {
		t.Errorf("lag %v > stale_after 30s but the decision is not stale/denying", first.LagSeconds)
	}
	if enf.Metric("tally_quota_lag_seconds", nil) < 30 {
		t.Errorf("lag metric %v", enf.Metric("tally_quota_lag_seconds", nil))
	}
	// Ingest resumes with the usage it had held back: admitted while stale.
	e.use("acme", "api_calls", 25)
	e.position(e.now())
	d := rd.until(5*time.Second, "fresh again", func(d received) bool { return d.Used.Equal(dec("65")) })
	if d.Stale(d.DecidedAt) {
		t.Errorf("caught-up decision still stale: lag %v", d.LagSeconds)
	}
	waitOverage(t, e, "acme", func(o quota.Overage) bool { return o.WhileStale.Equal(dec("25")) && o.WhileExceeded.IsZero() })

	// The ledger cannot be read: nothing fresh is published, failures are
	// counted, and the last decision ages into staleness for consumers.
	if _, err := e.pool.Exec(context.Background(), `ALTER TABLE rollups RENAME TO rollups_away`); err != nil {
		t.Fatal(err)
	}
	for deadline := time.Now().Add(5 * time.Second); enf.Metric("tally_quota_evaluation_failures_total", nil) < 3; time.Sleep(20 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatal("no evaluation failures counted")
		}
	}
	e.advance(time.Minute)
	if got, ok := rd.next(500 * time.Millisecond); ok {
		t.Fatalf("published while the ledger was unreadable: %+v", got.Decision)
	}
	if !d.Stale(e.now()) || !d.Blocks(e.now()) {
		t.Errorf("last decision not stale a minute later")
	}
	if _, err := e.pool.Exec(context.Background(), `ALTER TABLE rollups_away RENAME TO rollups`); err != nil {
		t.Fatal(err)
	}
	e.position(e.now())
	// The first decision after the rename may still be evaluated against
	// the position from before it (a minute old, so stale); what must come
	// is a fresh one, within the wait.
	d = rd.until(5*time.Second, "fresh after recovery", func(d received) bool {
		return d.Used.Equal(dec("65")) && !d.Stale(d.DecidedAt)
	})
	if !d.Used.Equal(dec("65")) || d.Stale(d.DecidedAt) {
		t.Errorf("after recovery: %+v", d.Decision)
	}
}

func TestLeaderTakeoverWithoutGapOrReset(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	e.follow()
	e.put(quota.RuleInput{Customer: "acme", Meter: "api_calls", Limit: dec("100")})
	e.put(quota.RuleInput{Customer: "beta", Meter: "api_calls", Limit: dec("10")})
	e.use("acme", "api_calls", 90)
	e.use("beta", "api_calls", 1)
	rd := e.reader()
	a := e.start(e.config("a"))
	lastAcme := rd.until(10*time.Second, "acme warning", func(d received) bool { return d.Customer == "acme" && d.State == quota.Warning })
	b := e.start(e.config("b"))
	time.Sleep(300 * time.Millisecond)
	if a.Metric("tally_quota_leader", nil) != 1 || b.Metric("tally_quota_leader", nil) != 0 {
		t.Fatalf("leaders: a=%v b=%v", a.Metric("tally_quota_leader", nil), b.Metric("tally_quota_leader", nil))
	}
	// Drain what a published, then kill it.
	for {
		d, ok := rd.next(300 * time.Millisecond)
		if !ok {
			break
		}
		if d.Customer == "acme" {
			lastAcme = d
		}
	}
	killed := time.Now()
	a.Stop(t)
	for deadline := time.Now().Add(5 * time.Second); b.Metric("tally_quota_leader", nil) != 1; time.Sleep(10 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatal("b did not take over")
		}
	}
	t.Logf("takeover after %v", time.Since(killed))
	// b starts from the stored decisions: it republishes them under its
	// epoch (the same states: no re-flap), and a state change is published
	// at once.
	e.use("acme", "api_calls", 15)
	d := rd.until(5*time.Second, "acme exceeded from b", func(d received) bool {
		if d.Customer == "acme" && d.State != quota.Exceeded && (d.State != lastAcme.State || d.LeaderEpoch != 2 || d.Seq <= lastAcme.Seq) {
			t.Errorf("acme decision after takeover: %+v (the last one before was %+v)", d.Decision, lastAcme.Decision)
		}
		return d.Customer == "acme" && d.State == quota.Exceeded
	})
	if !d.Used.Equal(dec("105")) || d.LeaderEpoch != 2 {
		t.Fatalf("acme exceeded after takeover: %+v", d.Decision)
	}
	// Without a gap: republishing continues on the previous cadence.
	var beta []received
	deadline := time.Now().Add(4500 * time.Millisecond)
	for time.Now().Before(deadline) {
		if d, ok := rd.next(time.Until(deadline)); ok && d.Customer == "beta" {
			beta = append(beta, d)
		}
	}
	if len(beta) < 2 {
		t.Fatalf("beta republished %d times in 4.5s after takeover, want ≥ 2 (Republish 2s)", len(beta))
	}
	for i := 1; i < len(beta); i++ {
		if gap := beta[i].DecidedAt.Sub(beta[i-1].DecidedAt); gap > 2500*time.Millisecond {
			t.Errorf("gap of %v between beta decisions", gap)
		}
	}
	var epoch int64
	if err := e.pool.QueryRow(context.Background(), `SELECT leader_epoch FROM quota_decisions WHERE customer = 'acme'`).Scan(&epoch); err != nil || epoch != 2 {
		t.Errorf("stored decision epoch %d (%v), want 2 (b's)", epoch, err)
	}
}

// At a period boundary the quota starts again from the new period's usage,
// and usage that came into the old period after its last decision is
// settled into the old period's overage.
func TestPeriodBoundarySettlesTheOldPeriod(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	rd, _, today := e.exceededToday()
	e.use("daily", "api_calls", 5) // admitted while exceeded, not yet seen by a decision
	e.advance(24 * time.Hour)
	d := rd.until(5*time.Second, "tomorrow", func(d received) bool { return d.Period != today.Period })
	if d.State != quota.OK || !d.Used.IsZero() || !d.Remaining.Equal(dec("50")) {
		t.Fatalf("new period: %+v", d.Decision)
	}
	start, err := time.Parse(time.DateOnly, today.Period)
	if err != nil {
		t.Fatal(err)
	}
	var got []quota.Overage
	for deadline := time.Now().Add(5 * time.Second); time.Now().Before(deadline); time.Sleep(50 * time.Millisecond) {
		if got, err = quota.Overages(context.Background(), e.pool, start, "daily"); err != nil {
			t.Fatal(err)
		}
		if len(got) == 1 && got[0].WhileExceeded.Equal(dec("5")) {
			break
		}
	}
	if len(got) != 1 || !got[0].WhileExceeded.Equal(dec("5")) || !got[0].OverLimit.Equal(dec("15")) || got[0].Period != today.Period {
		t.Errorf("old period's overage: %+v", got)
	}
}

// Usage under an exact rule is admitted by grants, not by the published
// decision: what became visible while that decision was stale (or
// exceeded) is not overage, and reconciliation must not say it was
// admitted so. Under a lagged rule the same schedule is overage. The same
// holds when another enforcer took over meanwhile, starting from the
// stored decisions and the admission of the rule versions they were made
// under.
func TestExactRuleUsageIsNotOverage(t *testing.T) {
	for _, takeover := range []bool{false, true} {
		t.Run(map[bool]string{false: "one leader", true: "after a takeover"}[takeover], func(t *testing.T) {
			t.Parallel()
			exactRuleUsageIsNotOverage(t, takeover)
		})
	}
}

func exactRuleUsageIsNotOverage(t *testing.T, takeover bool) {
	e := newEnv(t)
	customers := []string{"exact", "lagged"}
	for _, c := range customers {
		in := quota.RuleInput{Customer: c, Meter: "api_calls", Limit: dec("1000"), StaleAfter: 30 * time.Second, OnStale: quota.Deny}
		if c == "exact" {
			in.Admission = quota.Exact
		}
		e.put(in)
	}
	e.position(e.now())
	rd := e.reader()
	a := e.start(e.config("a"))
	for _, c := range customers {
		e.use(c, "api_calls", 10)
	}
	e.advance(time.Second)
	e.position(e.now())
	for _, c := range customers {
		rd.until(5*time.Second, c+" used 10", func(d received) bool { return d.Customer == c && d.Used.Equal(dec("10")) })
	}
	// Ingest stalls past stale_after; the decisions published go stale.
	e.advance(40 * time.Second)
	for _, c := range customers {
		rd.until(5*time.Second, c+" stale", func(d received) bool { return d.Customer == c && d.Stale(d.DecidedAt) })
	}
	if takeover {
		a.Stop(t)
	}
	// Ingest resumes with the usage it held back.
	for _, c := range customers {
		e.use(c, "api_calls", 25)
	}
	e.position(e.now())
	if takeover {
		// The new leader sees the usage first against the stale decisions
		// it loaded, which it did not publish itself.
		e.start(e.config("b"))
	}
	for _, c := range customers {
		rd.until(5*time.Second, c+" used 35", func(d received) bool { return d.Customer == c && d.Used.Equal(dec("35")) })
	}
	waitOverage(t, e, "lagged", func(o quota.Overage) bool { return o.WhileStale.Equal(dec("25")) })
	st, err := quota.StatusWith(context.Background(), e.pool, "exact", quota.StatusOptions{Now: e.clock()})
	if err != nil || len(st) == 0 {
		t.Fatalf("status: %v %v", st, err)
	}
	got, err := quota.Overages(context.Background(), e.pool, st[0].PeriodStart, "exact")
	if err != nil {
		t.Fatal(err)
	}
	for _, o := range got {
		if !o.WhileStale.IsZero() || !o.WhileExceeded.IsZero() {
			t.Errorf("exact rule's usage counted as overage: %+v", o)
		}
	}
}

// A rule whose stale_after is shorter than the republication interval:
// while ingest keeps up, the decision a gateway holds is never stale, so
// on_stale (allow here: an exceeded customer would be admitted) never
// applies to a customer whose usage is known. The enforcer publishes a
// fresher decision before the one held reaches as_of + stale_after.
func TestShortStaleAfterNeverStaleWhileCaughtUp(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	e.follow()
	e.put(quota.RuleInput{Customer: "acme", Meter: "api_calls", Limit: dec("50"), StaleAfter: 3 * time.Second})
	e.use("acme", "api_calls", 60)
	rd := e.reader()
	cfg := e.config("a")
	cfg.Republish = 10 * time.Second
	e.start(cfg)
	held := rd.until(10*time.Second, "exceeded", func(d received) bool { return d.State == quota.Exceeded })
	for end := time.Now().Add(6 * time.Second); time.Now().Before(end); {
		d, ok := rd.next(min(time.Until(end), 200*time.Millisecond))
		if now := e.now(); held.Stale(now) {
			t.Fatalf("at %s the decision held (as_of %s, stale_after 3s) is stale although ingest is caught up: a gateway admits an exceeded customer (on_stale allow)",
				now.Format(time.StampMilli), held.AsOf.Format(time.StampMilli))
		}
		if ok {
			if d.State != quota.Exceeded {
				t.Fatalf("decision %+v", d.Decision)
			}
			held = d
		}
	}
}
