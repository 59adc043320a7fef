package quota_test

import (
	"context"
	"encoding/json"
	"testing"
	"time"

	"github.com/segmentio/kafka-go"

	"github.com/tally-ledger/tally/quota"
)

// A crashed leader never releases its lease: a standby takes over once it
// expires, from the stored decisions.
func TestTakeoverAfterCrashedLeaderLeaseExpires(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	e.follow()
	e.put(quota.RuleInput{Customer: "acme", Meter: "api_calls", Limit: dec("100")})
	e.use("acme", "api_calls", 10)
	// The crashed leader: its lease runs 1.5s more and is never renewed.
	if _, err := e.pool.Exec(context.Background(), `
		INSERT INTO quota_leases (name, holder, epoch, acquired_at, expires_at)
		VALUES ($1, 'crashed', 7, now(), now() + interval '1500 milliseconds')`, quota.DefaultLeaseName); err != nil {
		t.Fatal(err)
	}
	rd := e.reader()
	started := time.Now()
	b := e.start(e.config("b"))
	d := rd.until(10*time.Second, "a decision from the standby", func(received) bool { return true })
	if waited := time.Since(started); waited < time.Second {
		t.Errorf("standby published %v after start, while the crashed leader's lease still ran", waited)
	}
	if d.State != quota.OK || b.Metric("tally_quota_leader", nil) != 1 {
		t.Errorf("standby: %+v leader=%v", d.Decision, b.Metric("tally_quota_leader", nil))
	}
	var epoch int64
	if err := e.pool.QueryRow(context.Background(), `SELECT epoch FROM quota_leases`).Scan(&epoch); err != nil || epoch != 8 {
		t.Errorf("lease epoch %d (%v), want 8", epoch, err)
	}
}

// A leader whose lease was taken (it was paused past its expiry, say) steps
// down at its next renewal and publishes nothing more.
func TestDeposedLeaderStopsPublishing(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	e.follow()
	e.put(quota.RuleInput{Customer: "acme", Meter: "api_calls", Limit: dec("100")})
	rd := e.reader()
	a := e.start(e.config("a"))
	rd.until(10*time.Second, "first decision", func(received) bool { return true })
	if _, err := e.pool.Exec(context.Background(), `
		UPDATE quota_leases SET holder = 'usurper', epoch = epoch + 1, expires_at = now() + interval '1 hour'`); err != nil {
		t.Fatal(err)
	}
	for deadline := time.Now().Add(5 * time.Second); a.Metric("tally_quota_leader", nil) != 0; time.Sleep(10 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatal("deposed leader still leading")
		}
	}
	for {
		if _, ok := rd.next(200 * time.Millisecond); !ok {
			break
		}
	}
	e.use("acme", "api_calls", 100) // a state change nobody may publish now
	if d, ok := rd.next(time.Second); ok {
		t.Fatalf("deposed leader published %+v", d.Decision)
	}
}

// With ingest_customers (one row per customer naming its partition), as_of
// is the customer's own partition's position; a customer without a row
// gets the minimum over the topic.
func TestAsOfFromTheCustomersPartition(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	ctx := context.Background()
	if _, err := e.pool.Exec(ctx, `
		INSERT INTO ingest_customers (customer, topic, partition, first_seen)
		VALUES ('acme', 'tally.meter-batches', 0, now()), ('beta', 'tally.meter-batches', 1, now())`); err != nil {
		t.Fatal(err)
	}
	now := e.now()
	e.position(now)
	if _, err := e.pool.Exec(ctx, `UPDATE ingest_partitions SET applied_through = $1 WHERE partition = 1`, now.Add(-time.Minute)); err != nil {
		t.Fatal(err)
	}
	for _, c := range []string{"acme", "beta", "gamma"} {
		e.put(quota.RuleInput{Customer: c, Meter: "api_calls", Limit: dec("100")})
	}
	rd := e.reader()
	e.start(e.config("a"))
	lags := map[string]time.Duration{}
	for len(lags) < 3 {
		d := rd.until(10*time.Second, "decisions of all three", func(received) bool { return true })
		lags[d.Customer] = d.LagSeconds.Duration()
	}
	if lags["acme"] > 5*time.Second || lags["beta"] < time.Minute || lags["gamma"] < time.Minute {
		t.Errorf("lags %v: want acme fresh, beta (stalled partition) and gamma (no row: topic minimum) a minute behind", lags)
	}
	st, err := quota.StatusWith(ctx, e.pool, "acme", quota.StatusOptions{Now: e.clock()})
	if err != nil || len(st) != 1 || st[0].LagSeconds == nil || st[0].LagSeconds.Duration() > 5*time.Second {
		t.Errorf("status of acme: %+v %v", st, err)
	}
}

// A deposed or paused leader's write can reach Kafka after its lease ended
// (kafka-go retries on its own). Every decision carries the leader epoch
// and a per-key seq, so a consumer keeping the newest (epoch, seq) ignores
// it; and a new leader republishes every current decision at takeover and
// again once the old lease plus the writer's longest write has passed, so
// the last decision of every key on the topic (all a compacted topic keeps)
// is the new leader's, even when nothing changed.
func TestANewLeaderOutranksALateDecisionOfTheOldOne(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	e.follow()
	for _, c := range []string{"acme", "globex"} {
		e.put(quota.RuleInput{Customer: c, Meter: "api_calls", Limit: dec("100")})
		e.use(c, "api_calls", 10)
	}
	rd := e.reader()
	cfg := e.config("a")
	cfg.Republish, cfg.WriteTimeout = time.Hour, 300*time.Millisecond // nothing is due by age in this test
	a := e.start(cfg)
	newest := map[string]quota.Decision{}
	last := map[string]received{}
	keep := func(d received) {
		last[d.key] = d
		if cur, ok := newest[d.key]; !ok || d.Newer(cur) {
			newest[d.key] = d.Decision
		}
	}
	for len(last) < 2 {
		keep(rd.until(30*time.Second, "a decision of leader a", func(received) bool { return true }))
	}
	epochA := newest["acme/api_calls"].LeaderEpoch
	if epochA == 0 || newest["acme/api_calls"].Seq == 0 {
		t.Fatalf("leader a's decision has no epoch or seq: %+v", newest["acme/api_calls"])
	}
	a.Stop(t)

	cfg.Holder = "b"
	b := e.start(cfg)
	takeover := time.Now()
	for len(last) < 2 || last["acme/api_calls"].LeaderEpoch == epochA || last["globex/api_calls"].LeaderEpoch == epochA {
		keep(rd.until(30*time.Second, "leader b's decisions at takeover", func(received) bool { return true }))
	}
	epochB := newest["acme/api_calls"].LeaderEpoch
	if epochB <= epochA {
		t.Fatalf("leader b's epoch %d is not above a's %d", epochB, epochA)
	}
	// Leader a's write lands now, after b's decision: exceeded, a seq far
	// ahead.
	late := newest["acme/api_calls"]
	late.LeaderEpoch, late.Seq, late.State = epochA, 1000, quota.Exceeded
	v, err := json.Marshal(late)
	if err != nil {
		t.Fatal(err)
	}
	e.kafka.Produce(t, decisionsTopic, kafka.Message{Key: []byte(late.Key()), Value: v})
	keep(rd.until(30*time.Second, "the late decision", func(d received) bool { return d.LeaderEpoch == epochA }))
	if newest["acme/api_calls"].State != quota.OK || newest["acme/api_calls"].LeaderEpoch != epochB {
		t.Errorf("a consumer keeping the newest holds %+v after the late decision", newest["acme/api_calls"])
	}
	// Nothing changes; b republishes both keys once a's writes can no
	// longer land.
	for last["acme/api_calls"].LeaderEpoch != epochB || last["globex/api_calls"].LeaderEpoch != epochB || last["acme/api_calls"].at.Before(takeover.Add(time.Second)) {
		keep(rd.until(30*time.Second, "leader b's republication", func(received) bool { return true }))
	}
	for k, d := range last {
		if d.LeaderEpoch != epochB || d.State != quota.OK {
			t.Errorf("last decision of %s on the topic: %+v, want leader b's ok", k, d.Decision)
		}
	}
	if b.Metric("tally_quota_leader", nil) != 1 {
		t.Error("b is not leading")
	}
}
