package quota_test

import (
	"context"
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
