package quota_test

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/shopspring/decimal"

	"github.com/tally-ledger/tally/amount"
	"github.com/tally-ledger/tally/internal/notify"
	"github.com/tally-ledger/tally/internal/testrun"

	"github.com/tally-ledger/tally/ledger"
	"github.com/tally-ledger/tally/quota"
	"github.com/tally-ledger/tally/validation"
)

// A customer rule on a gauge or unique meter is lagged with a period
// limit: exact admission and rate rules are refused naming their field.
func TestCustomerRulesOnGaugeAndUniqueMetersAreLagged(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	ctx := context.Background()
	for meter, kind := range map[string]ledger.MeterKind{"seats": ledger.Gauge, "mau": ledger.Unique} {
		e.declare(meter, kind)
		_, err := quota.PutRuleDB(ctx, e.pool, quota.RuleInput{Customer: "acme", Meter: meter, Limit: dec("10"), Admission: quota.Exact, Actor: "test"})
		fe := validation.Fields(err)
		if len(fe) != 1 || fe[0].Field != "admission" || !strings.Contains(fe[0].Detail, "is a "+string(kind)) {
			t.Fatalf("%s: %v", meter, err)
		}
		e.put(quota.RuleInput{Customer: "acme", Meter: meter, Limit: dec("10")})
	}
	e.put(quota.RuleInput{Customer: "acme", Meter: "api_calls", Limit: dec("10"), Admission: quota.Exact})
}

// Pool and global budgets sum their members' counters: a gauge's peak or
// a unique meter's distinct members are not sums, so a scope rule, lagged
// or exact, on such a meter is refused naming the meter.
func TestScopeAndExactRulesRefuseGaugeAndUniqueMeters(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	ctx := context.Background()
	for meter, kind := range map[string]ledger.MeterKind{"seats": ledger.Gauge, "mau": ledger.Unique} {
		e.declare(meter, kind)
		check := func(what string, err error) {
			t.Helper()
			fe := validation.Fields(err)
			if !errors.Is(err, quota.ErrInvalid) || len(fe) != 1 || fe[0].Field != "meter" || !strings.Contains(fe[0].Detail, "is a "+string(kind)) {
				t.Fatalf("%s on %s: %v", what, meter, err)
			}
		}
		for _, scope := range []string{"pool:team", quota.Global} {
			for _, adm := range []quota.Admission{quota.Lagged, quota.Exact} {
				err := pgx.BeginFunc(ctx, e.pool, func(tx pgx.Tx) error {
					_, err := quota.PutScopeRule(ctx, tx, quota.ScopeRuleInput{Scope: scope, Meter: meter, Limit: dec("10"), Admission: adm, Actor: "test"})
					return err
				})
				check(string(adm)+" "+scope+" rule", err)
			}
		}
	}
}

// A lagged rule on a gauge limits the period's max (the level carried in
// included), on a unique meter its distinct members: the REST status (the
// enforcer's snapshot) and quota.UsageOf (alerts) equal a brute force over
// the readings, delivered in random order with duplicates; a counter's
// rule keeps its total.
func TestLaggedRulesOnGaugesAndUniquesMatchBruteForce(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	ctx := context.Background()
	e.declare("seats", ledger.Gauge)
	e.declare("mau", ledger.Unique)
	e.put(quota.RuleInput{Customer: "acme", Meter: "seats", Limit: dec("12")})
	e.put(quota.RuleInput{Customer: "acme", Meter: "mau", Limit: dec("4")})
	e.put(quota.RuleInput{Customer: "acme", Meter: "api_calls", Limit: dec("100")})
	e.use("acme", "api_calls", 7)

	now := e.clock().UTC()
	start := time.Date(now.Year(), now.Month(), 1, 0, 0, 0, 0, time.UTC)
	rng := rand.New(rand.NewPCG(uint64(now.UnixNano()), 27))
	// Readings from a day before the period to a minute before now.
	span := now.Add(-time.Minute).Sub(start.Add(-24 * time.Hour))
	at := func() time.Time {
		return start.Add(-24 * time.Hour).Add(time.Duration(rng.Int64N(int64(span)))).Truncate(time.Millisecond)
	}
	type lv struct {
		at    time.Time
		level int64
	}
	var recs []ledger.Record
	levels := map[string][]lv{}
	for _, producer := range []string{"a", "b", "c"} {
		var ts []time.Time
		for range 6 {
			ts = append(ts, at())
		}
		slices.SortFunc(ts, func(x, y time.Time) int { return x.Compare(y) })
		for i, t0 := range ts {
			v := rng.Int64N(7)
			levels[producer] = append(levels[producer], lv{t0, v})
			recs = append(recs, ledger.Record{OperationID: uuid.New(), Seq: int64(i + 1), OccurredAt: t0,
				Stream: ledger.StreamKey{Producer: producer, Epoch: 1, Customer: "acme", Meter: "seats"},
				Shape:  ledger.Gauge, Level: amount.MustParse(fmt.Sprint(v))})
		}
	}
	seen := map[string]bool{}
	for i := range 12 {
		t0, m := at(), fmt.Sprintf("u%d", rng.IntN(7))
		if !t0.Before(start) {
			seen[m] = true
		}
		recs = append(recs, ledger.Record{OperationID: uuid.New(), Seq: int64(i + 1), OccurredAt: t0,
			Stream: ledger.StreamKey{Producer: "auth", Epoch: 1, Customer: "acme", Meter: "mau"}, Shape: ledger.Unique, Member: m})
	}
	recs = append(recs, recs[rng.IntN(len(recs))], recs[rng.IntN(len(recs))]) // retransmits
	rng.Shuffle(len(recs), func(i, j int) { recs[i], recs[j] = recs[j], recs[i] })
	for _, r := range recs {
		e.apply(r)
	}
	// Brute force: the customer's level at t is the sum of each stream's
	// latest level at or before t; the max is over the period's start and
	// every reading in it.
	levelAt := func(t0 time.Time) int64 {
		var sum int64
		for _, ls := range levels {
			var cur int64
			for _, x := range ls {
				if !x.at.After(t0) {
					cur = x.level
				}
			}
			sum += cur
		}
		return sum
	}
	peak := levelAt(start)
	for _, ls := range levels {
		for _, x := range ls {
			if !x.at.Before(start) {
				peak = max(peak, levelAt(x.at))
			}
		}
	}
	want := map[string]int64{"seats": peak, "mau": int64(len(seen)), "api_calls": 7}
	sts, err := quota.StatusWith(ctx, e.pool, "acme", quota.StatusOptions{Now: e.clock(), IngestTopic: ingestTopic})
	if err != nil {
		t.Fatal(err)
	}
	if len(sts) != 3 {
		t.Fatalf("status: %+v", sts)
	}
	for _, st := range sts {
		if !st.Used.Equal(decimal.NewFromInt(want[st.Meter])) {
			t.Errorf("%s: status used %s, brute force %d", st.Meter, st.Used, want[st.Meter])
		}
		if limit := st.Rule.Limit.Decimal; !st.Remaining.Equal(decimal.Max(limit.Sub(st.Used), decimal.Zero)) {
			t.Errorf("%s: remaining %s of %s used %s", st.Meter, st.Remaining, limit, st.Used)
		}
	}
	us, err := quota.UsageOf(ctx, e.pool, quota.UsageQuery{Now: e.clock(), IngestTopic: ingestTopic, Subjects: []quota.Subject{
		{Scope: "customer:acme", Meter: "seats"}, {Scope: "customer:acme", Meter: "mau"}, {Scope: "customer:acme", Meter: "api_calls"}}})
	if err != nil {
		t.Fatal(err)
	}
	for _, u := range us {
		if !u.Used.Equal(decimal.NewFromInt(want[u.Meter])) || u.Limit == nil {
			t.Errorf("%s: UsageOf used %s (limit %v), brute force %d", u.Meter, u.Used, u.Limit, want[u.Meter])
		}
	}
}

// The enforcer publishes decisions for a gauge rule against the period's
// max: a reading above the limit exceeds it, and a lower level later does
// not bring it back (the peak of the period stays); a new unique member
// raises the count.
func TestEnforcerDecidesOnGaugeMaxAndUniqueCount(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	ctx := context.Background()
	e.declare("seats", ledger.Gauge)
	e.declare("mau", ledger.Unique)
	seq := map[string]int64{}
	apply := func(meter string, set func(*ledger.Record)) {
		t.Helper()
		seq[meter]++
		r := ledger.Record{OperationID: uuid.New(), Seq: seq[meter], OccurredAt: e.clock().Add(-time.Second),
			Stream: ledger.StreamKey{Producer: "p", Epoch: 1, Customer: "acme", Meter: meter}}
		set(&r)
		e.apply(r)
	}
	level := func(v string) func(*ledger.Record) {
		return func(r *ledger.Record) { r.Shape, r.Level = ledger.Gauge, amount.MustParse(v) }
	}
	member := func(m string) func(*ledger.Record) {
		return func(r *ledger.Record) { r.Shape, r.Member = ledger.Unique, m }
	}
	e.follow()
	e.put(quota.RuleInput{Customer: "acme", Meter: "seats", Limit: dec("10")})
	e.put(quota.RuleInput{Customer: "acme", Meter: "mau", Limit: dec("2")})
	apply("seats", level("4"))
	apply("mau", member("u1"))
	rd := e.reader()
	e.start(e.config("a"))
	seen := func(key, what string, ok func(received) bool) received {
		t.Helper()
		return rd.until(10*time.Second, what, func(d received) bool { return d.key == key && ok(d) })
	}
	d := seen("acme/seats", "seats ok at 4", func(d received) bool { return d.State == quota.OK })
	if !d.Used.Equal(dec("4")) || !d.Remaining.Equal(dec("6")) {
		t.Fatalf("seats at 4: %+v", d.Decision)
	}
	apply("seats", level("12"))
	d = seen("acme/seats", "seats exceeded at 12", func(d received) bool { return d.State == quota.Exceeded })
	if !d.Used.Equal(dec("12")) || !d.Remaining.IsZero() {
		t.Fatalf("seats at 12: %+v", d.Decision)
	}
	apply("seats", level("3"))
	time.Sleep(300 * time.Millisecond)
	if st, err := quota.StatusWith(ctx, e.pool, "acme", quota.StatusOptions{Now: e.clock()}); err != nil || len(st) != 2 || st[1].Meter != "seats" || !st[1].Used.Equal(dec("12")) || st[1].State != quota.Exceeded {
		t.Fatalf("seats back at 3: %v %+v", err, st)
	}
	apply("mau", member("u1"))
	apply("mau", member("u2"))
	d = seen("acme/mau", "mau exceeded at 2", func(d received) bool { return d.State == quota.Exceeded })
	if !d.Used.Equal(dec("2")) {
		t.Fatalf("mau: %+v", d.Decision)
	}
}

// The ledger's usage notifications wake the enforcer: with an Interval of
// 5s, a gauge reading is decided on well before the next tick.
func TestEnforcerWakesOnGaugeReadings(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	e.declare("seats", ledger.Gauge)
	e.follow()
	e.put(quota.RuleInput{Customer: "acme", Meter: "seats", Limit: dec("10")})
	cfg := e.config("a")
	cfg.Interval, cfg.LeaseTTL, cfg.Republish = 5*time.Second, 11*time.Second, time.Minute
	cfg.Registerer = prometheus.NewRegistry()
	enf, err := quota.NewEnforcer(cfg)
	if err != nil {
		t.Fatal(err)
	}
	lis := notify.New(notify.Config{Pool: e.pool, Channel: "tally_api_cache", ApplicationName: "quota-test", Logger: testLogger(t)})
	lis.Subscribe(enf.Subscriber())
	testrun.Start(t, prometheus.NewRegistry(), lis.Run)
	rd := e.reader()
	testrun.Start(t, prometheus.NewRegistry(), enf.Run)
	rd.until(10*time.Second, "first decision", func(d received) bool { return d.key == "acme/seats" && d.Used.IsZero() })
	time.Sleep(200 * time.Millisecond) // the listener is up (it was for the first decision's wake or tick)
	r := ledger.Record{OperationID: uuid.New(), Seq: 1, OccurredAt: e.clock().Add(-time.Second), Shape: ledger.Gauge,
		Level: amount.MustParse("11"), Stream: ledger.StreamKey{Producer: "p", Epoch: 1, Customer: "acme", Meter: "seats"}}
	applied := time.Now()
	e.apply(r)
	d := rd.until(4*time.Second, "exceeded at 11", func(d received) bool { return d.key == "acme/seats" && d.State == quota.Exceeded })
	if took := d.DecidedAt.Sub(applied); took > 2*time.Second || !d.Used.Equal(dec("11")) {
		t.Fatalf("decided %v after the reading: %+v", took, d.Decision)
	}
}

// declare declares meter of kind in the ledger.
func (e *env) declare(meter string, kind ledger.MeterKind) {
	e.t.Helper()
	if err := pgx.BeginFunc(context.Background(), e.pool, func(tx pgx.Tx) error {
		_, err := ledger.DeclareMeter(context.Background(), tx, ledger.Meter{Meter: meter, Kind: kind}, e.clock())
		return err
	}); err != nil {
		e.t.Fatal(err)
	}
}

// apply applies r through the ledger in a transaction of its own.
func (e *env) apply(r ledger.Record) {
	e.t.Helper()
	l, err := ledger.New(ledger.Config{})
	if err != nil {
		e.t.Fatal(err)
	}
	if err := pgx.BeginFunc(context.Background(), e.pool, func(tx pgx.Tx) error {
		_, err := l.Apply(context.Background(), tx, []ledger.Record{r})
		return err
	}); err != nil {
		e.t.Fatal(err)
	}
}
