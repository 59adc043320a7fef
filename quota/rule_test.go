package quota_test

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/shopspring/decimal"

	"github.com/tally-ledger/tally/internal/pgtest"
	"github.com/tally-ledger/tally/quota"
	"github.com/tally-ledger/tally/validation"
)

func TestRuleInputValidateNamesEveryField(t *testing.T) {
	t.Parallel()
	in := quota.RuleInput{
		Customer: "bad customer", Meter: "", Limit: dec("-1"),
		WarnAt: decimal.NewNullDecimal(dec("1.5")), Mode: "block", OnStale: "maybe",
		StaleAfter: 1500 * time.Millisecond,
	}
	err := in.Validate()
	if !errors.Is(err, quota.ErrInvalid) {
		t.Fatalf("err = %v, want ErrInvalid", err)
	}
	for _, field := range []string{"customer:", "meter:", "limit:", "warn_at:", "mode:", "on_stale:", "stale_after:", "actor:"} {
		if !strings.Contains(err.Error(), field) {
			t.Errorf("error does not name %s: %v", field, err)
		}
	}
	ok := quota.RuleInput{Customer: "acme", Meter: "api_calls", Limit: dec("1000.5"), Actor: "ops"}
	if err := ok.Validate(); err != nil {
		t.Errorf("valid input: %v", err)
	}
}

func TestDecodePutRequest(t *testing.T) {
	t.Parallel()
	in, err := quota.DecodePutRequest(strings.NewReader(`{"limit":"100000","warn_at":"0.9","mode":"shadow","stale_after":"2m","reason":"trial"}`), "acme", "api_calls", "admin")
	if err != nil {
		t.Fatal(err)
	}
	if !in.Limit.Equal(dec("100000")) || !in.WarnAt.Decimal.Equal(dec("0.9")) || in.Mode != quota.Shadow ||
		in.StaleAfter != 2*time.Minute || in.Actor != "admin" || in.Customer != "acme" {
		t.Errorf("decoded %+v", in)
	}
	if in, err := quota.DecodePutRequest(strings.NewReader(`{"limit":"500","stale_after":60}`), "acme", "m", "admin"); err != nil || !in.Limit.Equal(dec("500")) || in.StaleAfter != time.Minute {
		t.Errorf("whole seconds: %+v %v", in, err)
	}
	// Decimals are strings, as every decimal of the API's bodies: a JSON
	// number is refused naming its field, in a rate too.
	for _, body := range []string{`{"limit":500}`, `{"limit":"1","warn_at":0.5}`, `{"rate":{"amount":100,"per":"1s","burst":"200"},"admission":"exact"}`} {
		if _, err := quota.DecodePutRequest(strings.NewReader(body), "acme", "m", "admin"); !errors.Is(err, quota.ErrInvalid) || !strings.Contains(err.Error(), "decimal string") {
			t.Errorf("%s: %v, want a decimal string asked for", body, err)
		}
	}
	_, err = quota.DecodePutRequest(strings.NewReader(`{"limit":1e3,"mode":"block"}`), "acme", "m", "admin")
	if !errors.Is(err, quota.ErrInvalid) || !strings.Contains(err.Error(), "limit:") || !strings.Contains(err.Error(), "mode:") {
		t.Errorf("exponent limit and bad mode: %v", err)
	}
	if _, err := quota.DecodePutRequest(strings.NewReader(`{"limit":"1","colour":"red"}`), "acme", "m", "admin"); !errors.Is(err, quota.ErrInvalid) {
		t.Errorf("unknown field: %v", err)
	}
}

func TestPutRuleVersionsAndHistory(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	ctx := context.Background()
	r1 := e.put(quota.RuleInput{Customer: "acme", Meter: "api_calls", Limit: dec("100")})
	if r1.Version != 1 || !r1.WarnAt.Equal(dec("0.8")) || r1.Mode != quota.Enforce || r1.OnStale != quota.Allow ||
		time.Duration(r1.StaleAfter) != 5*time.Minute {
		t.Fatalf("defaults: %+v", r1)
	}
	r2 := e.put(quota.RuleInput{Customer: "acme", Meter: "api_calls", Limit: dec("250.5"), Mode: quota.Shadow, OnStale: quota.Deny, StaleAfter: time.Minute})
	future := e.put(quota.RuleInput{Customer: "acme", Meter: "api_calls", Limit: dec("1"), EffectiveAt: e.clock().Add(time.Hour)})
	e.put(quota.RuleInput{Customer: "acme", Meter: "storage", Limit: dec("5")})
	if r2.Version != 2 || future.Version != 3 {
		t.Fatalf("versions %d, %d", r2.Version, future.Version)
	}
	rules, err := quota.RulesAt(ctx, e.pool, "acme", e.clock())
	if err != nil {
		t.Fatal(err)
	}
	if len(rules) != 2 || rules[0].Meter != "api_calls" || rules[0].Version != 2 || !rules[0].Limit.Decimal.Equal(dec("250.5")) ||
		rules[0].OnStale != quota.Deny || rules[1].Meter != "storage" {
		t.Fatalf("current rules: %+v", rules)
	}
	hist, err := quota.RuleHistory(ctx, e.pool, "acme", "api_calls")
	if err != nil {
		t.Fatal(err)
	}
	if len(hist) != 3 || hist[0].Version != 1 || hist[2].Version != 3 || hist[0].Actor != "test" {
		t.Fatalf("history: %+v", hist)
	}
	// A version that would never take effect (before the one in force) is refused.
	_, err = quota.PutRuleDB(ctx, e.pool, quota.RuleInput{Customer: "acme", Meter: "api_calls", Limit: dec("2"), Actor: "x", EffectiveAt: r2.EffectiveAt.Add(-time.Second)})
	if !errors.Is(err, quota.ErrInvalid) || !strings.Contains(err.Error(), "effective_at") {
		t.Errorf("effective_at before the version in force: %v", err)
	}
	if _, err := quota.RuleHistory(ctx, e.pool, "acme", "nothing"); !errors.Is(err, quota.ErrNotFound) {
		t.Errorf("missing rule: %v", err)
	}
	// History is insert-only.
	if _, err := e.pool.Exec(ctx, `UPDATE quota_rules SET "limit" = 0`); err == nil || !strings.Contains(err.Error(), "insert-only") {
		t.Errorf("UPDATE of quota_rules: %v", err)
	}
	if _, err := e.pool.Exec(ctx, `DELETE FROM quota_rules`); err == nil {
		t.Errorf("DELETE of quota_rules succeeded")
	}
}

// An urgent change takes effect at once even when a version is scheduled
// for later, and the scheduled one still takes effect at its time: the
// version in force is the one with the latest effective time that has come
// (the highest version among equal times).
func TestAnImmediateChangeOvertakesAScheduledOne(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	ctx := context.Background()
	e.put(quota.RuleInput{Customer: "acme", Meter: "api_calls", Limit: dec("100")})
	at := e.clock().Add(3 * time.Second)
	e.put(quota.RuleInput{Customer: "acme", Meter: "api_calls", Limit: dec("1000"), EffectiveAt: at})
	cut, err := quota.PutRuleDBClock(ctx, e.pool, quota.RuleInput{Customer: "acme", Meter: "api_calls", Limit: dec("10"), Actor: "oncall", Reason: "abuse"}, e.clock)
	if err != nil {
		t.Fatalf("an immediate limit cut with a version scheduled: %v", err)
	}
	current := func() quota.Rule {
		t.Helper()
		rules, err := quota.RulesAt(ctx, e.pool, "acme", e.clock())
		if err != nil || len(rules) != 1 {
			t.Fatalf("rules %+v, %v", rules, err)
		}
		return rules[0]
	}
	if r := current(); r.Version != cut.Version || !r.Limit.Decimal.Equal(dec("10")) {
		t.Errorf("in force after the cut: version %d limit %s; want version %d limit 10", r.Version, r.Limit.Decimal, cut.Version)
	}
	time.Sleep(at.Sub(e.clock()) + 500*time.Millisecond)
	if r := current(); r.Version != 2 || !r.Limit.Decimal.Equal(dec("1000")) {
		t.Errorf("in force after the scheduled time: version %d limit %s; want version 2 limit 1000", r.Version, r.Limit.Decimal)
	}
	e.put(quota.RuleInput{Customer: "acme", Meter: "api_calls", Limit: dec("5")})
	if r := current(); !r.Limit.Decimal.Equal(dec("5")) {
		t.Errorf("a change after the scheduled version took effect: limit %s in force, want 5", r.Limit.Decimal)
	}
}

// Decisions of pool and global rules are published under "<scope>/<meter>"
// ("global/api_calls", "pool:free/api_calls"), so a customer named like a
// scope cannot have a rule of its own: its decisions would be mistaken for
// the scope's (and the scope's for its).
func TestCustomerNamedLikeAScopeHasNoRule(t *testing.T) {
	t.Parallel()
	for _, customer := range []string{quota.Global, quota.PoolScope("free"), "pool:"} {
		in := quota.RuleInput{Customer: customer, Meter: "api_calls", Limit: dec("10"), Actor: "ops"}
		err := in.Validate()
		var fe *validation.FieldError
		if !errors.As(err, &fe) || fe.Field != "customer" || !strings.Contains(fe.Detail, "reserved") {
			t.Errorf("customer %q: %v, want a customer field error saying the id is reserved", customer, err)
		}
	}
	for _, customer := range []string{"globalcorp", "acme:pool:1", "Global"} {
		in := quota.RuleInput{Customer: customer, Meter: "api_calls", Limit: dec("10"), Actor: "ops"}
		if err := in.Validate(); err != nil {
			t.Errorf("customer %q: %v", customer, err)
		}
	}
}

// A rule version put without effective_at takes effect when it is stored,
// after the lock on the rule's versions: one that waited for another
// version being put is in force after it, not before it (the last version
// written wins). Before, its effective time was read before the wait, so
// the version that held the lock, dated later, stayed in force.
func TestAVersionThatWaitedTakesEffectAfterTheOneItWaitedFor(t *testing.T) {
	t.Parallel()
	pool := pgtest.New(t)
	ctx := context.Background()
	start := time.Now()
	rival, err := pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer rival.Rollback(ctx)
	// The rival's version is dated after the waiter began.
	if _, err := quota.PutRuleAt(ctx, rival, quota.RuleInput{Customer: "acme", Meter: "api_calls", Limit: dec("10"), Actor: "rival"},
		start.Add(100*time.Millisecond)); err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	var mine quota.Rule
	go func() {
		var err error
		mine, err = quota.PutRuleDB(ctx, pool, quota.RuleInput{Customer: "acme", Meter: "api_calls", Limit: dec("20"), Actor: "waiter"})
		done <- err
	}()
	time.Sleep(time.Until(start.Add(200 * time.Millisecond)))
	if err := rival.Commit(ctx); err != nil {
		t.Fatal(err)
	}
	if err := <-done; err != nil {
		t.Fatalf("the version that waited: %v", err)
	}
	in, err := quota.RuleAt(ctx, pool, "acme", "api_calls", time.Now())
	if err != nil {
		t.Fatal(err)
	}
	if mine.Version != 2 || in.Version != 2 || !in.Limit.Decimal.Equal(dec("20")) {
		t.Fatalf("stored version %d effective %s; in force now: version %d, limit %s; want the last written (2, 20) in force",
			mine.Version, mine.EffectiveAt, in.Version, in.Limit.Decimal)
	}
}

// A rate's field names match exactly, as every body's do: "Amount" is an
// unknown field, not amount.
func TestRateFieldNamesAreCaseSensitive(t *testing.T) {
	t.Parallel()
	_, errs := quota.DecodeRate([]byte(`{"Amount":"100","per":"1s","burst":"200"}`))
	if len(errs) != 1 || !strings.HasPrefix(errs[0].Error(), "rate.Amount: unknown field") {
		t.Fatalf("Amount: %v, want the unknown field rate.Amount", errs)
	}
	if r, errs := quota.DecodeRate([]byte(`{"amount":"100","per":"1s","burst":"200"}`)); len(errs) > 0 || !r.Amount.Equal(dec("100")) {
		t.Fatalf("a rate: %+v %v", r, errs)
	}
}
