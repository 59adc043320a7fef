package admit_test

import (
	"bytes"
	"context"
	"encoding/json"
	"net/http"
	"testing"
	"time"

	"github.com/tally-ledger/tally/admit"
	"github.com/tally-ledger/tally/internal/ledgertest"
)

// admin sends an admin request to the test Tally and fails the test unless
// it answers 2xx.
func (ts *tally) admin(method, path string, body any) {
	ts.t.Helper()
	b, err := json.Marshal(body)
	if err != nil {
		ts.t.Fatal(err)
	}
	req, err := http.NewRequest(method, ts.url+path, bytes.NewReader(b))
	if err != nil {
		ts.t.Fatal(err)
	}
	req.Header.Set("Authorization", "Bearer "+adminToken)
	req.Header.Set("Content-Type", "application/json")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		ts.t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode/100 != 2 {
		ts.t.Fatalf("%s %s: %s", method, path, resp.Status)
	}
}

// A pool's exact budget refuses while the customer's own has room: every
// refusal names the pool, also those answered from the SDK's memory of the
// refusal, so the gateway can tell the client which budget ran out.
func TestRefusalNamesTheBindingBudget(t *testing.T) {
	// A pool's budgets count in months of UTC: a month's end in the
	// middle would give it a fresh limit.
	ledgertest.PastMonthEnd(t, time.Now, time.Minute)
	ts := startTally(t)
	ts.exactRule("acme", "tokens", "1000")
	ts.admin("PUT", "/v1/pools/free", map[string]any{"members": []string{"acme"}})
	ts.admin("PUT", "/v1/pools/free/quotas/tokens", map[string]any{"limit": "5", "admission": "exact"})
	// MaxWait well above a loaded machine's round trip: this test is about
	// which budget a refusal names, not about how long Admit waits.
	c := newClient(t, ts, "gw1", t.TempDir(), admit.Config{MaxWait: 10 * time.Second})
	defer c.Close(context.Background())
	ctx := context.Background()
	admitted, refused := 0, 0
	for range 20 {
		d, err := c.Admit(ctx, "acme", "tokens", 1)
		if err != nil {
			t.Fatal(err)
		}
		if d.Admitted {
			admitted++
			continue
		}
		refused++
		if d.Binding != "pool:free/tokens" {
			t.Fatalf("refusal %d names %q, want pool:free/tokens", refused, d.Binding)
		}
	}
	if admitted != 5 || refused != 15 {
		t.Fatalf("admitted %d, refused %d; want 5 and 15", admitted, refused)
	}
}
