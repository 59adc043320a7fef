package console_test

import (
	"context"
	"fmt"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/shopspring/decimal"

	"github.com/tally-ledger/tally/quota"
)

// TestCustomerPageShowsTheLatestRuleVersions: a rule gets a version at
// every change (a billing system may change a customer's limit every
// day), and the customer page, refreshed every few seconds, read and
// showed every version of every rule. It shows the latest 20 and says
// how many there are.
func TestCustomerPageShowsTheLatestRuleVersions(t *testing.T) {
	f := newFixture(t)
	for i := range 25 {
		if _, err := quota.PutRuleDB(context.Background(), f.pool, quota.RuleInput{Customer: "acme", Meter: "api_calls",
			Limit: decimal.NewFromInt(int64(1000 + i)), EffectiveAt: f.now.Add(-30 * 24 * time.Hour), Actor: "billing",
			Reason: fmt.Sprintf("plan change %d", i+1)}); err != nil {
			t.Fatal(err)
		}
	}
	history := acmePagePart(t, f, `<details class="history">`, `</details>`)
	versions := regexp.MustCompile(`<tr><td class="n">(\d+)</td>`).FindAllStringSubmatch(history, -1)
	if len(versions) != 20 || versions[0][1] != "25" || versions[19][1] != "6" {
		t.Errorf("%d versions shown, want the latest 20 (25 down to 6):\n%s", len(versions), history)
	}
	if !strings.Contains(history, "The latest 20 of the 25 versions of the api_calls rule") {
		t.Errorf("the history does not say it shows 20 of 25 versions:\n%s", history)
	}
}

// TestCustomerPageShowsTheLatestBudgets: a budget is kept for every period
// an exact rule was in force (a daily customer has 365 a year per meter),
// and the customer page read and showed every one. It shows the latest
// 24 and says where the others are listed.
func TestCustomerPageShowsTheLatestBudgets(t *testing.T) {
	f := newFixture(t)
	if _, err := quota.PutRuleDB(context.Background(), f.pool, quota.RuleInput{Customer: "acme", Meter: "api_calls",
		Limit: decimal.NewFromInt(1000), Admission: quota.Exact, EffectiveAt: f.now.Add(-30 * 24 * time.Hour), Actor: "billing"}); err != nil {
		t.Fatal(err)
	}
	if _, err := f.pool.Exec(context.Background(), `INSERT INTO admission_budgets (customer, meter, period_start, period_end, period, "limit", rule_version, consumed, updated_at)
		SELECT 'acme', 'api_calls', d, d + interval '1 day', to_char(d, 'YYYY-MM-DD'), 1000, 1, 0, d
		FROM generate_series(timestamptz '2025-01-01T00:00:00Z', timestamptz '2025-02-09T00:00:00Z', interval '1 day') d`); err != nil {
		t.Fatal(err)
	}
	budgets := acmePagePart(t, f, `<h2 id="budgets">`, `</section>`)
	if n := strings.Count(budgets, "<tr><td>api_calls</td>"); n != 24 {
		t.Errorf("%d budgets shown, want the latest 24:\n%s", n, budgets)
	}
	if !strings.Contains(budgets, "GET /v1/customers/acme/budgets") {
		t.Errorf("the page does not say where the older budgets are listed:\n%s", budgets)
	}
}

// acmePagePart is the part of acme's customer page, seen by the admin,
// from the first from to the next to after it.
func acmePagePart(t *testing.T, f *fixture, from, to string) string {
	t.Helper()
	c := f.client()
	f.signInHTTP(c, adminToken)
	res := f.get(c, "/console/customers/acme")
	if res.status != 200 {
		t.Fatalf("customer page: %d", res.status)
	}
	i := strings.Index(res.body, from)
	if i < 0 {
		t.Fatalf("no %s on the page:\n%s", from, res.body)
	}
	part := res.body[i:]
	return part[:strings.Index(part, to)]
}
