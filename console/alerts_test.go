package console_test

import (
	"strings"
	"testing"
	"time"

	"github.com/shopspring/decimal"

	"github.com/tally-ledger/tally/alerts"
	"github.com/tally-ledger/tally/quota"
)

// leader stands for a quota enforcer holding the lease written by the test.
type leader struct{ f quota.Fence }

func (l leader) Leading() (quota.Fence, bool) { return l.f, true }

// TestAlertsPageShowsStatesAndAttempts: a rule's subject × threshold
// state and a recent event with its pending delivery are on the admin's
// alerts page.
func TestAlertsPageShowsStatesAndAttempts(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	f.calendar("acme", "UTC")
	f.quota("acme", "api_calls", "1000")
	f.usage("acme", "api_calls", f.now.Add(-time.Hour), "850")
	ctx := f.ctx()
	if _, _, _, err := alerts.PutWebhook(ctx, f.pool, alerts.WebhookInput{Name: "ops", URL: "http://127.0.0.1:9/x", AllowPrivate: true}, f.now); err != nil {
		t.Fatal(err)
	}
	eighty := decimal.NewFromInt(80)
	if _, _, err := alerts.PutRule(ctx, f.pool, alerts.RuleInput{Name: "acme-quota", Subject: "customer:acme", Meter: "api_calls",
		Thresholds: []alerts.Threshold{{Percent: &eighty}}, Endpoints: []string{"ops"}, Actor: "test"}, f.now); err != nil {
		t.Fatal(err)
	}
	if _, err := f.pool.Exec(ctx, `INSERT INTO quota_leases (name, holder, epoch, acquired_at, expires_at)
		VALUES ('quota-enforcer', 'test', 1, now(), now() + interval '1 hour')`); err != nil {
		t.Fatal(err)
	}
	fence := quota.Fence{Name: "quota-enforcer", Holder: "test", Epoch: 1}
	ev, err := alerts.NewEvaluator(alerts.EvaluatorConfig{Pool: f.pool, Leader: leader{fence}, NoListen: true,
		Clock: func() time.Time { return f.now }})
	if err != nil {
		t.Fatal(err)
	}
	if err := ev.Evaluate(ctx, fence); err != nil {
		t.Fatal(err)
	}
	c := f.client()
	f.signInHTTP(c, adminToken)
	res := f.get(c, "/console/alerts")
	if res.status != 200 {
		t.Fatalf("alerts page: %d %s", res.status, res.body)
	}
	for _, want := range []string{
		`<h2>acme-quota <span class="muted">v1</span></h2>`,
		`<td>percent:80</td><td>2026-11-01</td>`,
		`<span class="warn-text">triggered</span>`,
		`<td>850</td><td>800</td><td>1,000</td>`,
		`alert.triggered`,
		`<code>ops</code> pending (0)`,
	} {
		if !strings.Contains(res.body, want) {
			t.Fatalf("the page lacks %s:\n%s", want, res.body)
		}
	}
}
