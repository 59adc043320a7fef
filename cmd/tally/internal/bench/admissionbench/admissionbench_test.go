package admissionbench_test

import (
	"bytes"
	"context"
	"fmt"
	"log/slog"
	"math"
	"net"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"go.uber.org/goleak"

	"github.com/tally-ledger/tally/cmd/tally/internal/bench/admissionbench"
	"github.com/tally-ledger/tally/internal/pgtest"
	"github.com/tally-ledger/tally/internal/testrun"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

const redisAddr = "127.0.0.1:6379"

// small is a run that takes seconds: 3 gateways, 8 customers, a limit the
// busiest customers cross early.
func small(t *testing.T) admissionbench.Options {
	return admissionbench.Options{DatabaseURL: pgtest.NewURL(t), Gateways: 3, Customers: 8, Rate: 400,
		Duration: 2 * time.Second, Limit: 60, Skew: 1.1, FixedGrant: 10, LagInterval: 300 * time.Millisecond,
		RedisAddr: redisAddr, Seed: 7,
		// A debit slower than the SDK's 250 ms on a loaded machine may be
		// taken while its request was refused: the invariants below would
		// report that documented trade as a unit consumed beyond admitted.
		MaxWait: 10 * time.Second}
}

// redisAnswers says whether a Redis answers at addr: the Redis row must be
// measured when one does, and skipped with the reason when none does.
func redisAnswers(addr string) bool {
	c := redis.NewClient(&redis.Options{Addr: addr, DialTimeout: time.Second, MaxRetries: -1, Protocol: 2, DisableIdentity: true})
	defer c.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	return c.Ping(ctx).Err() == nil
}

// Every regime runs over the same trace; what a user reads off the table
// holds: the counts add up, the exact regimes and the central counters
// never admit past a limit, the counters never refuse with room left, the
// lagged regime overshoots, and every exact regime's spend reached
// Postgres when the gateways released. The report's figures are read
// while what they come from is still open.
func TestRunInvariants(t *testing.T) {
	o := small(t)
	var logged testrun.Buffer
	o.Logger = slog.New(slog.NewTextHandler(&logged, &slog.HandlerOptions{Level: slog.LevelWarn}))
	r, err := admissionbench.Run(t.Context(), o)
	if err != nil {
		t.Fatal(err)
	}
	// Load may make a gateway warn (Tally slow to answer); nothing may
	// read a pool the run closed.
	if s := logged.String(); strings.Contains(s, "closed pool") {
		t.Errorf("the run read a closed pool:\n%s", s)
	}
	if r.Requests == 0 || r.Over == 0 || r.Over+r.Near+r.Below != o.Customers {
		t.Fatalf("trace: %d requests, customers over %d near %d below %d", r.Requests, r.Over, r.Near, r.Below)
	}
	if r.Firsts < int64(o.Customers) || r.Firsts > min(r.Requests, int64(o.Gateways*o.Customers)) ||
		r.Steady >= r.Requests || r.FirstsSteady > min(r.Steady, r.Firsts) {
		t.Fatalf("trace: %d first requests of a customer at a gateway of %d (after the warm-up %d of %d), %d gateways × %d customers",
			r.Firsts, r.Requests, r.FirstsSteady, r.Steady, o.Gateways, o.Customers)
	}
	rows := map[string]admissionbench.Row{}
	for _, row := range r.Rows {
		rows[row.Regime] = row
	}
	if len(rows) != 6 {
		t.Fatalf("%d rows, want 6: %+v", len(rows), r.Rows)
	}
	for _, row := range r.Rows {
		if row.Skipped != "" {
			continue
		}
		if row.Requests != r.Requests || row.Admitted+row.Refused+row.Errors != row.Requests || row.Errors != 0 {
			t.Errorf("%s: requests %d (trace %d) = admitted %d + refused %d + failed %d?", row.Regime,
				row.Requests, r.Requests, row.Admitted, row.Refused, row.Errors)
		}
		if len(row.Problems) > 0 {
			t.Errorf("%s: %v", row.Regime, row.Problems)
		}
		if row.Admitted == 0 || row.CentralCalls == 0 || row.P99 < row.P50 || row.SteadyP99 == 0 {
			t.Errorf("%s: admitted %d, calls %d, p50 %s p99 %s (steady %s)", row.Regime, row.Admitted, row.CentralCalls, row.P50, row.P99, row.SteadyP99)
		}
		if row.FalseDenials > row.Refused || row.Below95False > row.Below95 || row.Below95False > row.FalseDenials {
			t.Errorf("%s: false denials %d (%d below 95%% of %d) of %d refused", row.Regime, row.FalseDenials,
				row.Below95False, row.Below95, row.Refused)
		}
	}
	for _, name := range []string{"exact, fixed grant", "exact, sized by demand", "central counter, Postgres",
		"central counter, Postgres via HTTP", "central counter, Redis"} {
		row := rows[name]
		if row.Skipped != "" {
			continue
		}
		if row.OverLimit != 0 || row.WorstAdmitted > o.Limit {
			t.Errorf("%s admitted past the limit: worst %d of %d, %d over", name, row.WorstAdmitted, o.Limit, row.OverLimit)
		}
		if row.Refused == 0 {
			t.Errorf("%s refused nothing, though %d customers' demand is over the limit", name, r.Over)
		}
	}
	for _, name := range []string{"central counter, Postgres", "central counter, Postgres via HTTP", "central counter, Redis"} {
		if row := rows[name]; row.Skipped == "" && (row.FalseDenials != 0 || row.Stranded != 0 || row.CentralCalls != row.Requests) {
			t.Errorf("%s: %d false denials, %d stranded, %d calls for %d requests", name, row.FalseDenials, row.Stranded,
				row.CentralCalls, row.Requests)
		}
	}
	if lag := rows["lagged decisions"]; lag.OverLimit == 0 || lag.DecisionLag[0] <= 0 || lag.Stranded != 0 {
		t.Errorf("lagged: over limit %d, decision lag %v, stranded %d", lag.OverLimit, lag.DecisionLag, lag.Stranded)
	}
	for _, name := range []string{"exact, fixed grant", "exact, sized by demand"} {
		// A gateway holds nothing for a customer it has not seen: each
		// first request of a customer at a gateway asks for a grant.
		if row := rows[name]; row.GrantCalls < r.Firsts || row.GrantCalls > row.CentralCalls || !strings.Contains(row.CallDetail, "grants issued") ||
			!strings.Contains(row.CallDetail, "in Tally, a grant request's mean plan") {
			t.Errorf("%s: %d grant calls of %d (%s), %d first requests of a customer at a gateway", name, row.GrantCalls,
				row.CentralCalls, row.CallDetail, r.Firsts)
		}
	}
	if redisRow := rows["central counter, Redis"]; redisAnswers(redisAddr) == (redisRow.Skipped != "") {
		t.Errorf("Redis answers at %s: %v, but the row says %q", redisAddr, redisAnswers(redisAddr), redisRow.Skipped)
	}

	var out bytes.Buffer
	r.Report(&out)
	for _, want := range []string{"| lagged decisions", "| exact, fixed grant", "| exact, sized by demand",
		"| central counter, Postgres", "| central counter, Postgres via HTTP", "central counter, Redis", "targets (docs/design.md §10)", "decision lag",
		"first requests of a customer at a gateway"} {
		if !strings.Contains(out.String(), want) {
			t.Errorf("no %q in the report:\n%s", want, out.String())
		}
	}
}

// Where no Redis answers, the Redis row is skipped with the reason, and
// the run does not fail.
func TestNoRedisSkipsItsRow(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	closed := ln.Addr().String()
	ln.Close() // nothing listens there now
	o := small(t)
	o.RedisAddr, o.Regimes = closed, []string{"redis"}
	r, err := admissionbench.Run(t.Context(), o)
	if err != nil {
		t.Fatal(err)
	}
	if len(r.Rows) != 1 || !strings.Contains(r.Rows[0].Skipped, "no Redis answered at "+closed) {
		t.Fatalf("rows: %+v", r.Rows)
	}
	var out bytes.Buffer
	r.Report(&out)
	if !strings.Contains(out.String(), "skipped: no Redis answered at "+closed) {
		t.Errorf("the report does not say why:\n%s", out.String())
	}
}

// Options report every problem at once, each naming its flag.
func TestOptionsValidate(t *testing.T) {
	err := admissionbench.Options{DatabaseURL: "x", Gateways: -1, Burst: 6, Limit: -5, Regimes: []string{"lagged", "local"}}.Validate()
	if err == nil {
		t.Fatal("no error")
	}
	for _, want := range []string{"gateways", "burst", "limit", `regimes: "local"`} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("no %q in %v", want, err)
		}
	}
	if err := (admissionbench.Options{DatabaseURL: "x"}).Validate(); err != nil {
		t.Errorf("defaults: %v", err)
	}
	// A float flag takes NaN, which every range comparison lets through.
	err = admissionbench.Options{DatabaseURL: "x", Skew: math.NaN(), Burst: math.NaN()}.Validate()
	for _, want := range []string{"skew", "burst"} {
		if err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("NaN: no %q in %v", want, err)
		}
	}
}

// The hot-key run, small: every way took grants, the budgets read back add
// up to the grants taken and none is over its limit (checked by the run,
// reported as problems), and the refusal by the tight global budget
// refused every holder, named global, and left the customers' and the
// pool's budgets exactly as they were.
func TestRunHot(t *testing.T) {
	o := admissionbench.HotOptions{DatabaseURL: pgtest.NewURL(t), Budgets: []string{"customer", "pool", "global"},
		Holders: 5, Duration: 300 * time.Millisecond}
	r, err := admissionbench.RunHot(t.Context(), o)
	if err != nil {
		t.Fatal(err)
	}
	if len(r.Rows) != 4 {
		t.Fatalf("%d rows, want 4: %+v", len(r.Rows), r.Rows)
	}
	for _, row := range r.Rows {
		if row.Grants == 0 || row.Refused != 0 || row.Errors != 0 || len(row.Problems) > 0 || row.P99 < row.P50 || row.PerSecond() <= 0 {
			t.Errorf("%s: %d grants, %d refused, %d failed, p50 %s p99 %s, problems %v", row.Name, row.Grants, row.Refused,
				row.Errors, row.P50, row.P99, row.Problems)
		}
	}
	f := r.Refusal
	if f.Skipped != "" || f.Requests != 5 || f.Refused != 5 || len(f.Problems) > 0 {
		t.Fatalf("refusal: %+v", f)
	}
	// 5 customers, the pool and global, read before and after.
	if len(f.Before) != 7 || len(f.After) != 7 || f.Before[5].Budget != "pool:"+strings.TrimSuffix(strings.TrimPrefix(f.Before[0].Budget, "customer:"), "-c000") ||
		f.Before[6].Budget != "global" || f.Before[6].Consumed.IsZero() {
		t.Fatalf("budgets read: %+v", f.Before)
	}
	for i := range f.Before {
		if !f.Before[i].Consumed.Equal(f.After[i].Consumed) || !f.Before[i].Live.Equal(f.After[i].Live) {
			t.Errorf("%s moved: %+v → %+v", f.Before[i].Budget, f.Before[i], f.After[i])
		}
	}
	var out bytes.Buffer
	r.Report(&out)
	for _, want := range []string{"exact, REST API", "central counter, Postgres", "5 of 5 refused by global", "grants/s"} {
		if !strings.Contains(out.String(), want) {
			t.Errorf("report lacks %q:\n%s", want, out.String())
		}
	}
}

// With the customer's budget only (the default), the run measures it and
// says why the refusal by global did not run.
func TestRunHotCustomerOnly(t *testing.T) {
	r, err := admissionbench.RunHot(t.Context(), admissionbench.HotOptions{DatabaseURL: pgtest.NewURL(t), Holders: 3, Duration: 200 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	if r.Refusal.Skipped == "" || len(r.Rows) != 4 {
		t.Fatalf("%+v", r)
	}
	for _, row := range r.Rows {
		if row.Grants == 0 || len(row.Problems) > 0 {
			t.Errorf("%s: %d grants, problems %v", row.Name, row.Grants, row.Problems)
		}
	}
	if err := (admissionbench.HotOptions{DatabaseURL: "x", Budgets: []string{"plan"}}).Validate(); err == nil || !strings.Contains(err.Error(), `"plan"`) {
		t.Errorf("budgets plan: %v", err)
	}
}

// With rounds, every regime runs that many times, alternating, and the
// report adds each regime's medians against the Postgres counter of the
// same round.
func TestRoundsAlternateAndReportMedians(t *testing.T) {
	o := small(t)
	o.Rounds, o.Regimes = 2, []string{"sized", "postgres"}
	r, err := admissionbench.Run(t.Context(), o)
	if err != nil {
		t.Fatal(err)
	}
	var order []string
	for _, row := range r.Rows {
		order = append(order, fmt.Sprintf("%s/%d", row.Key, row.Round))
		if len(row.Problems) > 0 {
			t.Errorf("%s round %d: %v", row.Regime, row.Round, row.Problems)
		}
	}
	if want := "[sized/1 postgres/1 sized/2 postgres/2]"; fmt.Sprint(order) != want {
		t.Fatalf("rows ran as %v, want %s", order, want)
	}
	var out bytes.Buffer
	r.Report(&out)
	for _, want := range []string{"| exact, sized by demand (round 2)", "over 2 rounds, alternating: median (lowest–highest)",
		"p99 ÷ the Postgres counter's", "| central counter, Postgres (round 2) |"} {
		if !strings.Contains(out.String(), want) {
			t.Errorf("no %q in the report:\n%s", want, out.String())
		}
	}
	// The counter against itself: 1.00 × in every round, for p99 and CPU.
	_, medians, _ := strings.Cut(out.String(), "over 2 rounds")
	var counter string
	for line := range strings.Lines(medians) {
		if strings.HasPrefix(line, "| central counter, Postgres ") {
			counter = line
		}
	}
	if strings.Count(counter, "1.00 × (1.00 ×–1.00 ×)") != 2 {
		t.Errorf("the counter's medians are not 1.00 × its own: %q", counter)
	}
}
