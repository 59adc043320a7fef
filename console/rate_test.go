package console_test

import (
	"strings"
	"testing"
	"time"

	"github.com/shopspring/decimal"

	"github.com/tally-ledger/tally/admission"
	"github.com/tally-ledger/tally/quota"
)

// TestCustomerPageShowsRateBudgets: a customer's rate budget (docs/design.md
// §17) is on its page: the contract, the tokens its bucket holds, what is
// in live grants.
func TestCustomerPageShowsRateBudgets(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	f.calendar("acme", "UTC")
	ctx := f.ctx()
	if _, err := quota.PutRuleDB(ctx, f.pool, quota.RuleInput{Customer: "acme", Meter: "calls", Admission: quota.Exact,
		Rate:        &quota.Rate{Amount: decimal.NewFromInt(1), Per: quota.DurationText(time.Hour), Burst: decimal.NewFromInt(50)},
		EffectiveAt: f.now.Add(-time.Hour), Actor: "test"}); err != nil {
		t.Fatal(err)
	}
	s, err := admission.New(f.pool, admission.Config{})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := s.Issue(ctx, admission.IssueRequest{Holder: "gw", Generation: 1, Customer: "acme", Meter: "calls",
		Amount: decimal.NewFromInt(20), TTL: 10 * time.Second}); err != nil {
		t.Fatal(err)
	}
	c := f.client()
	f.signInHTTP(c, adminToken)
	res := f.get(c, "/console/customers/acme")
	if res.status != 200 {
		t.Fatalf("customer page: %d %s", res.status, res.body)
	}
	for _, want := range []string{
		`<caption>Rate budgets (token buckets on Postgres's clock)</caption>`,
		`<td>customer:acme</td><td>calls</td><td>1 per 1h</td><td class="n">50</td><td class="n">30`,
		`<td class="n">20</td><td class="n">0</td><td class="n">0</td></tr>`,
	} {
		if !strings.Contains(res.body, want) {
			t.Fatalf("the page lacks %s:\n%s", want, res.body)
		}
	}
}
