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
)

func TestRuleAdmissionSettings(t *testing.T) {
	t.Parallel()
	bad := quota.RuleInput{Customer: "acme", Meter: "tokens", Limit: dec("10"), Actor: "ops",
		Admission: "strict", OnUnreachable: quota.UnreachableLocal}
	err := bad.Validate()
	for _, field := range []string{"admission:", "local_amount:", "local_every:"} {
		if !strings.Contains(err.Error(), field) {
			t.Errorf("error does not name %s: %v", field, err)
		}
	}
	stray := quota.RuleInput{Customer: "acme", Meter: "tokens", Limit: dec("10"), Actor: "ops",
		LocalAmount: decimal.NewNullDecimal(dec("1"))}
	if err := stray.Validate(); !errors.Is(err, quota.ErrInvalid) || !strings.Contains(err.Error(), "on_unreachable:") {
		t.Errorf("local_amount without local: %v", err)
	}

	// A lagged rule's gateways follow on_stale: an on_unreachable other
	// than the default would never apply, so it is refused, not kept.
	for _, p := range []quota.OnUnreachable{quota.UnreachableAllow, quota.UnreachableLocal} {
		in := quota.RuleInput{Customer: "acme", Meter: "tokens", Limit: dec("10"), Actor: "ops", OnUnreachable: p}
		if p == quota.UnreachableLocal {
			in.LocalAmount, in.LocalEvery = decimal.NewNullDecimal(dec("1")), time.Minute
		}
		if err := in.Validate(); !errors.Is(err, quota.ErrInvalid) || !strings.Contains(err.Error(), "on_unreachable: applies only to exact rules") {
			t.Errorf("on_unreachable %s on a lagged rule: %v", p, err)
		}
	}

	pool := pgtest.New(t)
	ctx := context.Background()
	now := time.Now().UTC()
	lagged, err := quota.PutRuleDB(ctx, pool, quota.RuleInput{Customer: "acme", Meter: "calls", Limit: dec("5"), Actor: "ops", EffectiveAt: now})
	if err != nil {
		t.Fatal(err)
	}
	if lagged.Admission != quota.Lagged || lagged.OnUnreachable != quota.UnreachableDeny {
		t.Fatalf("defaults: %+v", lagged)
	}
	in := quota.RuleInput{Customer: "acme", Meter: "tokens", Limit: dec("10"), Actor: "ops", EffectiveAt: now,
		Admission: quota.Exact, OnUnreachable: quota.UnreachableLocal,
		LocalAmount: decimal.NewNullDecimal(dec("2.5")), LocalEvery: time.Minute}
	if _, err := quota.PutRuleDB(ctx, pool, in); err != nil {
		t.Fatal(err)
	}
	got, err := quota.RuleAt(ctx, pool, "acme", "tokens", now)
	if err != nil {
		t.Fatal(err)
	}
	if got.Admission != quota.Exact || got.OnUnreachable != quota.UnreachableLocal ||
		!got.LocalAmount.Decimal.Equal(dec("2.5")) || time.Duration(got.LocalEvery) != time.Minute {
		t.Fatalf("stored exact rule: %+v", got)
	}
	if _, err := quota.RuleAt(ctx, pool, "acme", "tokens", now.Add(-time.Second)); !errors.Is(err, quota.ErrNotFound) {
		t.Fatalf("before effective: %v", err)
	}
}
