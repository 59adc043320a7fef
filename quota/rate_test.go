package quota_test

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/shopspring/decimal"

	"github.com/tally-ledger/tally/internal/pgtest"
	"github.com/tally-ledger/tally/quota"
	"github.com/tally-ledger/tally/validation"
)

// A rate rule is stored and read back with its rate and max_skew, and a
// NULL period limit; its field errors name the field at fault.
func TestRateRule(t *testing.T) {
	db := pgtest.New(t)
	ctx := context.Background()
	in, err := quota.DecodePutRequest(strings.NewReader(`{"rate":{"amount":"100","per":"1s","burst":"200"},"admission":"exact","max_skew":"250ms"}`), "acme", "calls", "admin")
	if err != nil {
		t.Fatal(err)
	}
	var r quota.Rule
	if err := pgx.BeginFunc(ctx, db, func(tx pgx.Tx) error { r, err = quota.PutRule(ctx, tx, in); return err }); err != nil {
		t.Fatal(err)
	}
	got, err := quota.RuleAt(ctx, db, "acme", "calls", time.Now())
	if err != nil {
		t.Fatal(err)
	}
	if got.Limit.Valid || got.Rate == nil || !got.Rate.Amount.Equal(decimal.NewFromInt(100)) || !got.Rate.Burst.Equal(decimal.NewFromInt(200)) ||
		time.Duration(got.Rate.Per) != time.Second || time.Duration(got.MaxSkew) != 250*time.Millisecond || got.Version != r.Version {
		t.Fatalf("read back %+v (rate %+v), stored %+v", got, got.Rate, r)
	}
	for body, fields := range map[string][]string{
		`{"rate":{"amount":"100","per":"1s","burst":"200"}}`:                                          {"admission"},
		`{"rate":{"amount":"100","per":"1s","burst":"200"},"limit":"5","admission":"exact"}`:          {"limit"},
		`{"rate":{"amount":"-1","per":"1µs","burst":"0"},"admission":"exact"}`:                        {"rate.amount", "rate.burst", "rate.per"},
		`{"rate":{"amount":"1","per":"1s","burst":"1"},"admission":"exact","max_skew":"10ms"}`:        {"max_skew"},
		`{"limit":"10","max_skew":"1s"}`:                                                              {"max_skew"},
		`{"rate":{"amount":"1","per":"1s"},"admission":"exact"}`:                                      {"rate.burst"},
		`{"rate":{"amount":"0.0000000001","per":"1.5ms","burst":"1.0000000001"},"admission":"exact"}`: {"rate.amount", "rate.burst", "rate.per"},
		`{"rate":{"amount":"1","per":"25h","burst":"1"},"admission":"exact"}`:                         {"rate.per"},
		`{}`: {"limit"},
	} {
		_, err := quota.DecodePutRequest(strings.NewReader(body), "acme", "calls", "admin")
		var have []string
		for _, fe := range validation.Fields(err) {
			have = append(have, fe.Field)
		}
		for _, f := range fields {
			found := false
			for _, h := range have {
				found = found || h == f
			}
			if !found {
				t.Errorf("%s: fields %v, want %s among them (%v)", body, have, f, err)
			}
		}
	}
}
