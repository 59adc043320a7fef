package quota_test

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/tally-ledger/tally/ledger"
	"github.com/tally-ledger/tally/quota"
	"github.com/tally-ledger/tally/validation"
)

// A quota rule, lagged or exact, needs a counter: a gauge or unique meter
// is refused with the field at fault.
func TestRulesRefuseGaugeAndUniqueMeters(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	ctx := context.Background()
	for meter, kind := range map[string]ledger.MeterKind{"seats": ledger.Gauge, "mau": ledger.Unique} {
		if err := pgx.BeginFunc(ctx, e.pool, func(tx pgx.Tx) error {
			_, err := ledger.DeclareMeter(ctx, tx, ledger.Meter{Meter: meter, Kind: kind}, time.Now())
			return err
		}); err != nil {
			t.Fatal(err)
		}
		_, err := quota.PutRuleDB(ctx, e.pool, quota.RuleInput{Customer: "acme", Meter: meter, Limit: dec("10"), Actor: "test"})
		fe := validation.Fields(err)
		if len(fe) != 1 || fe[0].Field != "meter" || !strings.Contains(fe[0].Detail, "is a "+string(kind)) {
			t.Fatalf("%s: %v", meter, err)
		}
	}
	e.put(quota.RuleInput{Customer: "acme", Meter: "api_calls", Limit: dec("10")})
}

// Pool and global budgets sum their members' counters: a gauge's peak or
// a unique meter's distinct members are not sums, so a scope rule, lagged
// or exact, on such a meter is refused naming the meter, as an exact
// customer rule is.
func TestScopeAndExactRulesRefuseGaugeAndUniqueMeters(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	ctx := context.Background()
	for meter, kind := range map[string]ledger.MeterKind{"seats": ledger.Gauge, "mau": ledger.Unique} {
		if err := pgx.BeginFunc(ctx, e.pool, func(tx pgx.Tx) error {
			_, err := ledger.DeclareMeter(ctx, tx, ledger.Meter{Meter: meter, Kind: kind}, time.Now())
			return err
		}); err != nil {
			t.Fatal(err)
		}
		check := func(what string, err error) {
			t.Helper()
			fe := validation.Fields(err)
			if !errors.Is(err, quota.ErrInvalid) || len(fe) != 1 || fe[0].Field != "meter" || !strings.Contains(fe[0].Detail, "is a "+string(kind)) {
				t.Fatalf("%s on %s: %v", what, meter, err)
			}
		}
		_, err := quota.PutRuleDB(ctx, e.pool, quota.RuleInput{Customer: "acme", Meter: meter, Limit: dec("10"), Admission: quota.Exact, Actor: "test"})
		check("exact customer rule", err)
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
